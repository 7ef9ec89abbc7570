"""A Triton kernel for the blockwise walk: one program per block runs all m steps of a Gram panel, so a
level costs b/m walk launches (plus the panels' matmuls and elementwise passes) instead of ~5 per step.

Same walk and arithmetic as :func:`kvbounds.algorithms.blockwise_balance_kv.panel_walk` ("BalanceKV",
arXiv 2502.07861 v2, Alg. 2 / App. B): the panels are computed by the same array code
(:func:`kvbounds.gpu.batched_walk._panel`), the kernel adds eta_i * G[i, j] into s_j for j > i in step
order (eta_i = +-1, so the product is exact and a fused multiply-add rounds the same), and the sign test
is ``u_i < 1/2 - x_i / (2c)`` with an IEEE-rounded division (``div_rn`` in float32) and 2c in the input's dtype.
Used by ``walk_signs(..., method="triton")`` for torch CUDA tensors; tested on CPU with Triton's
interpreter (``TRITON_INTERPRET=1``) where Triton is installed.
"""
from __future__ import annotations

import functools
import os

__all__ = ["triton_available", "triton_panel_steps"]


@functools.cache
def triton_available(device_type: str = "cuda") -> bool:
    """Triton importable, and either a CUDA device (for cuda tensors) or the interpreter (for CPU tensors)."""
    if device_type not in ("cpu", "cuda"):
        from kvbounds.algorithms.arrays import input_error
        raise input_error(f"device_type must be 'cpu' or 'cuda', got {device_type!r}")
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    if device_type == "cpu":
        return os.environ.get("TRITON_INTERPRET") == "1"
    import torch
    return torch.cuda.is_available()


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def panel_steps(S, P, U, SIGNS, TWO_C, start, width, b, M: tl.constexpr, BLOCK: tl.constexpr,
                    F32: tl.constexpr):
        """Program ``pid``: block pid's s (b,) and its panel P (M, width = b - start), rows start..start+M-1."""
        pid = tl.program_id(0)
        o = tl.arange(0, BLOCK)
        inb = o < b
        s = tl.load(S + pid * b + o, mask=inb, other=0.0)
        two_c = tl.load(TWO_C)
        prow = P + pid * M * width
        for l in range(M):
            i = start + l
            x = tl.sum(tl.where(o == i, s, 0.0), axis=0)
            u = tl.load(U + pid * b + i)
            if F32:
                q = tl.math.div_rn(x, two_c)      # IEEE division (the default fp32 '/' may be approximate)
            else:
                q = x / two_c                     # fp64 division is IEEE
            eta = tl.where(u < 0.5 - q, 1.0, -1.0).to(s.dtype)
            tl.store(SIGNS + pid * b + i, eta)
            upd = (o > i) & inb
            g = tl.load(prow + l * width + (o - start), mask=upd, other=0.0)
            s = s + eta * g
        tl.store(S + pid * b + o, s, mask=inb)

    return panel_steps


def triton_panel_steps(s, P, uniforms, signs, two_c, start: int, m: int):
    """Run steps start..start+m-1 for every block: ``s``, ``uniforms``, ``signs`` (B, b) contiguous torch
    tensors, ``P`` (B, m, b - start) contiguous, ``two_c`` a 1-element tensor of s's dtype. In place."""
    import torch
    import triton
    B, b = s.shape
    _kernel()[(B,)](s, P, uniforms, signs, two_c, start, b - start, b, M=m, BLOCK=triton.next_power_of_2(b),
                    F32=s.dtype == torch.float32)

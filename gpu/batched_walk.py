"""The blockwise BalanceKV walk batched for a GPU: one tensor program per scalar step for every block,
head, layer and trial at once.

Papers: "Streaming Attention Approximation via Discrepancy Theory" (arXiv 2502.07861, NeurIPS 2025 version,
Alg. 2 and App. B, the blockwise variant); the walk is the self-balancing walk of Alweiss, Liu and Sawhney as restated
there (Alg. 3, Thm A.1). Claims served: BKV.vs-uniform, BKV.attention, SBW.balance (speed only; the signs
are those of the package's reference walk).

Reference: :func:`kvbounds.algorithms.blockwise_balance_kv.panel_walk` (and, through it,
:func:`kvbounds.algorithms.self_balancing_walk.gram_walk`). Sign convention, given uniforms u_i drawn by
numpy up front: ``eta_i = +1 iff u_i < 1/2 - x_i / (2c)``, with ``x_i = sum_{j<i} eta_j G[i, j]`` and G
the per-block normalized Gram ``exp(<k'_i, k'_j> - max ||k'||^2) * (<w_i, w_j> [+ o_i o_j]) / r_w^2``
(k' = k d^{-1/4}). Tokens are walked in block order 0..b-1; the Gram is computed column panel by column
panel (m = 32 columns, rows from the panel's first column down), exactly as the reference does.

Three ways to run the same walk (``method``):

- ``"exact"``: the reference's accumulation order (s_j += eta_i G[j, i] for every j > i at step i), hence
  bit-identical x_i and signs on the same backend and dtype. Per step: x/(2c), 1/2 - ., u < ., where,
  and one fused multiply-add into s (torch: ``addcmul_``; other namespaces: multiply then add). The
  reference also appends x_i and eta_i to Python lists and stacks them at the end; here the walk's x_i
  are read off the final s (s_i is never touched after step i) and the signs are recomputed from them in
  one vectorized pass, so a step is 5 ops (torch) and nothing per step is kept.
- ``"blocked"``: inside a panel of m steps only the panel's own m entries of s are updated per step; the
  contributions of the panel's m signs to the rows below it are added by one matmul after the panel.
  Same number of launches per step, m instead of b - i entries touched per step, but a different
  summation order: x_i agree with the reference to rounding, so signs agree except where u_i lands within
  rounding of the threshold (never seen in float64 tests; a few per million steps in float32).
- ``"compiled"``: ``"blocked"`` with the in-panel loop (fixed shapes (..., m) and (..., m, m)) compiled by
  ``torch.compile`` (inductor: C++ on CPU, Triton on CUDA), which fuses the m steps of a panel into a few
  kernels. Only for torch tensors, and only where ``torch.compile`` works (:func:`compiled_available`);
  elsewhere it falls back to ``"blocked"``.

:func:`batched_select` runs T levels of blockwise BalanceKV for a stack of independent trials, each with its
own numpy ``Generator`` consumed in the reference's order (per level: the walk's uniforms, then the halving
priorities), so trial t returns exactly ``blockwise_balance_select(K[t], V[t], rng=rngs[t], ...)``.
:func:`ops_per_step` counts the operations (CPU) or kernel launches (CUDA) per scalar step with the torch
profiler.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Sequence

import numpy as np

from kvbounds.algorithms.block_walk import check_exponent_rounding, gram_panel, panel_scales, check_walk_inputs
from kvbounds.algorithms.blockwise_balance_kv import argsort_head, check_block, check_levels
from kvbounds.algorithms.self_balancing_walk import walk_constant
from kvbounds.algorithms.validation import (InputError, check_array, check_probability, check_real, check_same_dtype,
                                            namespace)
from kvbounds.algorithms.arrays import array_namespace, device as _dev, like

__all__ = ["METHODS", "PANEL", "compiled_available", "walk_signs", "batched_select", "VIEW_OPS", "ops_per_step"]

METHODS = ("exact", "blocked", "compiled", "triton")
PANEL = 32


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def _sign_from(xp, x, u, c, one=None, neg=None):
    """eta = +1 iff u < 1/2 - x/(2c): the reference's expression, term for term (p clipped to [0, 1] is the
    same test). ``one``/``neg``: +-1 arrays of x's shape, made once per walk instead of once per step."""
    if one is None:
        one = xp.ones_like(x)
        neg = -one
    return xp.where(u < 0.5 - x / (2.0 * c), one, neg)


def _steps_exact(s, P, u, c, start, m, b, torch_fast, one, neg):
    xp = array_namespace(s)
    for l in range(m):
        i = start + l
        if i + 1 >= b:
            break
        eta = _sign_from(xp, s[..., i], u[..., i], c, one, neg)
        if torch_fast:
            s[..., i + 1:].addcmul_(eta[..., None], P[..., l, l + 1:])
        else:
            s[..., i + 1:] += eta[..., None] * P[..., l, l + 1:]


def _panel_loop(sp, Pp, up, c: float):
    """The m sequential steps inside one panel: sp (..., m) the panel's entries of s, Pp (..., m, m) with
    Pp[l, j] = G[start + l, start + j] for j > l and 0 for j <= l, up (..., m).
    Returns (eta (..., m), sp). Written with torch/array-API ops only so that torch.compile can trace it."""
    m = sp.shape[-1]
    etas = []
    for l in range(m):
        x = sp[..., l]
        eta = (up[..., l] < 0.5 - x / (2.0 * c)).to(sp.dtype) * 2.0 - 1.0
        sp = sp + eta[..., None] * Pp[..., l, :]
        etas.append(eta)
    import torch
    return torch.stack(etas, dim=-1), sp


def _panel_loop_generic(sp, Pp, up, c, torch_fast, one, neg):
    xp = array_namespace(sp)
    m = sp.shape[-1]
    for l in range(m - 1):
        eta = _sign_from(xp, sp[..., l], up[..., l], c, one, neg)
        if torch_fast:
            sp[..., l + 1:].addcmul_(eta[..., None], Pp[..., l, l + 1:])
        else:
            sp[..., l + 1:] += eta[..., None] * Pp[..., l, l + 1:]
    return sp


@functools.cache
def _compiled_loop():
    import torch
    return torch.compile(_panel_loop, dynamic=False, fullgraph=True)


def compiled_available(device_type: str = "cpu") -> bool:
    """:func:`_compiled_available` for ``device_type`` "cpu" or "cuda" (anything else: InputError, not a compile
    attempt per value)."""
    if device_type not in ("cpu", "cuda"):
        raise InputError(f"device_type must be 'cpu' or 'cuda', got {device_type!r}")
    return _compiled_available(device_type)


@functools.cache
def _compiled_available(device_type: str = "cpu") -> bool:
    """True when torch.compile can build the fused in-panel loop for tensors on ``device_type`` (inductor needs a
    C++ compiler for "cpu", Triton for "cuda": one can work without the other), tried once per device type on a
    tiny input."""
    try:
        import torch
        fn = _compiled_loop()
        z = dict(device=device_type)
        sp, Pp, up = torch.zeros(1, 4, **z), torch.zeros(1, 4, 4, **z), torch.full((1, 4), 0.25, **z)
        fn(sp, Pp, up, 1.0)
        return True
    except Exception:   # no compiler, no triton, unsupported platform: the eager paths remain
        return False


def walk_signs(Kb, Wb, nk2, nw2, uniforms, c: float, *, plus_one: bool = False, ones=None,
               panel: int = PANEL, method: str = "exact"):
    """Signs (..., b) and the walk's inner products x (..., b) for every block of a batch at once.

    Same inputs as :func:`kvbounds.algorithms.blockwise_balance_kv.panel_walk`: ``Kb`` (..., b, d) keys
    pre-scaled by d^{-1/4}, ``Wb`` (..., b, e), ``nk2``/``nw2`` (..., b) squared norms (with ``plus_one``,
    nw2 includes o_i^2), ``ones`` (..., b) or None, ``uniforms`` (..., b); any leading shape (blocks, heads,
    layers, trials). FAIL (|x_i| > c) is ``abs(x) > c`` on the result, as in the reference."""
    if not isinstance(method, str) or method not in METHODS:
        raise InputError(f"method must be one of {METHODS}, got {method!r}")
    check_walk_inputs(Kb, Wb, nk2, nw2, uniforms, c, panel=panel, plus_one=plus_one, ones=ones)
    return _walk_signs(Kb, Wb, nk2, nw2, uniforms, float(c), plus_one=bool(plus_one), ones=ones, panel=int(panel),
                       method=method)


def _walk_signs(Kb, Wb, nk2, nw2, uniforms, c: float, *, plus_one: bool = False, ones=None,
                panel: int = PANEL, method: str = "exact"):
    """:func:`walk_signs` on checked arguments."""
    xp = array_namespace(Kb, Wb)
    b = Kb.shape[-2]
    m = panel if b % panel == 0 else b
    torch_fast = _is_torch(Kb)
    if method == "compiled" and not (torch_fast and Kb.device.type in ("cpu", "cuda")
                                     and compiled_available(Kb.device.type)):
        method = "blocked"
    if method == "triton":
        from .triton_walk import triton_available
        if not (torch_fast and triton_available(Kb.device.type)):
            method = "exact"
        else:
            return _walk_triton(Kb, Wb, nk2, nw2, uniforms, c, plus_one, ones, m)
    rk2, inv_rw2 = panel_scales(xp, nk2, nw2)
    s = xp.zeros(tuple(Kb.shape[:-1]), dtype=Kb.dtype, device=_dev(Kb))
    one = xp.ones_like(s[..., 0])
    neg = -one
    if method != "exact":
        tri = like(np.triu(np.ones((m, m)), k=1), Kb)       # keeps Pp[l, j] for j > l only
    for start in range(0, b, m):
        ones_r = None if ones is None else ones[..., start:]
        P = gram_panel(Kb[..., start:, :], Wb[..., start:, :], m, rk2, inv_rw2, plus_one, ones_r)
        if method == "exact":
            _steps_exact(s, P, uniforms, c, start, m, b, torch_fast, one, neg)
            continue
        up = uniforms[..., start:start + m]
        if method == "compiled":
            eta, sp = _compiled_loop()(s[..., start:start + m], P[..., :m] * tri, up, float(c))
            s[..., start:start + m] = sp
        else:
            sp = _panel_loop_generic(s[..., start:start + m], P[..., :m], up, c, torch_fast, one, neg)
            s[..., start:start + m] = sp
            eta = _sign_from(xp, sp, up, c)
        if start + m < b:
            s[..., start + m:] += xp.matmul(eta[..., None, :], P[..., m:])[..., 0, :]
    return _sign_from(xp, s, uniforms, c), s


def _walk_triton(Kb, Wb, nk2, nw2, uniforms, c, plus_one, ones, m):
    """method="triton": panels by the array code, the m steps of each panel in one kernel launch."""
    import torch
    from .triton_walk import triton_panel_steps
    lead, b = tuple(Kb.shape[:-2]), Kb.shape[-2]
    B = int(np.prod(lead, dtype=np.int64)) if lead else 1
    Kf, Wf = Kb.reshape(B, b, -1), Wb.reshape(B, b, -1)
    rk2, inv_rw2 = panel_scales(array_namespace(Kb), nk2.reshape(B, b), nw2.reshape(B, b))
    of = None if ones is None else torch.broadcast_to(ones, lead + (b,)).reshape(B, b)
    s = torch.zeros(B, b, dtype=Kb.dtype, device=Kb.device)
    signs = torch.empty_like(s)
    u = uniforms.reshape(B, b).contiguous()
    two_c = torch.full((1,), 2.0 * c, dtype=Kb.dtype, device=Kb.device)
    for start in range(0, b, m):
        P = gram_panel(Kf[:, start:], Wf[:, start:], m, rk2, inv_rw2, plus_one, None if of is None else of[:, start:])
        triton_panel_steps(s, P.contiguous(), u, signs, two_c, start, m)
    return signs.reshape(lead + (b,)), s.reshape(lead + (b,))


# --------------------------------------------------------------------------- T levels for a stack of trials

def _flat(idx, n):
    xp = array_namespace(idx)
    return xp.reshape(idx + xp.arange(idx.shape[0], dtype=idx.dtype, device=_dev(idx))[:, None] * n, (-1,))


def _take_cols(idx, pos):
    xp = array_namespace(idx)
    return xp.reshape(xp.take(xp.reshape(idx, (-1,)), _flat(pos, idx.shape[1]), axis=0), pos.shape)


def _gather(X, idx):
    xp = array_namespace(X)
    B, n, e = X.shape
    return xp.reshape(xp.take(xp.reshape(X, (B * n, e)), _flat(idx, n), axis=0), (B, idx.shape[-1], e))


def _pad(xp, X, pad):
    if not pad:
        return X
    z = xp.zeros(tuple(X.shape[:1]) + (pad,) + tuple(X.shape[2:]), dtype=X.dtype, device=_dev(X))
    return xp.concat([X, z], axis=1)


def _draw(rngs, per_trial, nb, b_draw, b, ref):
    """One (per_trial, nb, b_draw) uniform block from each trial's generator, its first b columns, stacked in trial
    order."""
    return like(np.concatenate([r.random((per_trial, nb, b_draw))[..., :b] for r in rngs], axis=0), ref)


def _level(Kc, Wc, kc2, wc2, *, b, c, rngs, per_trial, plus_one, method):
    xp = array_namespace(Kc)
    B, m, d = Kc.shape
    e = Wc.shape[-1]
    nb = -(-m // b)
    # a block longer than the tokens: walk only the real ones (padding never moves the walk), drawing the same coins,
    # as the reference does (issue 24: block_size = 2^20 on 8 tokens walked 2^20 steps)
    b_draw, b = b, min(b, m + m % 2)
    pad = nb * b - m
    Kc, Wc, kc2, wc2 = (_pad(xp, X, pad) for X in (Kc, Wc, kc2, wc2))
    ones = like(np.concatenate([np.ones(m), np.zeros(pad)]).reshape(nb, b), Kc) if plus_one and pad else None
    signs, _ = _walk_signs(xp.reshape(Kc, (B, nb, b, d)), xp.reshape(Wc, (B, nb, b, e)),
                           xp.reshape(kc2, (B, nb, b)), xp.reshape(wc2, (B, nb, b)),
                           _draw(rngs, per_trial, nb, b_draw, b, Kc), c, plus_one=plus_one, ones=ones, method=method)
    # strict halving, the reference's rule: minority sign first (+1 on a tie), random priority, real before pad
    valid_np = np.ones(nb * b, dtype=bool)
    valid_np[m:] = False
    valid = like(valid_np.reshape(nb, b), Kc)
    plus = signs > 0
    n_plus = xp.sum(xp.astype(plus & valid, xp.int64), axis=-1, keepdims=True)
    n_real = xp.sum(xp.astype(valid, xp.int64), axis=-1, keepdims=True)
    minority = xp.where(2 * n_plus <= n_real, plus, ~plus) & valid
    prio_np = np.concatenate([argsort_head(r.random((per_trial, nb, b_draw)), b) for r in rngs], axis=0)
    prio = like(prio_np.astype(np.int64), Kc)
    score = 2 * b_draw * xp.astype(minority, xp.int64) + b_draw * xp.astype(valid, xp.int64) + prio
    order = xp.argsort(score, axis=-1, descending=True, stable=True)[..., : b // 2]
    offsets = like((np.arange(nb, dtype=np.int64) * b)[:, None], Kc)
    pos = xp.reshape(order + offsets, (B, nb * (b // 2)))[:, : m // 2]
    return xp.sort(pos, axis=-1)


def batched_select(K, V, *, block_size: int, levels: int, rngs: Sequence[np.random.Generator],
                   delta: float = 0.01, c: float | None = None, value_kernel: str = "value+1",
                   method: str = "exact"):
    """T levels of blockwise BalanceKV on a stack of independent trials in one batched walk per level.

    ``K`` (trials, ..., n, d), ``V`` (trials, ..., n, s) with ``len(rngs) == trials``; the middle axes
    (layers, heads) are batched too. Returns kept indices (trials, ..., n // 2^T), sorted; trial t equals
    ``blockwise_balance_select(K[t], V[t], block_size=..., levels=..., rng=rngs[t], ...)``."""
    # issue 24: integer/complex keys, levels = 2.5 (truncated), levels = NaN, rngs = None and a list for V are refused
    check_array(K, "K", ndim=tuple(range(3, 9)), min_rows=1, finite=False)   # finiteness: on the squared norms below
    check_array(V, "V", ndim=K.ndim, finite=False)
    xp = namespace(K, V, names="K and V")
    check_same_dtype(("K", K), ("V", V))
    if tuple(V.shape[:-1]) != tuple(K.shape[:-1]):
        raise InputError(f"K (trials, ..., n, d) and V (trials, ..., n, s) must agree, got {tuple(K.shape)} and "
                         f"{tuple(V.shape)}")
    if isinstance(rngs, (str, bytes, np.random.Generator)) or not hasattr(rngs, "__iter__"):
        raise InputError(f"rngs must be a sequence of {K.shape[0]} numpy Generators (one per trial), got "
                         f"{type(rngs).__name__}")
    rngs = list(rngs)
    if len(rngs) != K.shape[0] or not all(isinstance(r, np.random.Generator) for r in rngs):
        raise InputError(f"rngs must be {K.shape[0]} numpy Generators (one per trial), got {len(rngs)}")
    b = check_block(block_size)
    n, d = K.shape[-2], K.shape[-1]
    T = check_levels(levels, n)
    if not isinstance(value_kernel, str) or value_kernel not in ("value", "value+1"):
        raise InputError(f"value_kernel must be 'value' or 'value+1', got {value_kernel!r}")
    if not isinstance(method, str) or method not in METHODS:
        raise InputError(f"method must be one of {METHODS}, got {method!r}")
    check_probability(delta, "delta")
    c = walk_constant(b, delta) if c is None else check_real(c, "c", minimum=0.0, strict=True)
    lead = tuple(K.shape[:-2])
    B = int(np.prod(lead, dtype=np.int64))
    per_trial = B // len(rngs)
    Kf = xp.reshape(K, (B, n, d)) * math.sqrt(1.0 / math.sqrt(d))
    Wf = xp.reshape(V, (B, n, V.shape[-1]))
    nk2, nw2 = xp.sum(Kf * Kf, axis=-1), xp.sum(Wf * Wf, axis=-1)
    if not bool(xp.all(xp.isfinite(nk2))) or not bool(xp.all(xp.isfinite(nw2))):
        raise InputError("K or V contains NaN or Inf (or a row whose squared norm overflows)")
    check_exponent_rounding(xp, nk2, d, K.dtype)
    plus_one = value_kernel == "value+1"
    if plus_one:
        nw2 = nw2 + 1.0
    idx = xp.asarray(xp.broadcast_to(xp.arange(n, dtype=xp.int64, device=_dev(K))[None, :], (B, n)), copy=True)
    Kc, Wc, kc2, wc2 = Kf, Wf, nk2, nw2
    for level in range(T):
        pos = _level(Kc, Wc, kc2, wc2, b=b, c=c, rngs=rngs, per_trial=per_trial, plus_one=plus_one,
                     method=method)
        idx = _take_cols(idx, pos)
        if level + 1 < T:
            Kc, Wc = _gather(Kf, idx), _gather(Wf, idx)
            kc2, wc2 = _take_cols(nk2, idx), _take_cols(nw2, idx)
    return xp.reshape(idx, lead + (idx.shape[-1],))


# --------------------------------------------------------------------------- launches per step

VIEW_OPS = frozenset({"aten::select", "aten::slice", "aten::unsqueeze", "aten::view", "aten::as_strided",
                      "aten::expand", "aten::reshape", "aten::alias", "aten::lift_fresh", "aten::detach",
                      "aten::_unsafe_view", "aten::t", "aten::transpose", "aten::permute", "aten::empty",
                      "aten::empty_strided", "aten::resolve_conj", "aten::resolve_neg", "aten::item",
                      "aten::_local_scalar_dense", "aten::mT"})


def _count(fn, device: str) -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
    evs = prof.events()
    if device == "cuda":
        return sum(1 for e in evs if e.device_type == torch.autograd.DeviceType.CUDA)
    n = 0
    for e in evs:
        parent = e.cpu_parent
        top = parent is None or not parent.name.startswith("aten::")
        if e.name.startswith("aten::") and top and e.name not in VIEW_OPS:
            n += 1
    return n


def ops_per_step(method: str = "exact", *, device: str = "cpu", blocks: int = 8, d: int = 16,
                 sizes: tuple[int, int] = (64, 128)) -> dict[str, Any]:
    """Operations (CPU: top-level non-view aten ops) or kernel launches (CUDA: device kernels) per scalar
    step of :func:`walk_signs`, from two block sizes: (count(b2) - count(b1)) / (b2 - b1), so set-up cost
    cancels and the panel matmuls are amortized over their m steps. The count does not depend on the batch."""
    import torch
    counts = {}
    for b in sizes:
        g = torch.Generator().manual_seed(b)
        K = torch.randn(blocks, b, d, generator=g).to(device)
        W = torch.randn(blocks, b, d, generator=g).to(device)
        u = torch.rand(blocks, b, generator=g).to(device)
        args = (K, W, (K * K).sum(-1), (W * W).sum(-1) + 1.0, u, walk_constant(b, 0.01))
        run = lambda: walk_signs(*args, plus_one=True, method=method)
        run()                                                   # warm-up (and compilation)
        counts[b] = _count(run, device)
    b1, b2 = sizes
    return dict(method=method, device=device, counts=counts,
                per_step=(counts[b2] - counts[b1]) / (b2 - b1),
                unit="CUDA kernel launches" if device == "cuda" else "top-level aten ops (CPU, views excluded)")

"""Synthetic RoPE traces: low-rank keys and queries rotated per position (Subspace-FD-draft Sec. 7), no model needed.

RoPE (Su et al. 2021) rotates each frequency pair i = 0..d/2-1 of a query/key at position p by the angle
p * theta^(-2i/d). Two layouts of the pairs are in use:
  * ``"half"``         coordinates (i, i + d/2) form pair i (GPT-NeoX / Hugging Face "rotate_half"; Llama, SmolLM2),
  * ``"interleaved"``  coordinates (2i, 2i + 1) form pair i (the original RoFormer / GPT-J layout).
The rotation makes <R_m q, R_n k> depend on m - n only; it spreads a low-rank key set over many more
directions globally, while within a short window of positions the set stays close to low-rank. That is
what the adaptive subspace's residual-triggered chunking (Subspace-FD-draft Sec. 5) is meant to follow.

:func:`rope_trace` returns a :class:`kvbounds.traces.synthetic.Trace` whose ``meta`` carries the pre-RoPE keys and
queries, the positions and the key/value bases, so checks can compare pre- and post-RoPE spectra.
"""
from __future__ import annotations

import numpy as np

from kvbounds.algorithms.validation import InputError, check_positive

from .synthetic import Trace

__all__ = ["CONVENTIONS", "rope_frequencies", "apply_rope", "rope_trace"]

CONVENTIONS = ("half", "interleaved")


def rope_frequencies(d: int, theta: float = 1e4) -> np.ndarray:
    """theta^(-2i/d), i = 0..d/2-1 (radians per position)."""
    check_positive(d, "d", integer=True)
    check_positive(theta, "theta")
    if d % 2:
        raise InputError(f"RoPE needs an even head dimension, got d = {d}")
    return theta ** (-2.0 * np.arange(d // 2) / d)


def _pairs(d: int, convention: str) -> tuple[np.ndarray, np.ndarray]:
    if convention == "half":
        return np.arange(d // 2), np.arange(d // 2) + d // 2
    if convention == "interleaved":
        return np.arange(0, d, 2), np.arange(1, d, 2)
    raise InputError(f"convention must be one of {CONVENTIONS}, got {convention!r}")


def apply_rope(X: np.ndarray, positions, *, theta: float = 1e4, convention: str = "half") -> np.ndarray:
    """Rotate row t of X (n, d) by its position ``positions[t]`` (a scalar applies to every row)."""
    X = np.asarray(X, dtype=float)
    if X.ndim != 2:
        raise InputError(f"X must be (n, d), got shape {X.shape}")
    n, d = X.shape
    freqs = rope_frequencies(d, theta)
    pos = np.broadcast_to(np.asarray(positions, dtype=float), (n,))
    ang = pos[:, None] * freqs[None, :]
    c, s = np.cos(ang), np.sin(ang)
    a, b = _pairs(d, convention)
    out = np.empty_like(X)
    out[:, a] = X[:, a] * c - X[:, b] * s
    out[:, b] = X[:, a] * s + X[:, b] * c
    return out


def rope_trace(n: int, d: int, s: int | None = None, *, rank: int = 8, value_rank: int | None = None,
               theta: float = 1e4, noise: float = 0.01, r: float = 1.0, convention: str = "half",
               start: int = 0, freq_bias: float = 0.0, seed: int | np.random.Generator = 0) -> Trace:
    """Post-RoPE trace: keys and queries drawn in a random rank-``rank`` subspace (plus isotropic noise of
    relative size ``noise``), then rotated by positions start..start+n-1; values in a rank-``value_rank``
    subspace, not rotated (RoPE acts on q and k only). Key and query norms are about ``r``.

    ``freq_bias`` > 0 tilts the key/query subspace towards the slowly rotating (low-frequency) pairs: pair i's
    coordinates are scaled by exp(freq_bias (i/(d/2) - 1)) before normalising (pair 0 rotates fastest), as in
    trained models where the high-frequency pairs carry little key energy; 0 (default) leaves the subspace
    uniformly random."""
    check_positive(n, "n", integer=True)
    check_positive(rank, "rank", integer=True)
    s = s or d
    value_rank = value_rank or rank
    if rank > d or value_rank > s:
        raise InputError(f"rank must be <= d = {d} and value_rank <= s = {s}, got {rank}, {value_rank}")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    G = rng.standard_normal((d, rank))
    if freq_bias:
        a, b = _pairs(d, convention)
        w = np.exp(freq_bias * (np.arange(d // 2) / (d // 2) - 1.0))
        G[a] *= w[:, None]
        G[b] *= w[:, None]
    Bk = np.linalg.svd(G, full_matrices=False)[0] if freq_bias else np.linalg.qr(G)[0]
    Bv = np.linalg.qr(rng.standard_normal((s, value_rank)))[0]
    def low_rank_rows(basis, m, dim):
        k = basis.shape[1]
        return (rng.standard_normal((m, k)) @ basis.T / np.sqrt(k)
                + noise * rng.standard_normal((m, dim)) / np.sqrt(dim))
    K0 = r * low_rank_rows(Bk, n, d)
    Q0 = r * low_rank_rows(Bk, n, d)
    V = low_rank_rows(Bv, n, s)
    pos = np.arange(start, start + n)
    K = apply_rope(K0, pos, theta=theta, convention=convention)
    Q = apply_rope(Q0, pos, theta=theta, convention=convention)
    meta = dict(kind="rope", n=n, d=d, s=s, rank=rank, value_rank=value_rank, theta=theta, noise=noise, r=r,
                convention=convention, freq_bias=freq_bias, positions=pos, K_pre=K0, Q_pre=Q0, key_basis=Bk, value_basis=Bv)
    return Trace(Q, K, V, meta)

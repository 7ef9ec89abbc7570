"""Synthetic attention traces: Gaussian, bounded-norm, clustered, low-rank, heavy-tailed value norms.

Every generator takes a numpy ``Generator`` and returns a :class:`Trace` of float64 numpy arrays
(Q, K of shape (n, d); V of shape (n, s)); checks move them to their backend. ``make_trace(kind, ...)``
is the one entry point the checks and notebooks use, so a real trace can replace a synthetic one.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from kvbounds.algorithms.validation import InputError, check_positive


@dataclasses.dataclass
class Trace:
    Q: np.ndarray
    K: np.ndarray
    V: np.ndarray
    meta: dict

    @property
    def n(self) -> int:
        return self.K.shape[0]

    @property
    def d(self) -> int:
        return self.K.shape[1]

    def max_norm(self) -> float:
        """max(||q||, ||k||): the r of the BalanceKV theorems."""
        return float(max(np.linalg.norm(self.Q, axis=1).max(), np.linalg.norm(self.K, axis=1).max()))


def _on_sphere(rng, n, d, radius):
    x = rng.standard_normal((n, d))
    return radius * x / np.linalg.norm(x, axis=1, keepdims=True)


def gaussian(rng, n, d, s=None, *, scale=1.0):
    """i.i.d. N(0, scale^2/d) entries: norms concentrate near ``scale``."""
    s = s or d
    z = lambda m: rng.standard_normal((n, m)) * scale / np.sqrt(d)
    return Trace(z(d), z(d), rng.standard_normal((n, s)) / np.sqrt(s), dict(kind="gaussian", scale=scale))


def bounded_norm(rng, n, d, s=None, *, r=1.0, exact_norm=False):
    """Queries and keys with ||q||, ||k|| <= r (uniform in the ball, or on the sphere if ``exact_norm``)."""
    s = s or d
    def ball():
        x = _on_sphere(rng, n, d, r)
        return x if exact_norm else x * rng.random((n, 1)) ** (1.0 / d)
    V = rng.standard_normal((n, s)) / np.sqrt(s)
    return Trace(ball(), ball(), V, dict(kind="bounded_norm", r=r, exact_norm=exact_norm))


def clustered(rng, n, d, s=None, *, m=8, r=1.0, spread=0.05):
    """Keys near m centres on the sphere of radius r (noise of norm ~ spread*r); queries bounded-norm."""
    s = s or d
    centres = _on_sphere(rng, m, d, r)
    lab = rng.integers(0, m, n)
    K = centres[lab] + rng.standard_normal((n, d)) * (spread * r / np.sqrt(d))
    Q = _on_sphere(rng, n, d, r)
    V = rng.standard_normal((n, s)) / np.sqrt(s)
    return Trace(Q, K, V, dict(kind="clustered", m=m, r=r, spread=spread, labels=lab))


def low_rank(rng, n, d, s=None, *, rank=4, r=1.0, noise=0.01):
    """Keys and values in a random rank-``rank`` subspace plus small isotropic noise."""
    s = s or d
    if not 1 <= rank <= min(d, s):
        raise InputError(f"rank must be in [1, min(d, s)] = [1, {min(d, s)}], got {rank}")
    Bk = np.linalg.qr(rng.standard_normal((d, rank)))[0]
    Bv = np.linalg.qr(rng.standard_normal((s, rank)))[0]
    K = rng.standard_normal((n, rank)) @ Bk.T * (r / np.sqrt(rank)) + noise * rng.standard_normal((n, d)) / np.sqrt(d)
    V = rng.standard_normal((n, rank)) @ Bv.T / np.sqrt(rank) + noise * rng.standard_normal((n, s)) / np.sqrt(s)
    Q = _on_sphere(rng, n, d, r)
    return Trace(Q, K, V, dict(kind="low_rank", rank=rank, r=r, noise=noise))


def heavy_tailed_values(rng, n, d, s=None, *, r=1.0, tail=1.5):
    """Bounded-norm keys/queries; value norms Pareto(tail): exercises BalanceKV's value-norm buckets."""
    s = s or d
    base = bounded_norm(rng, n, d, s, r=r)
    dirs = _on_sphere(rng, n, s, 1.0)
    norms = (rng.pareto(tail, n) + 1.0) * 0.1
    return Trace(base.Q, base.K, dirs * norms[:, None], dict(kind="heavy_tailed_values", r=r, tail=tail))


GENERATORS: dict[str, Callable[..., Trace]] = {
    "gaussian": gaussian, "bounded_norm": bounded_norm, "clustered": clustered,
    "low_rank": low_rank, "heavy_tailed_values": heavy_tailed_values,
}


def make_trace(kind: str, *, n: int, d: int, s: int | None = None, seed: int | np.random.Generator = 0, **kw) -> Trace:
    if kind not in GENERATORS:
        raise InputError(f"unknown trace kind {kind!r}; choose one of {', '.join(GENERATORS)}")
    check_positive(n, "n", integer=True)
    check_positive(d, "d", integer=True)
    if s is not None:
        check_positive(s, "s", integer=True)
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    tr = GENERATORS[kind](rng, n, d, s, **kw)
    tr.meta.update(n=n, d=d, s=tr.V.shape[1])
    return tr

"""Synthetic attention traces: Gaussian, bounded-norm, clustered, low-rank, heavy-tailed value norms.

Every generator takes a numpy ``Generator`` and returns a :class:`Trace` of float64 numpy arrays
(Q, K of shape (n, d); V of shape (n, s)); checks move them to their backend. ``make_trace(kind, ...)``
is the one entry point the checks and notebooks use, so a real trace can replace a synthetic one.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Callable

import numpy as np

from kvbounds.algorithms.validation import InputError, check_int, check_positive, check_real, check_rng, check_seed

__all__ = ["MAX_ENTRIES", "Trace", "gaussian", "bounded_norm", "clustered", "low_rank", "heavy_tailed_values",
           "GENERATORS", "make_trace"]

MAX_ENTRIES = 2**31      # n * max(d, s): larger traces do not fit in memory here

# the keyword options of the generators: name -> check (returns the value or raises InputError)
_OPTIONS = {
    "scale": lambda v: check_real(v, "scale", minimum=0.0),
    "r": lambda v: check_real(v, "r", minimum=0.0, strict=True),
    "exact_norm": lambda v: v if isinstance(v, bool) else _bad("exact_norm must be True or False", v),
    "m": lambda v: check_int(v, "m", minimum=1, maximum=2**20),
    "spread": lambda v: check_real(v, "spread", minimum=0.0),
    "rank": lambda v: check_int(v, "rank", minimum=1),
    "noise": lambda v: check_real(v, "noise", minimum=0.0),
    "tail": lambda v: check_real(v, "tail", minimum=0.0, strict=True),
}


def _bad(msg, value):
    raise InputError(f"{msg}, got {value!r}")


def _validated(gen):
    """Checks of every generator's arguments: rng, sizes, and its keyword options (unknown ones named)."""
    allowed = [p for p in inspect.signature(gen).parameters if p not in ("rng", "n", "d", "s")]

    @functools.wraps(gen)
    def wrapper(rng, n, d, s=None, **kw):
        check_rng(rng)
        n, d = check_int(n, "n", minimum=1), check_int(d, "d", minimum=1)
        s = None if s is None else check_int(s, "s", minimum=1)
        if n * max(d, s or d) > MAX_ENTRIES:
            raise InputError(f"trace of n = {n} rows of dimension {max(d, s or d)} is too large")
        unknown = sorted(set(kw) - set(allowed))
        if unknown:
            raise InputError(f"{gen.__name__} has no option(s) {unknown}; its options are {allowed}")
        return gen(rng, n, d, s, **{k: _OPTIONS[k](v) for k, v in kw.items()})
    return wrapper


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


@_validated
def gaussian(rng, n, d, s=None, *, scale=1.0):
    """i.i.d. N(0, scale^2/d) entries: norms concentrate near ``scale``."""
    s = s or d
    z = lambda m: rng.standard_normal((n, m)) * scale / np.sqrt(d)
    return Trace(z(d), z(d), rng.standard_normal((n, s)) / np.sqrt(s), dict(kind="gaussian", scale=scale))


@_validated
def bounded_norm(rng, n, d, s=None, *, r=1.0, exact_norm=False):
    """Queries and keys with ||q||, ||k|| <= r (uniform in the ball, or on the sphere if ``exact_norm``)."""
    s = s or d
    def ball():
        x = _on_sphere(rng, n, d, r)
        return x if exact_norm else x * rng.random((n, 1)) ** (1.0 / d)
    V = rng.standard_normal((n, s)) / np.sqrt(s)
    return Trace(ball(), ball(), V, dict(kind="bounded_norm", r=r, exact_norm=exact_norm))


@_validated
def clustered(rng, n, d, s=None, *, m=8, r=1.0, spread=0.05):
    """Keys near m centres on the sphere of radius r (noise of norm ~ spread*r); queries bounded-norm."""
    s = s or d
    centres = _on_sphere(rng, m, d, r)
    lab = rng.integers(0, m, n)
    K = centres[lab] + rng.standard_normal((n, d)) * (spread * r / np.sqrt(d))
    Q = _on_sphere(rng, n, d, r)
    V = rng.standard_normal((n, s)) / np.sqrt(s)
    return Trace(Q, K, V, dict(kind="clustered", m=m, r=r, spread=spread, labels=lab))


@_validated
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


@_validated
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
    if not isinstance(kind, str) or kind not in GENERATORS:
        raise InputError(f"unknown trace kind {kind!r}; choose one of {', '.join(GENERATORS)}")
    check_positive(n, "n", integer=True)
    check_positive(d, "d", integer=True)
    if s is not None:
        check_positive(s, "s", integer=True)
    seed = check_seed(seed)
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    tr = GENERATORS[kind](rng, n, d, s, **kw)
    tr.meta.update(n=n, d=d, s=tr.V.shape[1])
    return tr

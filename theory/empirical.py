"""Statistics for the empirical claims on real traces (BKV.vs-uniform, BKV.ablation, NORM.bounded, SUB.lowrank).

These claims state no formula: they compare measured quantities (an algorithm's error against a
baseline's, a norm at one length against another). The functions here are those measurements, kept
in one place so checks, notebooks and tests compute them the same way.

  * :func:`relative_error`  ||z - Attn||_F / ||Attn||_F, the error of BalanceKV-NeurIPS App. B.1 (Sec. 4.1, Fig. 1, Fig. 3).
  * :func:`norm_interval`   mean, 95% confidence half-width of the mean (BalanceKV-NeurIPS Table 3's "95% CI") and the
                            2.5%..97.5% quantile interval of a set of norms (NORM.bounded; BalanceKV-NeurIPS Table 3, ClusterGen Table 1).
  * :func:`energy_at_rank`  share of ||X||_F^2 in the top r singular values (SUB.lowrank, Subspace-FD-draft Sec. 12);
                            the check prefers ``kvbounds.theory.subspace.energy_at_rank`` when it exists.
"""
from __future__ import annotations

import math

import numpy as np

from kvbounds.algorithms.validation import InputError
from kvbounds.theory.subspace import energy_at_rank  # noqa: F401 - the one definition, re-exported for the empirical checks

__all__ = ["relative_error", "norm_interval", "mean_and_spread"]


def relative_error(z, exact, *, axis=None) -> float | np.ndarray:
    """||z - exact|| / ||exact|| (Frobenius over ``axis``; all axes when None). BalanceKV-NeurIPS App. B.1."""
    z, exact = np.asarray(z, dtype=np.float64), np.asarray(exact, dtype=np.float64)
    if z.shape != exact.shape:
        raise InputError(f"z and exact must have the same shape, got {z.shape} and {exact.shape}")
    if not (np.all(np.isfinite(z)) and np.all(np.isfinite(exact))):
        raise InputError("z and exact must be finite")
    num = np.sqrt(np.sum((z - exact) ** 2, axis=axis))
    den = np.sqrt(np.sum(exact ** 2, axis=axis))
    if np.any(den == 0):
        raise InputError("relative error undefined: the exact attention output is zero")
    out = num / den
    return float(out) if np.ndim(out) == 0 else out


def norm_interval(x, *, conf: float = 0.95) -> dict:
    """Statistics of the row norms of ``x`` (n, d) (or of the values themselves if 1-D).

    Returns mean, ``ci_half`` (normal-approximation half-width of the ``conf`` interval of the mean,
    the column BalanceKV-NeurIPS Table 3 reports), ``lo``/``hi`` (the central ``conf`` quantile interval of the norms,
    the spread), std, max and n."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 2:
        x = np.linalg.norm(x, axis=1)
    if x.ndim != 1 or x.size == 0:
        raise InputError(f"norm_interval takes a non-empty (n, d) or (n,) array, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise InputError("norm_interval: non-finite entries")
    if not 0 < conf < 1:
        raise InputError(f"conf must be in (0, 1), got {conf}")
    from scipy import stats
    zq = float(stats.norm.ppf(0.5 + conf / 2))
    a = (1 - conf) / 2
    sd = float(x.std(ddof=1)) if x.size > 1 else 0.0
    return {"mean": float(x.mean()), "ci_half": zq * sd / math.sqrt(x.size), "lo": float(np.quantile(x, a)),
            "hi": float(np.quantile(x, 1 - a)), "std": sd, "max": float(x.max()), "n": int(x.size)}


def mean_and_spread(values) -> dict:
    """Mean, sample standard deviation and min/max over seeds (BalanceKV-NeurIPS App. B.1 reports mean and std over 10 seeds)."""
    v = np.asarray(values, dtype=np.float64)
    return {"mean": float(v.mean()), "std": float(v.std(ddof=1)) if v.size > 1 else 0.0,
            "min": float(v.min()), "max": float(v.max()), "n": int(v.size)}

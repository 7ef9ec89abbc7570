"""SBW.kernel-identity: the exponential-kernel feature map of BalanceKV-NeurIPS A.2 (proof of Thm 3.3).

    phi(k) = ( (k / d^{1/4})^{(x) i} / sqrt(i!) )_{i >= 0},
    <phi(k), phi(q)> = exp(<k,q>/sqrt d),      ||phi(k)||^2 = exp(||k||^2/sqrt d).

The identity rests on <k^{(x)i}, q^{(x)i}> = <k,q>^i, so <phi(k),phi(q)> = sum_i (<k,q>/sqrt d)^i / i!,
the exponential series. Here: the explicit truncated map phi_m (i <= m) for small d, m; the exact
truncated inner product (Fractions for the tensor powers, sympy for sqrt d and the series); and the
Lagrange tail bound of the truncation, the bound function of the claim in the registry.
"""
from __future__ import annotations

import itertools
import math
from fractions import Fraction
from typing import Sequence

import numpy as np
import sympy as sp

__all__ = ["CLAIM", "SOURCE", "MAX_ENTRIES", "feature_dim", "tensor_powers", "truncated_feature_map",
           "exact_tensor_power", "tensor_power_inner", "exact_truncated_inner", "exp_taylor",
           "truncated_inner_is_taylor", "symbolic_residuals", "truncation_tail_bound", "terms_needed"]

CLAIM = "SBW.kernel-identity"
SOURCE = "BalanceKV-NeurIPS A.2 (proof of Thm 3.3)"
MAX_ENTRIES = 2_000_000


def feature_dim(d: int, m: int) -> int:
    """Dimension of phi_m on R^d: sum_{i<=m} d^i."""
    return sum(d**i for i in range(m + 1))


def tensor_powers(v: np.ndarray, m: int) -> list[np.ndarray]:
    """[v^{(x)0}, ..., v^{(x)m}], each flattened (v^{(x)0} = [1])."""
    out = [np.ones(1, dtype=np.float64)]
    for _ in range(m):
        out.append(np.kron(out[-1], v))
    return out


def _check_size(d: int, m: int) -> None:
    if m < 0 or d < 1:
        raise ValueError(f"need d >= 1 and m >= 0, got d = {d}, m = {m}")
    if feature_dim(d, m) > MAX_ENTRIES:
        raise ValueError(f"truncated feature map on R^{d} to degree {m} has {feature_dim(d, m)} entries "
                         f"(> {MAX_ENTRIES}); use smaller d or m")


def truncated_feature_map(k, m: int) -> np.ndarray:
    """phi_m(k) = ((k/d^{1/4})^{(x)i} / sqrt(i!))_{i=0..m} as one float64 vector (SBW.kernel-identity, BalanceKV-NeurIPS A.2).

    Raises ValueError when the map would have more than ``MAX_ENTRIES`` entries."""
    k = np.asarray(k, dtype=np.float64)
    if k.ndim != 1:
        raise ValueError(f"k must be a vector, got shape {k.shape}")
    d = k.shape[0]
    _check_size(d, m)
    powers = tensor_powers(k / d**0.25, m)
    return np.concatenate([p / math.sqrt(math.factorial(i)) for i, p in enumerate(powers)])


# ---- exact arithmetic --------------------------------------------------------------------------------

def exact_tensor_power(v: Sequence[Fraction], i: int) -> list[Fraction]:
    """v^{(x)i} as the explicit list of its d^i entries prod_j v[idx_j] (exact)."""
    return [math.prod(t, start=Fraction(1)) for t in itertools.product(v, repeat=i)]


def tensor_power_inner(k: Sequence[Fraction], q: Sequence[Fraction], i: int) -> Fraction:
    """<k^{(x)i}, q^{(x)i}> from the explicit tensor products (to be compared with <k,q>^i)."""
    return sum((a * b for a, b in zip(exact_tensor_power(k, i), exact_tensor_power(q, i))), Fraction(0))


def _rational(x: Fraction) -> sp.Rational:
    x = Fraction(x)
    return sp.Rational(x.numerator, x.denominator)


def exact_truncated_inner(k: Sequence[Fraction], q: Sequence[Fraction], m: int) -> sp.Expr:
    """<phi_m(k), phi_m(q)> exactly: sum_{i<=m} <k^{(x)i}, q^{(x)i}> / (d^{i/2} i!) (SBW.kernel-identity).

    The tensor inner products are exact Fractions from explicit tensor products; d^{1/4} is irrational
    in general, but only (d^{1/4})^{2i} = sqrt(d)^i enters, which sympy keeps exact."""
    if len(k) != len(q):
        raise ValueError(f"k and q must have the same length, got {len(k)} and {len(q)}")
    _check_size(len(k), m)
    sd = sp.sqrt(len(k))
    return sp.Add(*[_rational(tensor_power_inner(k, q, i)) / (sd**i * sp.factorial(i)) for i in range(m + 1)])


def exp_taylor(x: sp.Expr, m: int) -> sp.Expr:
    """The degree-m Taylor polynomial of exp at 0, evaluated at x (from sympy's series, not hand-written)."""
    t = sp.Symbol("t")
    return sp.series(sp.exp(t), t, 0, m + 1).removeO().subs(t, x)


def truncated_inner_is_taylor(k: Sequence[Fraction], q: Sequence[Fraction], m: int) -> bool:
    """Is <phi_m(k), phi_m(q)> the degree-m Taylor polynomial of exp(<k,q>/sqrt d)? (exact, sympy)"""
    x = _rational(sum((a * b for a, b in zip(k, q)), Fraction(0))) / sp.sqrt(len(k))
    return sp.expand(exact_truncated_inner(k, q, m) - exp_taylor(x, m)) == 0


def symbolic_residuals(d: int = 2, max_power: int = 3) -> dict[str, sp.Expr]:
    """Residuals that must simplify to 0 for the identity to hold (SBW.kernel-identity, BalanceKV-NeurIPS A.2):

    * ``tensor i=p``: <k^{(x)p}, q^{(x)p}> - <k,q>^p for symbolic k, q in R^d, p <= max_power;
    * ``series``: sum_{i>=0} (s/sqrt d)^i/i! - exp(s/sqrt d) (sympy summation to infinity);
    * ``norm``:   the case q = k, sum_i (||k||^2/sqrt d)^i/i! - exp(||k||^2/sqrt d) with symbolic k.
    """
    ks, qs = sp.symbols(f"k0:{d}", real=True), sp.symbols(f"q0:{d}", real=True)
    dot = sum(a * b for a, b in zip(ks, qs))
    out = {}
    for p in range(max_power + 1):
        lhs = sum((math.prod(t) * math.prod(u) for t, u in zip(itertools.product(ks, repeat=p),
                                                               itertools.product(qs, repeat=p))), sp.Integer(0))
        out[f"tensor i={p}"] = sp.expand(lhs - dot**p)
    i = sp.Symbol("i", integer=True, nonnegative=True)
    s = sp.Symbol("s", real=True)
    dd = sp.Symbol("d", positive=True)
    series = sp.summation((s / sp.sqrt(dd))**i / sp.factorial(i), (i, 0, sp.oo)) - sp.exp(s / sp.sqrt(dd))
    nk = sum(a**2 for a in ks)
    norm = sp.summation((nk / sp.sqrt(d))**i / sp.factorial(i), (i, 0, sp.oo)) - sp.exp(nk / sp.sqrt(d))
    out["series"], out["norm"] = sp.simplify(series), sp.simplify(norm)
    return out


# ---- truncation --------------------------------------------------------------------------------------

def truncation_tail_bound(x, m: int):
    """|exp(x) - sum_{i<=m} x^i/i!| <= |x|^{m+1}/(m+1)! * exp(max(x, 0)) (Lagrange remainder).

    With x = <k,q>/sqrt d (|x| <= ||k|| ||q||/sqrt d) this bounds |<phi_m(k),phi_m(q)> - exp(<k,q>/sqrt d)|
    (SBW.kernel-identity, BalanceKV-NeurIPS A.2). Accepts scalars or arrays; computed in logs so large x stay finite."""
    if m < 0:
        raise ValueError(f"m must be >= 0, got {m}")
    x = np.asarray(x, dtype=np.float64)
    ax = np.abs(x)
    with np.errstate(divide="ignore"):
        log_b = (m + 1) * np.log(ax) - math.lgamma(m + 2) + np.maximum(x, 0.0)
    out = np.where(ax == 0, 0.0, np.exp(log_b))
    return float(out) if out.ndim == 0 else out


def terms_needed(x_max: float, tol: float) -> int:
    """Smallest m with truncation_tail_bound(x, m) <= tol for every |x| <= x_max (the worst x is +x_max)."""
    if not (x_max >= 0 and math.isfinite(x_max)):
        raise ValueError(f"x_max must be finite and >= 0, got {x_max!r}")
    if not (tol > 0):
        raise ValueError(f"tol must be > 0, got {tol!r}")
    m = 0
    while truncation_tail_bound(x_max, m) > tol:
        m += 1
    return m

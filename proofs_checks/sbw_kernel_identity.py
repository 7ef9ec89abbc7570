"""SBW.kernel-identity: <phi(k),phi(q)> = exp(<k,q>/sqrt d), ||phi(k)||^2 = exp(||k||^2/sqrt d) (BalanceKV-NeurIPS A.2, Thm 3.3).

Sub-checks (``check`` field of the records):
  * ``tensor-power exact``  Fractions: <k^{(x)i}, q^{(x)i}> == <k,q>^i from explicit tensor products for random
                            small rational vectors; measured = number of mismatches, bound 0 [exact].
  * ``symbolic``            sympy: the tensor identity for symbolic k, q; the series sum_i x^i/i! = exp(x) with
                            x = s/sqrt d and with x = ||k||^2/sqrt d (the norm case q = k); the exact truncated
                            inner product of rational k, q (also q = k) equals the degree-m Taylor polynomial of
                            exp(<k,q>/sqrt d). measured = number of residuals that do not simplify to 0 [exact].
  * ``truncation``          float64: |<phi_m(k),phi_m(q)> - exp(<k,q>/sqrt d)| from the explicit truncated map, against
                            the Lagrange tail bound plus a floating-point rounding allowance [a-priori].
  * ``truncation, no 1/sqrt(i!)``  negative control: the map without the 1/sqrt(i!) weights must violate it.

Backend-independent (exact arithmetic and small numpy vectors): ``backend`` is accepted and ignored.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from kvbounds.verdict import FigureSpec, Verdict, standard_verdict
from kvbounds.theory.kernel_identity import (feature_dim, symbolic_residuals, tensor_power_inner, tensor_powers,
                                    truncated_feature_map, truncated_inner_is_taylor, truncation_tail_bound)

from .common import grid, make_record, pick, unit_directions

__all__ = ["CLAIM", "SOURCE", "CONTROL", "MAX_DIM", "MAX_EXACT_DIM", "U", "trials", "run_trial", "summarize"]

CLAIM = "SBW.kernel-identity"
SOURCE = "BalanceKV-NeurIPS A.2 (proof of Thm 3.3)"
CONTROL = "truncation, no 1/sqrt(i!)"
MAX_DIM = 200_000        # float feature dimension sum_i d^i, kept small so the quick profile stays fast
MAX_EXACT_DIM = 20_000   # the exact (Fraction) tensor products are Python loops
U = np.finfo(np.float64).eps / 2


def trials(profile: str) -> list[dict]:
    ds = pick(profile, smoke=[2], quick=[1, 2, 3], full=[1, 2, 3, 4])
    out = grid(check=["tensor-power exact"], d=ds, max_power=[pick(profile, smoke=4, quick=5, full=6)], pairs=[8])
    sym = grid(check=["symbolic"], d=pick(profile, smoke=[2], quick=[2, 3], full=[2, 3, 4]), max_power=[3],
               m=pick(profile, smoke=[4], quick=[3, 8], full=[3, 8, 12]), pairs=[3])
    out += [p for p in sym if feature_dim(p["d"], p["m"]) <= MAX_EXACT_DIM]
    ms = pick(profile, smoke=[0, 2, 4, 6], quick=[0, 1, 2, 3, 4, 6, 8, 10, 12], full=list(range(17)))
    norms = pick(profile, smoke=[1.0, 3.0], quick=[0.5, 1.0, 2.0, 3.0], full=[0.25, 0.5, 1.0, 2.0, 3.0, 4.0])
    tr = grid(d=pick(profile, smoke=[2], quick=[2, 3, 4], full=[2, 3, 4, 5]), m=ms, norm=norms)
    tr = [p for p in tr if feature_dim(p["d"], p["m"]) <= MAX_DIM]
    out += [dict(check="truncation", pairs=6, **p) for p in tr]
    out += [dict(check=CONTROL, pairs=6, **p) for p in tr if _control_has_power(p)]
    return out


def _control_has_power(p: dict) -> bool:
    """The broken map is rejected for sure when, at x = ||k||^2/sqrt d (the pair q = k), its error
    sum_{2<=i<=m} x^i (1 - 1/i!) - R_m >= x^2/2 - tail exceeds the tail bound: tail <= x^2/8 suffices.
    (For m <= 1 all weights 1/sqrt(i!) are 1, so the broken map equals phi_m.)"""
    x = p["norm"] ** 2 / math.sqrt(p["d"])
    return p["m"] >= 2 and truncation_tail_bound(x, p["m"]) <= x * x / 8


def _rationals(rng: np.random.Generator, d: int) -> list[Fraction]:
    return [Fraction(int(rng.integers(-6, 7)), int(rng.integers(1, 8))) for _ in range(d)]


def _tensor_exact(params, rng):
    mismatches = 0
    for _ in range(params["pairs"]):
        k, q = _rationals(rng, params["d"]), _rationals(rng, params["d"])
        dot = sum((a * b for a, b in zip(k, q)), Fraction(0))
        mismatches += sum(tensor_power_inner(k, q, i) != dot**i for i in range(params["max_power"] + 1))
    return make_record(CLAIM, params, measured=mismatches, bound=0, bound_kind="exact", check=params["check"],
                       source=SOURCE, trials=params["pairs"] * (params["max_power"] + 1))


def _symbolic(params, rng):
    res = symbolic_residuals(params["d"], params["max_power"])
    bad = [name for name, r in res.items() if r != 0]
    for j in range(params["pairs"]):
        k = _rationals(rng, params["d"])
        q = k if j == 0 else _rationals(rng, params["d"])      # j = 0: the norm case ||phi_m(k)||^2
        if not truncated_inner_is_taylor(k, q, params["m"]):
            bad.append(f"taylor pair {j}")
    return make_record(CLAIM, params, measured=len(bad), bound=0, bound_kind="exact", check=params["check"],
                       source=SOURCE, trials=len(res) + params["pairs"], nonzero=bad)


def _pairs(rng, d, norm, count):
    """Random (k, q) with ||k|| = ||q|| = norm, plus q = k (the norm identity) and q = -k (most cancellation)."""
    k = norm * unit_directions(rng, count, d)
    q = norm * unit_directions(rng, count, d)
    q[0], q[1] = k[0], -k[1]
    return k, q


def _broken_map(k, m):
    # the control: phi without the 1/sqrt(i!) weights, so <.,.> = sum_i x^i instead of sum_i x^i / i!
    return np.concatenate(tensor_powers(k / len(k)**0.25, m))


def _truncation(params, rng):
    d, m = params["d"], params["m"]
    control = params["check"] == CONTROL
    fmap = _broken_map if control else truncated_feature_map
    ks, qs = _pairs(rng, d, params["norm"], params["pairs"])
    dim = feature_dim(d, m)
    worst = None
    for k, q in zip(ks, qs):
        pk, pq = fmap(k, m), fmap(q, m)
        x = float(k @ q) / math.sqrt(d)
        err = abs(float(pk @ pq) - math.exp(x))
        # rounding: a dot product of length dim is off by <= gamma_dim sum|a_j b_j|; each entry carries
        # <= 2m + 4 further roundings (the scaling by d^{1/4}, the i products, 1/sqrt(i!)); exp adds 1 ulp.
        gamma = (dim + 4 * m + 10) * U
        slack = gamma / (1 - gamma) * float(np.abs(pk) @ np.abs(pq)) + 2 * U * math.exp(x)
        bound = truncation_tail_bound(x, m) + slack
        if worst is None or err / bound > worst[0] / worst[1]:
            worst = (err, bound, x, slack)
    err, bound, x, slack = worst
    return make_record(CLAIM, params, measured=err, bound=bound, check=params["check"], control=control,
                       source=SOURCE + " + Lagrange remainder", trials=params["pairs"], x=x, rounding=slack,
                       tail=bound - slack, feature_dim=dim)


def run_trial(params: dict, seed: int, backend: str):
    rng = np.random.default_rng(seed)
    check = params["check"]
    if check == "tensor-power exact":
        return _tensor_exact(params, rng)
    if check == "symbolic":
        return _symbolic(params, rng)
    if check in ("truncation", CONTROL):
        return _truncation(params, rng)
    raise ValueError(f"unknown sub-check {check!r}")


def summarize(records) -> Verdict:
    figs = [FigureSpec("truncation error of phi_m vs m (dashed: Lagrange tail bound)", x="m", check="truncation",
                       hue="norm", logx=False),
            FigureSpec("truncation error / bound vs m", x="m", check="truncation", hue="d", y="ratio",
                       logx=False, logy=False)]
    # the lemma's proof (the tensor-power identity and the series) is checked exactly: no errata means "sound"
    return standard_verdict(CLAIM, records, figures=figs, proof_checked=True)

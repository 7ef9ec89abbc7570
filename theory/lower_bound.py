"""The space lower bound of BalanceKV-NeurIPS Thm 3.2 (appendix C), claim LB.index: the bound's shape, Lemma C.3
exactly, the statements of Lemmas C.4-C.6 and of the proof's conclusion as functions.

Theorem 3.2 (BalanceKV-NeurIPS): for r^2 <= d, a streaming algorithm that meets eq. (2),
``||z - Attn(q,K,V)|| <= eps ||softmax(Kq/sqrt d)||_2 ||V||_F``, with probability 0.999 needs
``Omega(min{1/eps^2, d exp(2 r^2/sqrt d)})`` space. Throughout, ``a = r^2/sqrt d`` (so a key's
self-logit is ``<k,k>/sqrt d = a``) and the keys are uniform on ``{-r/sqrt d, +r/sqrt d}^d``.

Lemma C.3: ``E exp(C<x,y>/sqrt d) = cosh(C r^2/d^{3/2})^d`` and the chain
``1 <= exp(C^2 r^4/4d^2) <= cosh(C r^2/d^{3/2})^d <= exp(C^2 r^4/d^2) <= exp(C^2)`` (r^2 <= d).
Step 2 of the chain is ``log cosh(A) >= A^2/4`` with ``A = C r^2/d^{3/2}``; it holds exactly for
``A <= A_STAR ~ 3.11`` (:func:`lemma_c3_step2_threshold`), so it fails for large C (e.g. d = r = 1, C = 4).
"""
from __future__ import annotations

import functools
import itertools
import math
import numbers
from fractions import Fraction

import mpmath
import sympy as sp
from scipy import stats

from kvbounds.algorithms.index_reduction import (BOB_THRESHOLD_FACTOR, bob_threshold, check_dimension,  # noqa: F401
                                                check_length, check_radius, exponent, log2_binomial)
from kvbounds.algorithms.validation import InputError

__all__ = ["SOURCE", "INDEX_SUCCESS", "LEMMA_C4_LAMBDA", "LEMMA_C4_SECOND_MOMENT", "COROLLARY_C5_PROB", "LEMMA_C6_PROB",
           "LEMMA_C6_ERROR_CONST", "LEMMA_C6_SAFE_CONST", "CHAIN", "space_lower_bound", "lemma_c3_expectation",
           "key_moments", "sign_product_counts", "lemma_c3_formula", "lemma_c3_residuals", "lemma_c3_chain",
           "lemma_c3_steps", "lemma_c3_statement", "lemma_c3_step2_threshold", "lemma_c3_log_bounds_symbolic",
           "lemma_c4_stated_failure", "lemma_c4_chebyshev", "lemma_c4_lambda_for_stated", "lemma_c6_noise_constant",
           "group_ones_probability", "smallest_d_group_ones", "denominator_range", "denominator_container",
           "numerator_range", "numerator_range_squared", "proof_constant_case1", "binary_entropy",
           "inverse_binary_entropy", "fano_success_ceiling", "binomial_sf"]

SOURCE = "BalanceKV-NeurIPS Thm 3.2, App. C"
INDEX_SUCCESS = 0.8            # Bob's success probability claimed in the proof of Thm 3.2
LEMMA_C4_LAMBDA = 1000         # |X| >= 1000 sqrt(|U|) in the proof of Lemma C.4
LEMMA_C4_SECOND_MOMENT = math.exp(4)   # E exp(2<x,y>/sqrt d) <= e^4 (Lemma C.3 with C = 2)
COROLLARY_C5_PROB = 0.999
LEMMA_C6_PROB = 0.98
LEMMA_C6_ERROR_CONST = 10_000  # coordinate error <= 10000 eps/sqrt(d) ||softmax|| ||V||_F on safe coordinates
LEMMA_C6_SAFE_CONST = 10_000   # safe: fewer than 10000 |U|/d values of U in the coordinate
CHAIN = ("1", "exp(C^2 r^4/4d^2)", "cosh(C r^2/d^1.5)^d", "exp(C^2 r^4/d^2)", "exp(C^2)")


# ------------------------------------------------------------------------------ parameters, shape

def space_lower_bound(eps, d, r) -> float:
    """The shape min{1/eps^2, d exp(2 r^2/sqrt d)} of Thm 3.2 (constant 1). ``eps = 0`` (exact attention)
    leaves d exp(2r^2/sqrt d)."""
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not math.isfinite(eps) or eps < 0:
        raise InputError(f"eps must be a finite number >= 0, got {eps!r}")
    a = exponent(d, r)
    inv = math.inf if eps == 0 else 1.0 / eps**2
    return min(inv, d * math.exp(2 * a))


# --------------------------------------------------------------------------------------- Lemma C.3

def lemma_c3_expectation(C: float, d: int, r: float) -> float:
    """E_{x,y ~ Unif{+-r/sqrt d}^d} exp(C <x,y>/sqrt d) = cosh(C r^2/d^{3/2})^d (float)."""
    check_radius(d, r)
    return math.cosh(C * r * r / d**1.5) ** d


def key_moments(d: int, r: float) -> tuple[float, float]:
    """(mu, m2) = (E exp(<x,y>/sqrt d), E exp(2<x,y>/sqrt d)) for independent uniform keys."""
    return lemma_c3_expectation(1.0, d, r), lemma_c3_expectation(2.0, d, r)


def sign_product_counts(d: int) -> dict[int, int]:
    """Exact enumeration: for every s, the number of pairs (x, y) in {-1,1}^d x {-1,1}^d with
    sum_l x_l y_l = s (all 4^d pairs are listed, no formula used)."""
    d = check_dimension(d)
    if d > 8:
        raise InputError(f"exact enumeration lists 4^d pairs; d = {d} > 8 is too many")
    counts: dict[int, int] = {}
    vecs = list(itertools.product((-1, 1), repeat=d))
    for x in vecs:
        for y in vecs:
            s = sum(a * b for a, b in zip(x, y))
            counts[s] = counts.get(s, 0) + 1
    return counts


_C, _R = sp.symbols("C r", positive=True)


def lemma_c3_formula(d: int, *, variant: str = "paper"):
    """The closed form as a sympy expression in C, r. ``variant="wrong-power"`` (a negative control)
    replaces d^{3/2} by d."""
    if variant not in ("paper", "wrong-power"):
        raise InputError(f"variant must be 'paper' or 'wrong-power', got {variant!r}")
    denom = sp.Integer(d) ** sp.Rational(3, 2) if variant == "paper" else sp.Integer(d)
    return sp.cosh(_C * _R**2 / denom) ** d


def lemma_c3_residuals(d: int, *, variant: str = "paper") -> dict[str, sp.Expr]:
    """Exact residuals (0 when the identity holds), symbolic in C and r:

    * ``one coordinate``: E over x_l, y_l in {+-r/sqrt d} of exp(C x_l y_l/sqrt d) minus cosh(C r^2/d^{3/2});
    * ``enumeration``: the average of exp(C <x,y>/sqrt d) over all 4^d pairs (from
      :func:`sign_product_counts`) minus the closed form ``cosh(C r^2/d^{3/2})^d``."""
    d = check_dimension(d)
    unit = _R / sp.sqrt(d)
    one = sum(sp.exp(_C * xs * ys / sp.sqrt(d)) for xs in (-unit, unit) for ys in (-unit, unit)) / 4
    step = _C * _R**2 / sp.Integer(d) ** sp.Rational(3, 2)
    out = {"one coordinate": sp.simplify((one - sp.cosh(step)).rewrite(sp.exp))}
    avg = sum(cnt * sp.exp(s * step) for s, cnt in sign_product_counts(d).items()) / sp.Integer(4) ** d
    resid = (avg - lemma_c3_formula(d, variant=variant)).rewrite(sp.exp)
    out["enumeration"] = sp.simplify(sp.expand(resid))
    return out


def _iv(x):
    return mpmath.iv.mpf(x) if not isinstance(x, Fraction) else mpmath.iv.mpf(x.numerator) / x.denominator


def lemma_c3_chain(C, d: int, r2, *, prec: int = 120) -> list:
    """The five terms of the chain as mpmath intervals, at C and r^2 = ``r2`` (exact rationals allowed)."""
    d = check_dimension(d)
    mpmath.iv.prec = prec
    C, r2, dd = _iv(C), _iv(r2), mpmath.iv.mpf(d)
    A = C * r2 / (dd * mpmath.iv.sqrt(dd))
    cosh = (mpmath.iv.exp(A) + mpmath.iv.exp(-A)) / 2
    return [mpmath.iv.mpf(1), mpmath.iv.exp(C**2 * r2**2 / (4 * dd**2)), cosh**d,
            mpmath.iv.exp(C**2 * r2**2 / dd**2), mpmath.iv.exp(C**2)]


def _rational(x) -> Fraction:
    return x if isinstance(x, Fraction) else Fraction(str(x))


def lemma_c3_steps(C, d: int, r2, *, prec: int = 120) -> list[str]:
    """For each of the 4 inequalities of the chain: "holds" or "fails", certified, else "undecided".

    Steps 1 and 4 compare exponents of exp (monotone) in exact rational arithmetic: 0 <= C^2 r^4/4d^2, and
    C^2 r^4/d^2 <= C^2 iff r^4 <= d^2 (equality at r^2 = d). Steps 2 and 3 are transcendental and are
    decided by interval arithmetic at ``prec`` bits (equality only at C r^2 = 0, which the grid excludes)."""
    Cq, rq = _rational(C), _rational(r2)
    t = lemma_c3_chain(C, d, r2, prec=prec)
    interval = lambda lo, hi: "holds" if lo.b <= hi.a else "fails" if lo.a > hi.b else "undecided"
    step1 = "holds" if Cq * Cq * rq * rq / (4 * d * d) >= 0 else "fails"
    step4 = "holds" if rq * rq <= d * d else "fails"
    return [step1, interval(t[1], t[2]), interval(t[2], t[3]), step4]


def lemma_c3_statement(C, d: int, r2, *, prec: int = 120) -> str:
    """The bounds the lemma's Theta(1) conclusion needs: 1 <= cosh(C r^2/d^{3/2})^d <= exp(C^2)."""
    one, _, mid, _, top = lemma_c3_chain(C, d, r2, prec=prec)
    if one.b <= mid.a and mid.b <= top.a:
        return "holds"
    return "fails" if one.a > mid.b or mid.a > top.b else "undecided"


def lemma_c3_step2_threshold(prec: int = 80) -> tuple[float, float]:
    """A* > 0 with log cosh(A*) = A*^2/4, certified: returns an interval (lo, hi) containing A* such that
    log cosh(A) - A^2/4 > 0 at lo and < 0 at hi (the function is increasing up to tanh(A) = A/2 and
    decreasing after it, so step 2 holds exactly for A <= A*)."""
    mpmath.mp.prec = prec
    root = mpmath.findroot(lambda a: mpmath.log(mpmath.cosh(a)) - a * a / 4, 3.1)
    lo, hi = float(root) - 1e-9, float(root) + 1e-9
    mpmath.iv.prec = prec
    f = lambda a: mpmath.iv.log((mpmath.iv.exp(_iv(a)) + mpmath.iv.exp(-_iv(a))) / 2) - _iv(a) ** 2 / 4
    if not (f(lo).a > 0 and f(hi).b < 0):
        raise ArithmeticError("could not certify the root of log cosh(A) = A^2/4")
    return lo, hi


def lemma_c3_log_bounds_symbolic() -> dict[str, sp.Expr]:
    """Symbolic facts behind steps 2 and 3, as expressions whose sign is checked by the caller:
    g(A) = A^2/2 - log cosh A has g(0) = 0 and g'(A) = A - tanh A, g''(A) = tanh(A)^2 >= 0 (so g >= 0:
    step 3 holds with room); h(A) = log cosh A - A^2/4 has h'(A) = tanh A - A/2 (changes sign once)."""
    A = sp.symbols("A", positive=True)
    g = A**2 / 2 - sp.log(sp.cosh(A))
    h = sp.log(sp.cosh(A)) - A**2 / 4
    return {"g(0)": g.subs(A, 0), "g'' - tanh^2": sp.simplify(sp.diff(g, A, 2) - sp.tanh(A) ** 2),
            "g'(0)": sp.diff(g, A).subs(A, 0), "h'": sp.simplify(sp.diff(h, A))}


# ----------------------------------------------------------------------------- Lemmas C.4 - C.6

def lemma_c4_stated_failure(u_i: int, u: int) -> float:
    """Lemma C.4's failure probability (1/1000) |U_i|/|U|."""
    return u_i / (1000 * u) if u else 0.0


def lemma_c4_chebyshev(u_i: int, u: int, lam: float, second_moment: float = LEMMA_C4_SECOND_MOMENT) -> float:
    """The proof's Chebyshev step: Pr[|X| >= lam sqrt|U|] <= E[X^2]/(lam^2 |U|) <= m2 |U_i|/(lam^2 |U|)."""
    return min(1.0, second_moment * u_i / (lam * lam * u)) if u else 0.0


def lemma_c4_lambda_for_stated() -> float:
    """The smallest lam for which the Chebyshev bound e^4 |U_i|/(lam^2 |U|) is <= |U_i|/(1000|U|)."""
    return math.sqrt(1000 * LEMMA_C4_SECOND_MOMENT)


def lemma_c6_noise_constant() -> float:
    """|X| <= K sqrt(|U|/d) with the proof's constants: Chebyshev at probability 0.001 (|X| <=
    sqrt(1000 e^4 |U_i|)) on a safe coordinate (|U_i| <= 10000 |U|/d)."""
    return math.sqrt(1000 * LEMMA_C4_SECOND_MOMENT * LEMMA_C6_SAFE_CONST)


# -------------------------------------------------------------------------- the proof's conclusion

def group_ones_probability(d: int, *, given_bit_one: bool = False) -> Fraction:
    """Pr[|U^i| >= 0.4 d] exactly, |U^i| = ones in bit i's group: Bin(d, 1/2), or 1 + Bin(d-1, 1/2) given
    x_i = 1. The proof's conclusion claims 0.9."""
    d = check_dimension(d)
    m, base = (d - 1, 1) if given_bit_one else (d, 0)
    need = math.ceil(Fraction(2, 5) * d) - base
    good = sum(math.comb(m, k) for k in range(max(need, 0), m + 1))
    return Fraction(good, 2**m)


@functools.lru_cache(maxsize=16)
def smallest_d_group_ones(target: float = 0.9, *, given_bit_one: bool = False, d_max: int = 512) -> int:
    """The smallest d from which on Pr[|U^i| >= 0.4 d] >= target for every larger d up to d_max
    (the probability is not monotone in d: it drops whenever 0.4 d crosses an integer)."""
    ok = [group_ones_probability(d, given_bit_one=given_bit_one) >= target for d in range(1, d_max + 1)]
    last_bad = max((i + 1 for i, x in enumerate(ok) if not x), default=0)
    return last_bad + 1


def denominator_range(u_group: int, u: int, d: int, r: float) -> tuple[float, float]:
    """The conclusion's range for D = sum_U exp(<k,q_i>/sqrt d): [|U^i| e^a + |U|/5, |U^i| e^a + 20 |U|]."""
    ea = math.exp(exponent(d, r))
    return u_group * ea + u / 5, u_group * ea + 20 * u


def denominator_container(u: int, d: int, r: float) -> tuple[float, float]:
    """The range it is said to be contained in: [max/5, 20 max], max = max{d e^a, |U|}."""
    m = max(d * math.exp(exponent(d, r)), u)
    return m / 5, 20 * m


def numerator_range(u_group: int, u: int, d: int, r: float) -> tuple[float, float]:
    """The conclusion's range for the "numerator of softmax" as written:
    [sqrt|U^i| e^{2a} + |U|/5, sqrt|U^i| e^{2a} + 200 |U|]."""
    e2a = math.exp(2 * exponent(d, r))
    return math.sqrt(u_group) * e2a + u / 5, math.sqrt(u_group) * e2a + 200 * u


def numerator_range_squared(u_group: int, u: int, d: int, r: float) -> tuple[float, float]:
    """The reading that makes the next line (<= sqrt(200) sqrt(d) e^a) follow: the squared norm
    sum_U exp(2<k,q_i>/sqrt d) in [|U^i| e^{2a} + |U|/5, |U^i| e^{2a} + 200 |U|]."""
    e2a = math.exp(2 * exponent(d, r))
    return u_group * e2a + u / 5, u_group * e2a + 200 * u


def proof_constant_case1() -> float:
    """C/c forced by case 1 of the conclusion with the proof's own constants: the error
    10000 sqrt(20) eps e^a sqrt|U| / D with D >= max/5 and |U| = (c/C) d e^{2a} must be
    <= (eps/2000) sqrt(d) e^{2a}/max, i.e. sqrt(c/C) <= 1/(2000 * 10000 sqrt(20) * 5)."""
    return (2000 * LEMMA_C6_ERROR_CONST * math.sqrt(20) * 5) ** 2


# ------------------------------------------------------------------------------ information bound

def binary_entropy(p: float) -> float:
    if p <= 0 or p >= 1:
        return 0.0
    return -p * math.log2(p) - (1 - p) * math.log2(1 - p)


def inverse_binary_entropy(h: float) -> float:
    """The p in [0, 1/2] with H(p) = h."""
    if h <= 0:
        return 0.0
    if h >= 1:
        return 0.5
    lo, hi = 0.0, 0.5
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if binary_entropy(mid) < h else (lo, mid)
    return lo


def fano_success_ceiling(bits: float, n: int) -> float:
    """The most any one-way protocol with a ``bits``-bit message (public coins allowed) can reach as
    Bob's average success over i ~ Unif[n], x ~ Unif{0,1}^n: by Fano and the chain rule,
    sum_i (1 - H(p_i)) <= I(x; message | coins) <= bits, so by concavity H(p_err) >= 1 - bits/n."""
    if bits >= n:
        return 1.0
    return 1.0 - inverse_binary_entropy(1.0 - bits / n)


def binomial_sf(k: int, n: int, p: float) -> float:
    return float(stats.binom.sf(k - 1, n, p))

"""Bounds of coefficient-space attention (Subspace-FD-draft Secs. 4, 6, 8, 9): claims SUB.softmax-sensitivity,
SUB.logit-error, SUB.output-error, SUB.blockwise, SUB.cost (and energy_at_rank for SUB.lowrank).

Notation: l_i = q.k_i/sqrt(d) exact logits, l^_i = gamma q^T P k_i/sqrt(d) projected logits (P = B^T B, rank r),
alpha = softmax(l), alpha^ = softmax(l^), Delta K = K (I - P), Delta V = V (I - P_E), o = alpha^T V, o^ = alpha^T V P_E.

SUB.softmax-sensitivity [proven here, constant tight]: ||alpha - alpha^||_1 <= 2 tanh(||l - l^||_inf / 2) <= ||l - l^||_inf.
  Proof. ||alpha - alpha^||_1 = 2 max_S (alpha^(S) - alpha(S)). Write l^ = l + delta, |delta_i| <= t. For fixed S,
  alpha^(S) increases in delta_i (i in S) and decreases in delta_i (i not in S), and a common shift of delta changes
  nothing, so the worst case is delta = +t on S, -t off S: alpha^(S) = p x / (p x + 1 - p), p = alpha(S), x = e^{2t}.
  f(p) = p x/(p x + 1 - p) - p is maximised at p* = 1/(sqrt(x) + 1) with f(p*) = (sqrt(x)-1)/(sqrt(x)+1) = tanh(t/2)
  (:func:`softmax_sensitivity_symbolic` redoes this in sympy). Equality: n = 2, l = (0, t), l^ = (t, 0)
  (:func:`softmax_sensitivity_extremal`), so no constant c < 1 in front of 2 tanh(t/2) is valid.

SUB.logit-error: the draft states ||l - l^||_inf <= (gamma/sqrt d) ||Delta K||_op ||q||. Exactly,
      l_i - l^_i = q^T (I - gamma P) k_i / sqrt(d) = [q^T (I - P) k_i + (1 - gamma) q^T P k_i] / sqrt(d),
  so (i) for gamma = 1 the statement holds (|q^T Delta k_i| <= ||q|| ||Delta k_i|| <= ||q|| ||Delta K||_op), and
  (ii) for gamma != 1 it is false: keys inside the subspace (Delta K = 0) still give ||l - l^||_inf =
  |1 - gamma| max_i |q^T k_i| / sqrt(d) > 0 = the bound. Smallest instance: d = 2, r = 1, gamma = sqrt(1/2), B = e1,
  K = [e1], q = e1: error 1/sqrt2 - 1/2 = 0.207 > 0. The correct, tight statement [proven]:
      ||l - l^||_inf <= (||q||/sqrt d) max_i ||(I - gamma P) k_i||   (equality for q along the worst (I - gamma P) k_i)
                    <= (||q||/sqrt d) (||Delta K||_op + |1 - gamma| ||K P||_op).
  (For the multi-chunk form, max over chunks j with P = P_j.)

SUB.output-error [the stated inequality, in terms of the measured ||l - l^||_inf, is proven]:
      o - o^ = (alpha - alpha^)^T V + alpha^T Delta V, so
      ||o - o^|| <= ||alpha - alpha^||_1 max_i ||v_i|| + max_i ||Delta v_i|| <= 2 tanh(||l - l^||_inf/2) max||v_i|| + ||Delta V||_op.
  The multi-chunk version of the draft substitutes the (gamma-scaled) logit bound, so it inherits (ii): false for
  gamma != 1, true for gamma = 1.

SUB.blockwise [proven; :func:`blockwise_softmax_identity` checks it symbolically]: after chunk j the state satisfies
  Z_j = sum_{i in chunks <= j} e^{l_i - m_j} and N_j = sum e^{l_i - m_j} v_i for *any* reference m_j (the update
  multiplies by e^{m_{j-1} - m_j}), so N_J / Z_J = softmax(l)^T v whatever the branches took; with m_j the running
  max (the draft) every exponent is <= 0. The literal pseudocode's m_j = -inf case (a fully masked leading chunk)
  is 0/0 and needs the guard of :mod:`kvbounds.algorithms.blockwise_softmax`.

SUB.cost: :func:`cost_model`, the operation and byte counts of one decode step, term by term;
:func:`decode_time_model` turns them into seconds on one core with the terms the counts leave out (the
exponentials, the passes over the logits, the working set's streaming rate, the per-call cost), each constant
measured on its own micro-kernel by benchmarks/bench_fd.py (b).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from kvbounds.algorithms.validation import InputError, check_array

__all__ = ["softmax_sensitivity_bound", "softmax_sensitivity_extremal", "softmax_sensitivity_symbolic", "draft_gamma",
           "logit_error_bound", "logit_error_bound_corrected", "logit_error_exact_bound", "logit_error_counterexample",
           "output_error_bound", "output_error_bound_multichunk", "output_error_bound_corrected",
           "blockwise_softmax_identity", "cost_model", "decode_time_model", "energy_at_rank"]


# -- SUB.softmax-sensitivity ---------------------------------------------------------------------------

def softmax_sensitivity_bound(linf: float) -> float:
    """2 tanh(||l - l^||_inf / 2) (Subspace-FD-draft Sec. 8). [proven, tight]"""
    return 2.0 * math.tanh(linf / 2.0)


def softmax_sensitivity_extremal(t: float, n: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """(l, l^) with ||l - l^||_inf = t and ||alpha - alpha^||_1 = 2 tanh(t/2) exactly: alpha(S) = 1/(e^t + 1) for
    S = {token 0}, delta = +t on S and -t off S. For n > 2 the mass 1 - alpha(S) is split evenly."""
    if n < 2:
        raise ValueError("n >= 2 tokens are needed")
    l = np.full(n, t - math.log(n - 1))    # softmax mass of the n-1 others: e^t (n-1) e^{-log(n-1)} = e^t
    l[0] = 0.0
    delta = np.full(n, -t)
    delta[0] = t
    return l, l + delta


def softmax_sensitivity_symbolic() -> dict:
    """The maximisation in the proof, in sympy: argmax_p f(p) and max f = tanh(t/2)."""
    import sympy as sp
    p, t = sp.symbols("p t", positive=True)
    x = sp.exp(2 * t)
    f = p * x / (p * x + 1 - p) - p
    crit = sp.solve(sp.Eq(sp.diff(f, p), 0), p)
    crit = [c for c in crit if sp.simplify(c - 1 / (sp.exp(t) + 1)) == 0]
    fmax = sp.simplify(f.subs(p, crit[0])) if crit else None
    residual = sp.simplify((fmax - sp.tanh(t / 2)).rewrite(sp.exp)) if fmax is not None else None
    second = sp.simplify(sp.diff(f, p, 2).subs(p, crit[0])) if crit else None
    concave = bool(sp.simplify(second.subs(t, sp.Rational(1, 3))) < 0) if second is not None else False
    return dict(argmax=crit[0] if crit else None, max=fmax, residual=residual, verified=residual == 0 and concave)


# -- gamma_B and SUB.logit-error ---------------------------------------------------------------------------

def draft_gamma(r: int, d: int) -> float:
    """The draft's default gamma_B = sqrt(trace(P_B)/d) = sqrt(r/d)."""
    return math.sqrt(r / d)


def logit_error_bound(q_norm: float, dK_op: float, d: int, gamma: float) -> float:
    """The draft's ||l - l^||_inf <= (gamma/sqrt d) ||Delta K||_op ||q|| (Subspace-FD-draft Sec. 8). [stated; true only for gamma = 1]"""
    return gamma / math.sqrt(d) * dK_op * q_norm


def logit_error_bound_corrected(q_norm: float, dK_op: float, KP_op: float, d: int, gamma: float) -> float:
    """(||q||/sqrt d)(||Delta K||_op + |1 - gamma| ||K P||_op). [proven]"""
    return q_norm / math.sqrt(d) * (dK_op + abs(1.0 - gamma) * KP_op)


def logit_error_exact_bound(q_norm: float, K, P, d: int, gamma: float) -> float:
    """(||q||/sqrt d) max_i ||(I - gamma P) k_i||: the tight form (attained for q along the worst row). [proven]"""
    K = np.asarray(K, float)
    R = K - gamma * K @ np.asarray(P, float)
    return q_norm / math.sqrt(d) * float(np.linalg.norm(R, axis=1).max())


def logit_error_counterexample() -> dict:
    """Smallest instance where the draft's logit bound fails for gamma = sqrt(r/d): d = 2, r = 1, Delta K = 0."""
    d, r = 2, 1
    g = draft_gamma(r, d)
    K, q, P = np.array([[1.0, 0.0]]), np.array([1.0, 0.0]), np.diag([1.0, 0.0])
    err = abs((1 - g) * q @ K[0]) / math.sqrt(d)
    return dict(d=d, r=r, gamma=g, K=K, q=q, P=P, error=err, bound=logit_error_bound(1.0, 0.0, d, g))


# -- SUB.output-error ---------------------------------------------------------------------------------------

def output_error_bound(linf: float, vmax: float, dV_op: float) -> float:
    """2 tanh(||l - l^||_inf / 2) max||v_i|| + ||Delta V||_op (Subspace-FD-draft Sec. 8), with the measured logit error. [proven]"""
    return softmax_sensitivity_bound(linf) * vmax + dV_op


def output_error_bound_multichunk(q_norm: float, d: int, gamma: float, dK_ops: Sequence[float], vmax: float,
                                  dV_ops: Sequence[float]) -> float:
    """The draft's multi-chunk bound 2 tanh((gamma ||q||/(2 sqrt d)) max_j ||K_j(I-P_Bj)||) max||v|| + max_j ||V_j(I-P_Ej)||.
    [stated; inherits the gamma error of the logit bound]"""
    return softmax_sensitivity_bound(logit_error_bound(q_norm, max(dK_ops), d, gamma)) * vmax + max(dV_ops)


def output_error_bound_corrected(linf_bound: float, vmax: float, dv_max: float) -> float:
    """2 tanh(L/2) max||v_i|| + max_i ||Delta v_i|| for any valid logit bound L (e.g. the corrected one). [proven]"""
    return softmax_sensitivity_bound(linf_bound) * vmax + dv_max


# -- SUB.blockwise ------------------------------------------------------------------------------------------

def blockwise_softmax_identity(sizes: Sequence[int] = (2, 1, 3)) -> dict:
    """Run the Sec. 6 recurrence in sympy with symbolic logits l, scalar values v and *arbitrary* symbolic reference
    points m_1..m_J (so every branch of the draft's ``if m_j > m`` is covered) and check
    N_J / Z_J = sum_i e^{l_i} v_i / sum_i e^{l_i}. Returns the simplified residuals (0 when verified)."""
    import sympy as sp
    J = len(sizes)
    ms = sp.symbols(f"m1:{J + 1}", real=True)
    ls, vs = [], []
    Z, N, m_prev = sp.Integer(0), sp.Integer(0), None
    for j, L in enumerate(sizes):
        l = sp.symbols(f"l{j}_0:{L}", real=True) if L else ()
        v = sp.symbols(f"v{j}_0:{L}", real=True) if L else ()
        ls += list(l)
        vs += list(v)
        scale = sp.exp(m_prev - ms[j]) if m_prev is not None else sp.Integer(0)
        Z = Z * scale + sum((sp.exp(li - ms[j]) for li in l), sp.Integer(0))
        N = N * scale + sum((sp.exp(li - ms[j]) * vi for li, vi in zip(l, v)), sp.Integer(0))
        m_prev = ms[j]
    Zref = sum(sp.exp(li) for li in ls)
    Nref = sum(sp.exp(li) * vi for li, vi in zip(ls, vs))
    rz = sp.simplify(sp.expand(sp.powsimp(sp.expand(Z * sp.exp(ms[-1]) - Zref))))
    rn = sp.simplify(sp.expand(sp.powsimp(sp.expand(N * sp.exp(ms[-1]) - Nref))))
    return dict(sizes=tuple(sizes), residual_Z=rz, residual_N=rn, verified=(rz == 0 and rn == 0))


# -- SUB.cost -----------------------------------------------------------------------------------------------

def cost_model(T: int, d: int, r: int, r_v: int, *, J: int = 1, ell_k: int = 0, ell_v: int = 0,
               bytes_per_float: int = 4) -> dict:
    """Per-token, per-head cost of one decode step (Subspace-FD-draft Secs. 4, 9), term by term (a multiply-add counts 2 flops).

    exact attention (K q, scale, max, subtract, exp, sum, w^T V, divide):
        flops 4 T d + 5 T + d;  bytes read/written: (2 T d + d) in, d out.
    coefficient space with J chunks (B_j q, scale, C_j q~, max, subtract, exp, sum, w^T D_j, sum_j n_j E_j, divide):
        flops 2 T (r + r_v) + 2 J (r + r_v) d + J r + 4 T + d;  bytes: (T (r + r_v) + J (r + r_v) d + d) in, d out.
    FD updates (amortised, per token): shape d (ell_k + ell_v) (the draft's O(d ell); measured, not counted).
    The draft's Sec. 9 FLOP shape, T (r + r_v) + (r + r_v) d + d (ell_k + ell_v), omits the factor J on the basis
    term (each decode step projects q onto, and reconstructs from, all J chunk bases); its byte shape has it.
    """
    R = r + r_v
    base_flops = 4 * T * d + 5 * T + d
    ours_flops = 2 * T * R + 2 * J * R * d + J * r + 4 * T + d
    base_bytes = bytes_per_float * (2 * T * d + 2 * d)
    ours_bytes = bytes_per_float * (T * R + J * R * d + 2 * d)
    return dict(
        baseline_flops=base_flops, ours_flops=ours_flops, baseline_bytes=base_bytes, ours_bytes=ours_bytes,
        flops_ratio=ours_flops / base_flops, bytes_ratio=ours_bytes / base_bytes, leading_ratio=R / (2 * d),
        overhead_flops_ratio=(ours_flops - 2 * T * R) / base_flops,
        fd_update_shape=d * (ell_k + ell_v),
        draft_flops_shape=T * R + R * d + d * (ell_k + ell_v), draft_bytes_shape=T * R + J * R * d,
        baseline_shape=T * d,
    )


def decode_time_model(T: int, d: int, r: int, r_v: int, *, J: int = 1, s_per_byte_exact: float,
                      s_per_byte_ours: float, s_per_exp: float, s_per_pass: float, call_s_exact: float = 0.0,
                      call_s_ours: float = 0.0, bytes_per_float: int = 4) -> dict:
    """Seconds of one decode step on one CPU core, exact and coefficient-space, from :func:`cost_model`'s byte
    counts plus the terms its FLOP/byte ratio leaves out (benchmarks/bench_fd.py (b) measures every constant
    separately, on micro-kernels, never on the decodes themselves; the constants are machine properties,
    [measured], none is fitted to the decode's time).

    Why the byte ratio alone is not the time ratio (both are measured in bench_fd (b)):
      * the exponential: :func:`cost_model` counts exp as 1 flop, but np.exp on float32 costs ``s_per_exp`` per
        value (measured 1.9-3.2 ns on the loaded 2-core dev VM, as long as streaming ~30 bytes of the cache at
        the measured GEMV rate, i.e. ~7 floats: not 1 flop's worth). Both sides take T exponentials, so the term
        adds the same time to both and pulls the ratio towards 1: at T = 16384, d = 64, r + r_v = 32 (bench_fd (b))
        the exponentials took ~30-50 us against ~150-190 us for streaming the coefficient cache and ~550-700 us
        for the exact step's stream, which alone moves the time ratio from the byte ratio 0.28 to ~0.32;
      * the passes over the T logits (max, subtract, sum; exact also scales): ``s_per_pass`` per value and pass,
        3 passes for :func:`kvbounds.algorithms.subspace_decode.coefficient_decode`, 4 for the exact step;
      * the streaming rate depends on the working set: the exact step streams 2 T d floats, the coefficient step
        T (r + r_v) + J (r + r_v) d (4x fewer here), which may sit in a faster cache level; ``s_per_byte_exact``
        and ``s_per_byte_ours`` are GEMV times per byte measured on matrices of each side's size (the exact
        step's kernels, rows of d floats; on the dev VM both rates came out equal, ~65-90 ps per byte). The
        coefficient kernels stream rows of L floats and ran up to ~1.7x faster per byte than that (bench_fd's
        C/D parts), so the model is pessimistic for ours where the cache term dominates: measured / model was
        0.9-1.0 at J = 32 and 0.7-0.76 at J = 1 (one chunk of 16384 tokens);
      * the per-call cost (Python, argument checks, ~10 numpy dispatches): ``call_s_*``, each side's decode
        timed on a 1-token cache.

        t = bytes * s_per_byte + T (s_per_exp + passes * s_per_pass) + call_s

    Returns the two times, each term, and ``ratio`` = t_ours / t_exact."""
    m = cost_model(T, d, r, r_v, J=J, bytes_per_float=bytes_per_float)
    terms = {}
    for side, nbytes, s_byte, passes, call in (("exact", m["baseline_bytes"], s_per_byte_exact, 4, call_s_exact),
                                               ("ours", m["ours_bytes"], s_per_byte_ours, 3, call_s_ours)):
        terms[side] = dict(stream=nbytes * s_byte, exp=T * s_per_exp, passes=T * passes * s_per_pass, call=call)
    t_exact, t_ours = (sum(terms[k].values()) for k in ("exact", "ours"))
    return dict(exact_s=t_exact, ours_s=t_ours, ratio=t_ours / t_exact, terms=terms,
                bytes_ratio=m["bytes_ratio"], flops_ratio=m["flops_ratio"])


# -- SUB.lowrank helper ---------------------------------------------------------------------------------

def energy_at_rank(X, r: int) -> float:
    """Fraction of ||X||_F^2 captured by the top-r singular values of X (n, d): sum_{i<=r} s_i^2 / sum_i s_i^2
    (1.0 once r >= rank X). Bad input (not 2-D, empty, NaN/Inf, negative r, X = 0) raises InputError."""
    check_array(X, "X", ndim=2, min_rows=1)
    if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 0:
        raise InputError(f"r must be a non-negative integer, got {r!r}")
    s2 = np.linalg.svd(np.asarray(X, dtype=np.float64), compute_uv=False) ** 2
    total = float(s2.sum())
    if total == 0:
        raise InputError("energy_at_rank: X is zero (no energy to capture)")
    return float(s2[:r].sum() / total)

"""MergeAndReduce (BalanceKV-NeurIPS Alg. 4, Thm 3.4) run R times in lockstep on one stream: R independent coin
streams, one pass over the keys and values, the Gram panels of each reduction shared by the R runs.

Claim served: MR.error (its scale sweep: the rate past the walk's onset needs many runs per stream, and R
separate runs would form every Gram R times). Each run is Alg. 4 with SoftmaxBalance's walk (Alg. 2 / 3) at the
paper's c = 30 log(max(t, |C^i|)/delta), r_value the largest value norm of the cell being reduced, the coins drawn per
reduction from the run's own Generator in the order :class:`kvbounds.algorithms.merge_and_reduce.MergeAndReduce`
draws them, so run r equals ``MergeAndReduce(..., rng=rngs[r])`` step for step (up to the summation order of the
walk's inner products: a sign differs only where a coin lands within rounding of its threshold).

A level-i cell holds, in every run, tokens of the same last 2^i batches, but not the same ones: the walk on it runs
over that span of the stream with a membership mask per run (:func:`masked_walk`): run r's Gram is the span's Gram
restricted to its members, so the panels are formed once and each run's signs reach the later steps through one
matrix product with the non-members' signs set to 0.
"""
from __future__ import annotations

import math

import numpy as np

from kvbounds.algorithms.arrays import array_namespace, like, to_numpy, device as _device

from .host_scratch import exp_inplace
from .self_balancing_walk import walk_constant
from .softmax_balance import _row_major as row_major
from .validation import InputError, check_array, check_positive, check_probability

__all__ = ["masked_walk", "merge_and_reduce_lockstep"]

PANEL, CHUNK = 64, 2048


def masked_walk(K, V, member, uniforms, c, *, r_key: float, r_value, scale: float, panel: int = PANEL,
                chunk: int = CHUNK):
    """The self-balancing walk of SoftmaxBalance (Alg. 2 lines 5-11, paper's test eta_i = +1 iff u_i < 1/2 -
    x_i/(2c)) for R runs at once over the rows of K (n, d), V (n, s), run r on the rows where ``member[r]`` (R, n) is
    True, in row order, with its own coins ``uniforms[r]``, constant ``c[r]`` and value radius ``r_value[r]``
    (x_i = sum_{j<i members} eta_j exp((<k_i,k_j> - r_key^2) scale) <v_i,v_j> / r_value^2). Returns the signs
    (R, n): +-1 on members, 0 elsewhere (a numpy array)."""
    xp = array_namespace(K, V)
    n = K.shape[0]
    R = member.shape[0]
    m = min(panel, n)
    mem = like(member.astype(np.float64), K)
    # x_i < c (1 - 2u_i) in the normalised units is s_i < c r_value^2 (1 - 2u_i) in the Gram's own
    thr = like(np.asarray(c, float)[:, None] * np.asarray(r_value, float)[:, None] ** 2 * (1.0 - 2.0 * uniforms), K)
    s = xp.zeros((R, n), dtype=K.dtype, device=_device(K))
    KT, VT = row_major(xp.matrix_transpose(K)), row_major(xp.matrix_transpose(V))
    cols = []
    for start in range(0, n, m):
        w = min(m, n - start)
        Kw, Vw = K[start:start + w], V[start:start + w]
        P = _block(xp, Kw, Vw, KT[:, start:start + w], VT[:, start:start + w], r_key, scale)
        etas = []
        for l in range(w):
            i = start + l
            eta = xp.where(s[:, i] < thr[:, i], mem[:, i], -mem[:, i])          # 0 for a non-member
            etas.append(eta)
            if l + 1 < w:
                s[:, i + 1:start + w] += eta[:, None] * P[l, l + 1:w]
        E = xp.stack(etas, axis=-1)                                              # (R, w)
        cols.append(E)
        for c0 in range(start + w, n, chunk):
            c1 = min(n, c0 + chunk)
            s[:, c0:c1] += xp.matmul(E, _block(xp, Kw, Vw, KT[:, c0:c1], VT[:, c0:c1], r_key, scale))
    return to_numpy(xp.concat(cols, axis=-1))


def _block(xp, Ka, Va, KT, VT, r_key, scale):
    """exp((<k_a, k_b> - r_key^2) scale) <v_a, v_b> for rows Ka, Va against the transposed columns KT, VT."""
    P = xp.matmul(Ka, KT)
    P -= r_key ** 2
    P *= scale
    P = exp_inplace(xp, P)
    P *= Va * VT if Va.shape[-1] == 1 else xp.matmul(Va, VT)
    return P


def merge_and_reduce_lockstep(K, V, *, t: int, T: int, delta: float, rngs, r_key: float, scale: float | None = None,
                              signs: str = "walk"):
    """Alg. 4 on the stream K (n, d), V (n, s) for len(rngs) runs in lockstep. Returns ``levels``: {j: (R, j) int8}
    at every j = t, 2t, ... (after the reductions of step j): the level i of each token's cell C^i (its weight 2^i),
    -1 for a token a reduction dropped. Between two such steps the new tokens sit in C^0 with weight 1.
    ``signs="random"``: fair coins from the same uniforms instead of the walk (the ingredient's ablation)."""
    check_array(K, "K", ndim=2)
    check_array(V, "V", ndim=2)
    n, d = K.shape
    check_positive(t, "t", integer=True)
    if t < 2 or t % 2:
        raise InputError(f"batch size t must be an even integer >= 2, got {t}")
    if not isinstance(T, int) or T < 1:
        raise InputError(f"T must be an integer >= 1, got {T!r}")
    check_probability(delta, "delta")
    if signs not in ("walk", "random"):
        raise InputError(f"signs must be 'walk' or 'random', got {signs!r}")
    R = len(rngs)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    level = np.full((R, n), -2, dtype=np.int8)                 # -2: not seen yet
    vnorm = np.linalg.norm(to_numpy(V), axis=1)
    out = {}
    for k in range(1, n // t + 1):
        level[:, (k - 1) * t:k * t] = 0
        p, i = k, 0
        while i < T:
            _reduce(K, V, level, i, t, delta, rngs, r_key, scale, vnorm, signs)
            i += 1
            if p % 2:
                break
            p //= 2
        out[k * t] = level[:, :k * t].copy()
    return out


def _reduce(K, V, level, i, t, delta, rngs, r_key, scale, vnorm, signs):
    """Every run's cell C^i (level == i) halved into C^{i+1}: the walk on the span of the cells, masked per run."""
    member = level == i
    cols = np.flatnonzero(member.any(axis=0))
    if cols.size == 0:
        return
    lo, hi = int(cols[0]), int(cols[-1]) + 1
    sub = member[:, lo:hi]
    sizes = sub.sum(axis=1)
    U = np.zeros(sub.shape)
    for r, rng in enumerate(rngs):                              # each run's coins, as MergeAndReduce draws them
        if sizes[r]:
            U[r, sub[r]] = rng.random(int(sizes[r]))
    if signs == "random":
        eta = np.where(U < 0.5, 1.0, -1.0) * sub
    else:
        c = np.array([walk_constant(max(t, int(m)), delta) for m in sizes])
        rv = np.array([vnorm[lo:hi][row].max() if row.any() else 1.0 for row in sub])
        eta = masked_walk(K[lo:hi], V[lo:hi], sub, U, c, r_key=r_key, r_value=rv, scale=scale)
    plus = (eta > 0).sum(axis=1, keepdims=True)
    keep = np.where(2 * plus <= sizes[:, None], eta > 0, eta < 0) & sub       # the smaller side (Alg. 3 12-16)
    block = level[:, lo:hi]
    block[sub & keep] = i + 1
    block[sub & ~keep] = -1

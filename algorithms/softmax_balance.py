"""SoftmaxBalance (BalanceKV-NeurIPS Alg. 2, Thm 3.3; BalanceKV-preprint Alg. 2, Thm 3.2).

Claims: SB.discrepancy, SB.cost.

The walk of Alg. 3 run in the feature space of phi(k) (x) v, where <phi(k_i) (x) v_i, phi(k_j) (x) v_j>
= exp(<k_i, k_j>/sqrt d) <v_i, v_j> (the kernel identity, claim SBW.kernel-identity). Alg. 2 line 2
sets R = exp(r_key^2 / (2 sqrt d)) r_value and compares y^T eta with c R^2. We never form R or y:
the walk only needs y / R^2, whose entries are

    exp((<k_i, k_j> - r_key^2) / sqrt d) * <v_i, v_j> / r_value^2,

and the exponent is <= 0 because |<k_i, k_j>| <= r_key^2. So key norms of 50+ at d = 64 (R^2 ~ e^312)
neither overflow nor lose the walk's decisions.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from kvbounds.algorithms.arrays import array_namespace, like, to_numpy, device as _device

from .host_scratch import exp_inplace, host_empty, native, on_host
from .host_values import host_floats
from .self_balancing_walk import WalkResult, gram_walk_unchecked, smaller_side, walk_constant
from .validation import (InputError, check_array, check_choice, check_positive, check_probability, check_rng,
                         check_scale, namespace)

MEMORY_MODES = ("gram", "rows", "panel")
ON_FAIL = ("raise", "continue")
PANEL = 64          # columns per Gram panel of memory="panel"
PANEL_CHUNK = 2048  # the panel's later columns formed this many at a time (64 x 2048 floats: 1 MiB in float64)


@dataclasses.dataclass
class SoftmaxBalanceResult:
    keep: Any            # (..., n) bool mask of C' (|C'| <= |C|/2)
    signs: Any           # (..., n) the walk's eta in {+1, -1}
    walk: WalkResult
    r_key: float
    r_value: float
    c: float


def normalized_kernel_gram(K, V, r_key: float, r_value: float, *, scale: float | None = None):
    """y / R^2 of Alg. 2 line 6 for all pairs, (..., n, n); overflow-free for any key norms."""
    xp = _check_kv(K, V)
    scale = check_scale(scale, K.shape[-1])
    _check_radii(r_key, r_value, scale, K)
    kmax = float(xp.max(xp.linalg.vector_norm(K, axis=-1)))
    vmax = float(xp.max(xp.linalg.vector_norm(V, axis=-1)))
    if not (kmax <= r_key * (1 + 1e-12) and vmax <= r_value * (1 + 1e-12)):
        raise InputError(f"radii below the data: max||k|| = {kmax:.6g} (r_key = {r_key}), "
                         f"max||v|| = {vmax:.6g} (r_value = {r_value}); the exponent must be <= 0")
    return _kernel_gram(xp, K, V, r_key, r_value, scale)


def _kernel_gram(xp, K, V, r_key, r_value, scale):
    KK = xp.matmul(K, xp.matrix_transpose(K))
    VV = xp.matmul(V, xp.matrix_transpose(V))
    return xp.exp((KK - r_key**2) * scale) * (VV / r_value**2)


def _check_kv(K, V, finite: bool = True):
    check_array(K, "K", ndim=tuple(range(2, 8)), min_rows=1, finite=finite)
    check_array(V, "V", ndim=K.ndim, finite=finite)
    if tuple(V.shape[:-1]) != tuple(K.shape[:-1]):
        raise InputError(f"K and V must agree in all but the last dimension, got {tuple(K.shape)} and {tuple(V.shape)}")
    return namespace(K, V, names="K and V")


def _check_radii(r_key, r_value, scale: float, K) -> None:
    check_positive(r_key, "r_key", allow_zero=True)
    check_positive(r_value, "r_value")
    if not (math.isfinite(float(r_key) * float(r_key)) and math.isfinite(float(r_value) * float(r_value))):
        raise InputError(f"r_key = {r_key!r} / r_value = {r_value!r} too large: r^2 (hence the Gram matrix) overflows")
    # the exponent (<k_i, k_j> - r_key^2) scale is <= 0 up to a rounding of ~ (d + 2) eps r_key^2 scale; past ~80
    # that rounding alone can overflow exp
    if float(r_key) ** 2 * scale * (K.shape[-1] + 2) * float(array_namespace(K).finfo(K.dtype).eps) > 80.0:
        raise InputError(f"r_key = {r_key!r} too large for {K.dtype}: the Gram exponent's rounding could overflow exp")


def softmax_balance(K, V, *, delta: float, rng: np.random.Generator, r_key: float | None = None,
                    r_value: float | None = None, n: int | None = None, scale: float | None = None,
                    on_fail: str = "raise", repeats: int | None = None, c: float | None = None,
                    memory: str = "gram", uniforms=None) -> SoftmaxBalanceResult:
    """Alg. 2 on keys ``K`` (..., n, d) and values ``V`` (..., n, s); batched over leading dimensions.

    ``r_key``/``r_value`` default to the largest norms present (Alg. 2 line 1 only needs upper bounds);
    ``n`` is the stream-length bound in c = 30 log(n/delta), default the number of rows; ``c`` overrides
    that constant (for experiments with a practical walk; FAIL then becomes likelier).
    ``memory="gram"`` materialises the n x n Gram matrix (fastest for small n); ``memory="rows"`` computes the
    row y of line 6 at each step from the stored pairs, the O((d+s) n) memory of Thm 3.3 (claim SB.cost);
    ``memory="panel"`` computes the Gram's lower triangle in column panels of ``PANEL`` columns, shared by
    all repeats, and moves a panel's signs into the later steps with one matrix product: O((m + repeats) n)
    memory, the path for n in the 10^5 range (the ``gpu`` profile of SB.discrepancy and MR.error). All three
    give the same signs for the same ``rng`` up to the summation order of x (a sign differs only where a
    uniform lands within rounding of its threshold).
    ``repeats``: run that many independent walks on the same data (a leading axis on the outputs;
    the Gram matrix is computed once and shared). Returns the mask of C', the smaller side of the
    signs (lines 12-16). ``on_fail``: "raise" (WalkFailed) or "continue" (clip, record the event); the choices
    ``on_fail`` and ``memory`` are checked before any work, also when the walk would not fail.
    ``uniforms``: the walk's coins (Alg. 3 line 8), a numpy array of the walks' shape ((repeats,) + K's without
    its last axis) in [0, 1), instead of drawing them from ``rng`` (which may then be None): the scale sweeps of
    SB.discrepancy run the walk on nested prefixes of one stream with the prefixes of one set of coins (common
    random numbers: each size's walk is the theorem's walk, and the sizes of one stream share their randomness)."""
    check_choice(on_fail, "on_fail", ON_FAIL)
    check_choice(memory, "memory", MEMORY_MODES)
    xp = _check_kv(K, V, finite=False)
    check_probability(delta, "delta")
    if uniforms is None:
        check_rng(rng)
    rows = K.shape[-2]
    # finiteness and the largest norms in one host read (on a GPU each read waits for the device)
    fin_k, fin_v, kmax, vmax = host_floats(xp, xp.all(xp.isfinite(K)), xp.all(xp.isfinite(V)),
                                            xp.max(xp.linalg.vector_norm(K, axis=-1)),
                                            xp.max(xp.linalg.vector_norm(V, axis=-1)))
    for ok, name in ((fin_k, "K"), (fin_v, "V")):
        if not ok:
            raise InputError(f"{name} contains NaN or Inf")
    r_key = kmax if r_key is None else r_key
    r_value = (vmax if vmax > 0 else 1.0) if r_value is None else r_value
    _check_radii(r_key, r_value, check_scale(scale, K.shape[-1]), K)
    r_key, r_value = float(r_key), float(r_value)       # an int radius (10**30) overflows a torch scalar
    if kmax > r_key * (1 + 1e-12) or vmax > r_value * (1 + 1e-12):
        raise InputError(f"radii below the data: max||k|| = {kmax:.6g} (r_key = {r_key}), "
                         f"max||v|| = {vmax:.6g} (r_value = {r_value})")
    n = rows if n is None else n
    check_positive(n, "n", integer=True)
    if n < rows:
        raise InputError(f"stream-length bound n = {n} is below the number of rows {rows}")
    c = walk_constant(n, delta) if c is None else float(c)
    check_positive(c, "c")
    batch = tuple(K.shape[:-1])
    if repeats is not None:
        check_positive(repeats, "repeats", integer=True)
        batch = (repeats,) + batch
    if uniforms is None:
        uniforms = rng.random(batch)
    elif not (isinstance(uniforms, np.ndarray) and uniforms.shape == batch and uniforms.dtype == np.float64
              and bool(np.all((uniforms >= 0) & (uniforms < 1)))):
        raise InputError(f"uniforms must be a float64 numpy array of shape {batch} with entries in [0, 1), got "
                         f"{type(uniforms).__name__} {getattr(uniforms, 'dtype', '')} {getattr(uniforms, 'shape', '')}")
    uniforms = like(uniforms, K)
    if memory == "rows":
        walk = _row_walk(K, V, r_key, r_value, uniforms, c, scale, on_fail)
    elif memory == "panel":
        walk = _panel_walk(K, V, r_key, r_value, uniforms, c, check_scale(scale, K.shape[-1]), on_fail)
    else:        # the checks above cover normalized_kernel_gram's and gram_walk's: their unchecked cores
        G = _kernel_gram(xp, K, V, r_key, r_value, check_scale(scale, K.shape[-1]))
        if repeats is not None:
            G = xp.broadcast_to(G, batch + (rows,))
        walk = gram_walk_unchecked(G, uniforms, c, on_fail)
    return SoftmaxBalanceResult(smaller_side(walk.signs), walk.signs, walk, r_key, r_value, c)


def _row_walk(K, V, r_key, r_value, uniforms, c, scale, on_fail) -> WalkResult:
    """Alg. 2 lines 5-11 literally: y_i = exp(<k_i,k_j>/sqrt d) <v_i,v_j> / R^2 for i < j, x = y^T eta."""
    from .self_balancing_walk import walk_choose, walk_finish
    xp = array_namespace(K, V)
    scale = 1.0 / math.sqrt(K.shape[-1]) if scale is None else scale
    n = K.shape[-2]
    eta = xp.zeros(uniforms.shape, dtype=K.dtype, device=_device(K))
    fails, ratios = [], []
    for j in range(n):
        kj, vj = K[..., j:j + 1, :], V[..., j:j + 1, :]
        y = xp.exp((xp.sum(K[..., :j, :] * kj, axis=-1) - r_key**2) * scale) * (
            xp.sum(V[..., :j, :] * vj, axis=-1) / r_value**2)
        x = xp.sum(y * eta[..., :j], axis=-1)
        fail, e = walk_choose(xp, x, uniforms[..., j], c)
        eta[..., j] = e
        fails.append(fail)
        ratios.append(xp.abs(x) / c)
    return walk_finish(xp, eta, fails, ratios, on_fail, scale=c)



def _gram_block(xp, Ka, Va, KT, VT, r_key, r_value, scale, scratch=None):
    """Entries (a, b) of y / R^2 for the rows Ka (..., w, d), Va (..., w, s) against the columns KT (..., d, c),
    VT (..., s, c) (keys and values transposed): exp((<k_a, k_b> - r_key^2) scale) <v_a, v_b> / r_value^2, the
    entries of :func:`normalized_kernel_gram` by the same operations (for s = 1 the value product is the one
    product v_a v_b, formed by broadcasting: a matrix product with an inner dimension of 1 costs three times more).
    ``scratch``: None, or two flat host arrays (numpy, torch CPU) the block is written into instead of fresh
    memory (a fresh 1 MiB block costs ~256 page faults, as much as forming it)."""
    nat = native(Ka) if scratch is not None else None
    if nat is None:
        P = xp.matmul(Ka, KT)
        W = Va * VT if Va.shape[-1] == 1 else xp.matmul(Va, VT)
    else:
        shape = tuple(Ka.shape[:-1]) + (KT.shape[-1],)
        size = math.prod(shape)
        P, W = xp.reshape(scratch[0][:size], shape), xp.reshape(scratch[1][:size], shape)
        nat.matmul(Ka, KT, out=P)
        if Va.shape[-1] == 1:
            nat.multiply(Va, VT, out=W)
        else:
            nat.matmul(Va, VT, out=W)
    P -= r_key**2
    P *= scale
    P = exp_inplace(xp, P)
    W /= r_value**2
    P *= W
    return P


def _row_major(x):
    """x laid out row by row (a transposed view copied): its column chunks are then read from contiguous rows (a
    matrix product with the transposed view itself ran 2.5x slower at d = 4)."""
    nat = native(x)
    if nat is np:
        return np.ascontiguousarray(x)
    return x.contiguous() if nat is not None else array_namespace(x).asarray(x, copy=True)


def _panel_walk(K, V, r_key, r_value, uniforms, c, scale, on_fail, panel: int | None = None,
                chunk: int | None = None) -> WalkResult:
    """Alg. 2 lines 5-11 on Gram panels: rows start..start+m-1 of y / R^2 from column start on, computed from
    K and V when the walk reaches them (the same entries as :func:`normalized_kernel_gram`). Inside a panel
    each step updates the panel's own m entries of s (s_j = sum_{i<j chosen} eta_i G[i, j]); the panel's m
    signs then reach every later s_j through one product (repeats x m) @ (m x ``chunk``) per chunk of columns,
    the panel formed ``chunk`` columns at a time (``PANEL_CHUNK``: m x chunk floats stay in the cache while they
    are formed, exponentiated and used, where the whole m x n panel, 74 MB at n = 1.44e5, went through memory
    four times; each s_j gets the same m products as before). With repeats the signs are laid out (..., repeats,
    m), so that the product is one matrix product per block, not a vector product per repeat (2x faster at 32
    repeats). s_i is final once step i reads it, so the FAIL flags and |x|/c are read off s at the end."""
    from .self_balancing_walk import walk_finish_np
    xp = array_namespace(K, V)
    n = K.shape[-2]
    m = min(PANEL if panel is None else panel, n)
    width = PANEL_CHUNK if chunk is None else chunk
    reps = uniforms.ndim > K.ndim - 1                                  # a leading repeats axis on the walks
    KT, VT = _row_major(xp.matrix_transpose(K)), _row_major(xp.matrix_transpose(V))   # (..., d, n), (..., s, n)
    size = math.prod(tuple(K.shape[:-2])) * m * max(m, width)
    scratch = (host_empty(K, size), host_empty(K, size)) if on_host(K) else None
    s = xp.zeros(tuple(uniforms.shape), dtype=K.dtype, device=_device(K))
    s_rows = xp.moveaxis(s, 0, -2) if reps else s[..., None, :]      # a view of s: (..., repeats or 1, n)
    one = xp.ones_like(s[..., 0])
    neg = -one
    cols = []
    for start in range(0, n, m):
        w = min(m, n - start)
        Kw, Vw = K[..., start:start + w, :], V[..., start:start + w, :]
        P = _gram_block(xp, Kw, Vw, KT[..., start:start + w], VT[..., start:start + w], r_key, r_value, scale)
        etas = []
        for l in range(w):
            i = start + l
            eta = xp.where(uniforms[..., i] < 0.5 - s[..., i] / (2.0 * c), one, neg)   # p clipped: same test
            etas.append(eta)
            if l + 1 < w:
                s[..., i + 1:start + w] += eta[..., None] * P[..., l, l + 1:w]
        E = xp.stack(etas, axis=-1)                                                  # (reps, ..., w)
        cols.append(E)
        Er = xp.moveaxis(E, 0, -2) if reps else E[..., None, :]                      # (..., reps or 1, w)
        for c0 in range(start + w, n, width):
            c1 = min(n, c0 + width)
            Pc = _gram_block(xp, Kw, Vw, KT[..., c0:c1], VT[..., c0:c1], r_key, r_value, scale, scratch)
            s_rows[..., c0:c1] += xp.matmul(Er, Pc)
    ratio = xp.abs(s) / c
    return walk_finish_np(xp.concat(cols, axis=-1), to_numpy(ratio > 1.0), to_numpy(ratio), on_fail, c)


def signed_kernel_sum(K, V, signs, q, *, scale: float | None = None):
    """sum_i eta_i exp(<k_i, q> * scale) v_i computed as (shift m, vector u) with the sum = e^m u.

    The left side of Thm 3.3 is ||e^m u||; returning the shift keeps it finite for large norms."""
    _check_kv(K, V)
    check_array(signs, "signs", ndim=K.ndim - 1)
    check_array(q, "q", ndim=1, last_dim=K.shape[-1])
    if tuple(signs.shape) != tuple(K.shape[:-1]):
        raise InputError(f"signs must have shape {tuple(K.shape[:-1])}, got {tuple(signs.shape)}")
    xp = namespace(K, V, q, signs, names="K, V, q and signs")
    scale = check_scale(scale, K.shape[-1])
    with np.errstate(over="ignore", invalid="ignore"):
        logits = xp.matmul(K, q) * scale
        m = xp.max(logits, axis=-1, keepdims=True)
    if not bool(xp.all(xp.isfinite(m))):
        raise InputError("the largest logit <k, q> * scale overflows the float range: e^m u is not representable")
    w = xp.exp(logits - m) * signs
    return m[..., 0], xp.sum(w[..., None] * V, axis=-2)

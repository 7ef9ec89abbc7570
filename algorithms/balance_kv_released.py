"""BalanceKV as its authors ran it: the walk of the released code, beside the pseudocode variant.

Claims: BKV.vs-uniform, BKV.ablation (BalanceKV-NeurIPS: "Streaming Attention Approximation via
Discrepancy Theory", arXiv 2502.07861, NeurIPS 2025 version, Sec. 4.1, Fig. 1/3, App. B). The paper's App. B
describes blockwise BalanceKV as Alg. 2 (SoftmaxBalance) run per block of b tokens followed by a strict halving
(:mod:`kvbounds.algorithms.blockwise_balance_kv`). The authors' public code (repository ksheth96/BalanceKV,
``src/balanced_walk.py``: ``balanced_walk``; ``src/llama_forward.py``: the decode estimator;
``run_longbench.py``: defaults; ``src/single_layer_approx.ipynb``: the single-layer experiment of
Fig. 1/3) runs a different walk. This module is our own implementation of what that code does:

per level t = 1..T, on the m tokens still kept (in the order the previous level left them):

1. pad with zero rows to a multiple of b, reshape to blocks (..., m_pad/b, b, d);
2. centre the keys per block: k~ = k - mean(block), the mean *including* the zero padding rows
   (``center=False`` switches this off);
3. kernel  K_ij = exp(temp <k~_i, k~_j>/sqrt d - beta) * (<w_i v_i, w_j v_j> + kernel_const + 1e-8)
   with w the token weights accumulated by earlier levels (1 at the first level; ``carry_weights=False``
   uses v alone); padded rows have k = 0, v = 0 but are not masked out (their kernel rows are
   exp(.)(kernel_const + 1e-8), so they do move the walk, as in the released code);
4. walk: eta_0 = +1 in every block; for i >= 1, p_i = 1/2 - gamma sum_{j<i} K_ij eta_j and eta_i = +1 iff
   u_i < p_i (so p is effectively clipped to [0, 1]); gamma = 4 in the released code, with no c or R^2
   normalisation: p is almost always 0 or 1, a nearly greedy walk. ``walk_c=c`` replaces gamma by the
   theory's normalisation 1/(2 c R^2), R^2 = max_i K_ii of the block (Alg. 2's p = 1/2 - x/(2c));
5. selection: one cut over the whole row of m signs: c = max(first index where #(-1) reaches m//2, first
   index where #(+1) reaches m//2) (an argmax over "never" is 0, as in torch); tokens at or before c
   whose sign differs from eta_c get weight 2, the others at or before c weight -2, every token after c
   weight 1; a stable sort by decreasing weight keeps the first m//2 (weight-2 tokens in order, then
   weight-1 tokens in order: the next level's block order). Weights multiply across levels.

The estimator at decode (``llama_forward.py``): kept middle tokens' values are multiplied by w / 2^T and
their logits get a bias log 2^T; the first ``sink`` and last ``window`` tokens are exact. So the numerator
weights token i by w_i and the denominator by 2^T: ``log_w_num = log w``, ``log_w_den = T log 2``
(``estimator="released"``). The weights of a level sum to c + 1 <= m, not to m, so that estimator is not
a ratio of two consistent sums; ``estimator="consistent"`` uses log w in both, ``"unweighted"`` T log 2 in both.
One selection per KV head, shared by the query heads of its group (GQA): pass the KV heads, and expand
with :func:`expand_groups`.

Randomness: per level one array of uniforms of shape (batch, blocks, b), drawn by ``uniforms(shape)``
when given (e.g. ``lambda s: torch.rand(s, generator=g)`` to replay the released code's draws exactly),
else by the numpy ``rng`` and moved to K's backend; so a seed gives the same signs on every backend
(up to float rounding of the walk's sums).
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from kvbounds.algorithms.arrays import array_namespace, like, to_numpy, device as _dev

from .attention import shifted_logits
from .blockwise_balance_kv import check_block, check_kv, check_levels, gather_dev
from .self_balancing_walk import walk_constant
from .validation import (InputError, check_array, check_choice, check_indices, check_int, check_positive, check_real,
                         check_scale, namespace)

__all__ = ["KERNEL_EPS", "ESTIMATORS", "RELEASED_DEFAULTS", "FIGURE_TEMP", "OVERFLOW", "cut_weights", "released_select",
           "released_log_weights", "compress_cache_released", "expand_groups", "split_weighted_attention",
           "theory_walk_c"]

KERNEL_EPS = 1e-8          # the released kernel's additive 1e-8
ESTIMATORS = ("released", "consistent", "unweighted")
RELEASED_DEFAULTS = dict(gamma=4.0, temp=1.0, beta=0.0, kernel_const=0.025)   # run_longbench.py
FIGURE_TEMP = 0.1          # single_layer_approx.ipynb (Fig. 1/3) calls its experiment with temp = 0.1


def _draw(rng, uniforms, shape, ref):
    if uniforms is not None:
        u = uniforms(shape)
        xp = array_namespace(ref)
        if array_namespace(u) is not xp:
            return like(to_numpy(u), ref)
        # same backend, maybe another device (a CPU torch.Generator's draws beside CUDA keys): move, keep the dtype
        return u if _dev(u) == _dev(ref) else xp.asarray(u, device=_dev(ref))
    return like(rng.random(shape), ref)


def _self_gram(X):
    """X X^T over the last two axes. numpy: a general product (BLAS gemm, the second operand transposed) with a
    copy of X as that operand: the same values bit for bit as with a transposed contiguous copy (the walk's
    kernels as they were before the layers were stacked), at about half the time; X with its own transpose would take numpy's
    symmetric product (syrk), whose sums differ in the last bits."""
    xp = array_namespace(X)
    if isinstance(X, np.ndarray):
        return np.matmul(X, np.swapaxes(X.copy(), -1, -2))
    return xp.matmul(X, xp.matrix_transpose(X))


OVERFLOW = ("raise", "float64")


def _walk(Kc, Wc, U, *, temp, beta, gamma, kernel_const, center, walk_c, diag_level, overflow="raise", groups=None):
    """Signs (B, nb, b) of the released walk on blocks Kc (B, nb, b, d), weighted values Wc (B, nb, b, s).
    ``overflow="float64"``: when the kernel overflows a narrower float, the level is evaluated in float64 (the
    recipe's exact value; the authors' code would carry Inf/NaN into p and set those signs to -1). ``groups``: the
    rows are independent groups of that many rows (layers of a stacked call, :mod:`.balance_layers`): a group whose
    kernel overflows is evaluated in float64 on its own, the others in K's dtype, as one call per group would."""
    xp = array_namespace(Kc)
    kw = dict(temp=temp, beta=beta, gamma=gamma, kernel_const=kernel_const, center=center, walk_c=walk_c,
              diag_level=diag_level)
    G, Kii, Kc0 = _kernel(Kc, Wc, temp=temp, beta=beta, kernel_const=kernel_const, center=center)
    finite = _finite_rows(xp, G, Kii)
    if bool(xp.all(finite)):
        return _signs(G, Kii, U, **kw)
    if overflow != "float64" or Kc.dtype == xp.float64:
        _overflow_error(xp, Kc0, temp, beta)
    f64 = lambda x: xp.astype(x, xp.float64)
    B = Kc.shape[0]
    if groups is not None and B > groups and isinstance(Kc, np.ndarray) and diag_level is None:
        ok = np.repeat(finite.reshape(-1, groups).all(axis=1), groups)
        signs = np.empty(U.shape, dtype=Kc.dtype)
        if ok.any():
            signs[ok] = _signs(G[ok], Kii[ok], U[ok], **kw)
        signs[~ok] = _walk_once(f64(Kc[~ok]), f64(Wc[~ok]), f64(U[~ok]), **kw).astype(Kc.dtype)
        return signs
    signs = _walk_once(f64(Kc), f64(Wc), f64(U), **kw)
    if diag_level is not None:
        diag_level["evaluated_in"] = f"float64 (the kernel overflows {Kc.dtype})"
    return xp.astype(signs, Kc.dtype)


def _kernel(Kc, Wc, *, temp, beta, kernel_const, center):
    """The released kernel of each block: G (B, nb, b, b), its diagonal K_ii from the vectors (B, nb, b), and the
    (centred) keys."""
    xp = array_namespace(Kc)
    d = Kc.shape[-1]
    if center:
        Kc = Kc - xp.mean(Kc, axis=-2, keepdims=True)
    with np.errstate(over="ignore", invalid="ignore"):
        if isinstance(Kc, np.ndarray) and all(type(c) in (int, float) for c in (temp, beta, kernel_const)):
            # the same operations in place (no fresh memory per operation; Python numbers keep G's dtype)
            G = _self_gram(Kc)
            if temp != 1.0:                     # x * 1.0 and x - 0.0 are x exactly: skipped
                G *= temp
            G /= math.sqrt(d)
            if beta != 0.0:
                G -= beta
            np.exp(G, out=G)
            W = _self_gram(Wc)
            W += kernel_const + KERNEL_EPS
            G *= W
        else:
            G = xp.exp(temp * _self_gram(Kc) / math.sqrt(d) - beta)
            G = G * (_self_gram(Wc) + (kernel_const + KERNEL_EPS))
    with np.errstate(over="ignore", invalid="ignore"):    # K_ii, from the vectors
        Kii = xp.exp(temp * xp.sum(Kc * Kc, axis=-1) / math.sqrt(d) - beta) \
            * (xp.sum(Wc * Wc, axis=-1) + (kernel_const + KERNEL_EPS))
    return G, Kii, Kc


def _finite_rows(xp, G, Kii):
    """(B,) bool: row b's kernel entries are all finite."""
    B = G.shape[0]
    return xp.all(xp.isfinite(xp.reshape(G, (B, -1))), axis=-1) & xp.all(xp.isfinite(xp.reshape(Kii, (B, -1))), axis=-1)


def _overflow_error(xp, Kc, temp, beta):
    # the released kernel exp(temp <k~_i, k~_j>/sqrt d - beta) has no normalisation: past float's range its
    # entries are Inf and inf - inf in the walk's sums is NaN (every sign would silently become -1)
    d = Kc.shape[-1]
    big = float(xp.max(xp.sum(Kc * Kc, axis=-1)))
    raise InputError(f"the released walk's kernel overflows {Kc.dtype}: temp * max ||k - mean||^2 / sqrt(d) - beta"
                     f" = {temp * big / math.sqrt(d) - beta:.3g} (or the value Gram overflows); rescale K and V, "
                     f"lower temp, or pass overflow='float64'")


def _walk_once(Kc, Wc, U, *, temp, beta, gamma, kernel_const, center, walk_c, diag_level):
    xp = array_namespace(Kc)
    G, Kii, Kc0 = _kernel(Kc, Wc, temp=temp, beta=beta, kernel_const=kernel_const, center=center)
    if not bool(xp.all(_finite_rows(xp, G, Kii))):
        _overflow_error(xp, Kc0, temp, beta)
    return _signs(G, Kii, U, gamma=gamma, walk_c=walk_c, diag_level=diag_level)


def _signs(G, Kii, U, *, gamma, walk_c, diag_level, **_):
    """The sequential walk on finite kernels G (B, nb, b, b), diagonals Kii (B, nb, b) and uniforms U (B, nb, b)."""
    xp = array_namespace(G)
    b = G.shape[-1]
    R2 = xp.max(Kii, axis=-1)                                               # (B, nb)
    # released: p = 1/2 - gamma x; the theory's normalisation: p = 1/2 - x / (2 c R^2)
    scale = gamma if walk_c is None else 1.0 / (2.0 * walk_c * R2)
    s = xp.zeros(tuple(G.shape[:-1]), dtype=G.dtype, device=_dev(G))      # s_i = sum_{j < i} K_ij eta_j
    one = xp.ones_like(s[..., 0])
    cols, ps = [one], []
    s = s + G[..., :, 0] * one[..., None]
    for i in range(1, b):
        p = 0.5 - scale * s[..., i]
        eta = xp.where(U[..., i] < p, one, -one)
        cols.append(eta)
        ps.append(p)
        if i + 1 < b:
            s[..., i + 1:] += eta[..., None] * G[..., i + 1:, i]
    signs = xp.stack(cols, axis=-1)
    if diag_level is not None:
        P = to_numpy(xp.stack(ps, axis=-1)) if ps else np.zeros((1,))
        with np.errstate(divide="ignore", invalid="ignore"):
            diag_level.update(mean_abs_p_dev=float(np.mean(np.abs(np.clip(np.nan_to_num(P, nan=0.0), 0, 1) - 0.5))),
                              clipped=float(np.mean((P <= 0) | (P >= 1) | np.isnan(P))),
                              log10_R2=float(np.median(np.log10(to_numpy(R2)))),
                              c=None if walk_c is None else float(walk_c), gamma=None if walk_c is not None else gamma)
    return signs


def cut_weights(signs: np.ndarray) -> np.ndarray:
    """The released one-cut selection weights (B, m) in {2, 1, -2} of a row of signs (B, m) in {+1, -1}."""
    if not isinstance(signs, np.ndarray) or signs.ndim != 2 or signs.dtype.kind not in "iuf":
        raise InputError(f"signs must be a 2-D numpy array of +1/-1 (integer or float), got "
                         f"{type(signs).__name__} {getattr(signs, 'shape', '')} {getattr(signs, 'dtype', '')}")
    if not bool(np.all((signs == 1) | (signs == -1))):
        raise InputError("signs must contain only +1 and -1")
    return _cut_weights(signs)


def _cut_weights(signs):
    """:func:`cut_weights` on the signs' backend and device (B, m) -> int64 (B, m), no validation."""
    xp = array_namespace(signs)
    B, m = signs.shape
    half = m // 2
    cneg = xp.argmax(xp.astype(xp.cumulative_sum(xp.astype(signs == -1, xp.int64), axis=-1) == half, xp.int8), axis=-1)
    cpos = xp.argmax(xp.astype(xp.cumulative_sum(xp.astype(signs == 1, xp.int64), axis=-1) == half, xp.int8), axis=-1)
    c = xp.maximum(cneg, cpos)
    pos = xp.arange(m, device=_dev(signs))[None, :]
    at_c = xp.take_along_axis(signs, c[:, None], axis=-1)
    before = pos <= c[:, None]
    w = xp.where(before, xp.where(signs == at_c, -2, 2), 1)
    return xp.astype(w, xp.int64)


def released_select(K, V, *, levels: int, block_size: int, rng: np.random.Generator | None = None,
                    uniforms: Callable | None = None, gamma: float = 4.0, temp: float = 1.0, beta: float = 0.0,
                    kernel_const: float = 0.025, center: bool = True, carry_weights: bool = True,
                    walk_c: float | None = None, diagnostics: list | None = None, overflow: str = "raise",
                    _groups: int | None = None, _checked: bool = False):
    """The released code's T-level selection on K (..., n, d), V (..., n, s) (one row per KV head).

    Returns ``(indices, weights)``, both (..., n // 2^T) on K's backend (int64): indices into the n tokens in
    the order the released code leaves them (not sorted), and the multiplied selection weights (products of
    2s and 1s). ``diagnostics``: a list that receives one dict per level (mean |p - 1/2|, share of clipped
    p, median log10 R^2 with R^2 the block's largest kernel diagonal, gamma or c). ``overflow``: "raise" (an
    InputError when the unnormalised kernel overflows K's float type) or "float64" (that level evaluated in
    float64, said in its diagnostic as ``evaluated_in``). ``_groups`` (internal, :mod:`.balance_layers`): the
    rows are layers of that many heads each, each falling back to float64 on its own."""
    if not _checked:                  # (compress_cache_released checked the whole cache already)
        check_kv(K, V)
    b = check_block(block_size)
    n = K.shape[-2]
    T = check_levels(levels, n)
    if uniforms is None and not isinstance(rng, np.random.Generator):
        raise InputError(f"rng must be a numpy Generator (or pass uniforms), got {type(rng).__name__}")
    for name, val in (("gamma", gamma), ("temp", temp), ("kernel_const", kernel_const)):
        check_positive(val, name, allow_zero=True)
    check_real(beta, "beta")
    for name, val in (("center", center), ("carry_weights", carry_weights)):
        if not isinstance(val, (bool, np.bool_)):
            raise InputError(f"{name} must be True or False, got {val!r}")
    if walk_c is not None:
        check_positive(walk_c, "walk_c")
    check_choice(overflow, "overflow", OVERFLOW)
    xp = array_namespace(K, V)
    lead = tuple(K.shape[:-2])
    B = int(np.prod(lead, dtype=np.int64)) if lead else 1
    d, e = K.shape[-1], V.shape[-1]
    Kf, Vf = xp.reshape(K, (B, n, d)), xp.reshape(V, (B, n, e))
    dev = _dev(K)
    # current tokens in walk order and their weights, on K's device (no host round trip per level)
    cur = xp.asarray(xp.broadcast_to(xp.arange(n, dtype=xp.int64, device=dev)[None, :], (B, n)), copy=True)
    w = xp.ones((B, n), dtype=xp.int64, device=dev)
    for t in range(T):
        m = cur.shape[1]
        nb = -(-m // b)
        pad = nb * b - m
        if t == 0 and isinstance(Kf, np.ndarray):     # every token in order: the gather is a contiguous copy
            Kc, Vc = np.ascontiguousarray(Kf), np.ascontiguousarray(Vf)
        else:
            Kc, Vc = gather_dev(Kf, cur), gather_dev(Vf, cur)
        if carry_weights and t > 0:
            Vc = Vc * xp.astype(w, Kf.dtype)[..., None]
        if pad:
            Kc = xp.concat([Kc, xp.zeros((B, pad, d), dtype=Kc.dtype, device=_dev(Kc))], axis=1)
            Vc = xp.concat([Vc, xp.zeros((B, pad, e), dtype=Vc.dtype, device=_dev(Vc))], axis=1)
        U = _draw(rng, uniforms, (B, nb, b), Kf)
        dl = None if diagnostics is None else {"level": t + 1, "tokens": m}
        signs = _walk(xp.reshape(Kc, (B, nb, b, d)), xp.reshape(Vc, (B, nb, b, e)), U, temp=temp, beta=beta,
                      gamma=gamma, kernel_const=kernel_const, center=center, walk_c=walk_c, diag_level=dl,
                      overflow=overflow, groups=_groups)
        if dl is not None:
            diagnostics.append(dl)
        sg = xp.astype(xp.round(xp.reshape(signs, (B, nb * b))[:, :m]), xp.int64)
        wt = _cut_weights(sg)
        order = xp.argsort(-wt, axis=-1, stable=True)[:, : m // 2]
        cur = xp.take_along_axis(cur, order, axis=-1)
        w = xp.take_along_axis(w, order, axis=-1) * xp.take_along_axis(wt, order, axis=-1)
    return xp.reshape(cur, lead + (cur.shape[1],)), xp.reshape(w, lead + (w.shape[1],))


def released_log_weights(weights, levels: int, estimator: str = "released"):
    """(log_w_num, log_w_den) of the kept middle tokens for an estimator (module docstring); ``weights`` an
    integer array of selection weights >= 1 (products of 2s and 1s), ``levels`` >= 0 the T of 2^T."""
    check_choice(estimator, "estimator", ESTIMATORS)
    levels = check_int(levels, "levels", maximum=1024)
    if not hasattr(weights, "dtype") or not hasattr(weights, "shape"):
        raise InputError(f"weights must be an integer array, got {type(weights).__name__}")
    xp = namespace(weights, names="weights")
    if not xp.isdtype(weights.dtype, "integral"):
        raise InputError(f"weights must have an integer dtype, got {weights.dtype}")
    if int(weights.size if isinstance(weights.size, int) else math.prod(weights.shape)) and int(xp.min(weights)) < 1:
        raise InputError("weights must be >= 1 (products of the selection's 2s and 1s)")
    lw = xp.log(xp.astype(weights, xp.float64))
    flat = xp.full(tuple(weights.shape), levels * math.log(2.0), dtype=xp.float64, device=_dev(weights))
    if estimator == "released":
        return lw, flat
    if estimator == "consistent":
        return lw, lw
    return flat, flat


def compress_cache_released(K, V, *, sink: int, window: int, levels: int, block_size: int,
                            rng: np.random.Generator | None = None, uniforms: Callable | None = None,
                            estimator: str = "released", diagnostics: list | None = None, _checked: bool = False,
                            **walk):
    """The released B.1 cache: tokens [0, sink) and the last ``window`` exact, the middle reduced by
    :func:`released_select` (``**walk``: gamma, temp, beta, kernel_const, center, carry_weights, walk_c, overflow).

    Returns ``(indices, log_w_num, log_w_den)``, each (..., n_kept) on K's backend, indices sorted
    ascending; the estimator is sum_i e^{l_i + log_w_num_i} v_i / sum_i e^{l_i + log_w_den_i}
    (:func:`split_weighted_attention`); 0 for the exact tokens. ``_checked`` (internal): K and V were checked by
    the caller (:func:`~kvbounds.algorithms.balance_layers.compress_cache_released_layers`)."""
    if not _checked:                  # (internal: compress_cache_released_layers checked the stack)
        check_kv(K, V)
    n = K.shape[-2]
    sink, window = check_int(sink, "sink"), check_int(window, "window")
    levels = check_int(levels, "levels")
    if sink + window > n:
        raise InputError(f"sink + window = {sink} + {window} exceeds the cache length n = {n}")
    check_choice(estimator, "estimator", ESTIMATORS)
    check_block(block_size)
    if uniforms is None and not isinstance(rng, np.random.Generator):
        raise InputError(f"rng must be a numpy Generator (or pass uniforms), got {type(rng).__name__}")
    xp = array_namespace(K, V)
    lead = tuple(K.shape[:-2])
    dev = _dev(K)
    head = xp.broadcast_to(xp.arange(sink, dtype=xp.int64, device=dev), lead + (sink,))
    tail = xp.broadcast_to(xp.arange(n - window, n, dtype=xp.int64, device=dev), lead + (window,))
    n_mid = n - sink - window
    if n_mid == 0:
        mid = xp.zeros(lead + (0,), dtype=xp.int64, device=dev)
        lwn = lwd = xp.zeros(lead + (0,), dtype=K.dtype, device=dev)
    else:
        mid, wts = released_select(K[..., sink:n - window, :], V[..., sink:n - window, :], levels=levels,
                                   block_size=block_size, rng=rng, uniforms=uniforms, diagnostics=diagnostics,
                                   _checked=True, **walk)
        order = xp.argsort(mid, axis=-1)
        mid = xp.take_along_axis(mid, order, axis=-1) + sink
        lwn, lwd = released_log_weights(xp.take_along_axis(wts, order, axis=-1), levels, estimator)
        lwn, lwd = xp.astype(lwn, K.dtype), xp.astype(lwd, K.dtype)
    zs = xp.zeros(lead + (sink,), dtype=K.dtype, device=dev)
    zw = xp.zeros(lead + (window,), dtype=K.dtype, device=dev)
    idx = xp.concat([head, xp.astype(mid, xp.int64), tail], axis=-1)
    return idx, xp.concat([zs, lwn, zw], axis=-1), xp.concat([zs, lwd, zw], axis=-1)


def expand_groups(x, group: int):
    """Repeat each KV head's selection for the ``group`` query heads that read it (axis -2 of (..., H_kv, m)).
    A pure copy: any dtype, entries (non-finite ones included) passed through unchanged."""
    check_int(group, "group", minimum=1, maximum=2**20)
    if not hasattr(x, "shape") or not hasattr(x, "ndim") or x.ndim < 2:
        raise InputError(f"x must be an array (..., H_kv, m) with at least 2 dimensions, got "
                         f"{type(x).__name__} {tuple(getattr(x, 'shape', ()))}")
    namespace(x, names="x")
    xp = array_namespace(x)
    return xp.reshape(xp.broadcast_to(xp.expand_dims(x, axis=-2), tuple(x.shape[:-1]) + (group, x.shape[-1])),
                      tuple(x.shape[:-2]) + (x.shape[-2] * group, x.shape[-1]))


def split_weighted_attention(q, K, V, idx, log_w_num, log_w_den, *, scale: float | None = None):
    """sum_i e^{s_i + log_w_num_i} v_i / sum_i e^{s_i + log_w_den_i}, s_i = <q, k_i> scale, over kept tokens
    idx (..., m) of K (..., n, d), V (..., n, e); q (..., d) or (..., nq, d). Computed as the released code does:
    a softmax over s + log_w_den, times values scaled by e^{log_w_num - log_w_den}."""
    _check_split(q, K, V, idx, log_w_num, log_w_den)
    xp = array_namespace(q, K, V)
    d = K.shape[-1]
    scale = check_scale(scale, d)
    lead = tuple(K.shape[:-2])
    m = idx.shape[-1]
    idx = xp.broadcast_to(idx, lead + (m,))
    B = int(np.prod(lead, dtype=np.int64)) if lead else 1
    n, e = K.shape[-2], V.shape[-1]
    flat = xp.reshape(xp.astype(idx, xp.int64), (B, m))
    Ks = xp.reshape(gather_dev(xp.reshape(K, (B, n, d)), flat), lead + (m, d))
    Vs = xp.reshape(gather_dev(xp.reshape(V, (B, n, e)), flat), lead + (m, e))
    Vs = Vs * xp.exp(log_w_num - log_w_den)[..., None]
    had_axis = q.ndim == K.ndim
    qq = q if had_axis else xp.expand_dims(q, axis=-2)
    p = xp.exp(shifted_logits(qq, Ks, scale, log_w_den[..., None, :]))       # max-shifted: no overflow
    out = xp.matmul(p / xp.sum(p, axis=-1, keepdims=True), Vs)
    return out if had_axis else out[..., 0, :]


def _check_split(q, K, V, idx, log_w_num, log_w_den) -> None:
    check_kv(K, V)
    check_array(q, "q", ndim=(K.ndim - 1, K.ndim), last_dim=K.shape[-1])
    lead, n = tuple(K.shape[:-2]), K.shape[-2]
    if tuple(q.shape[:len(lead)]) != lead:
        raise InputError(f"q's leading dimensions {tuple(q.shape)} must match K's {tuple(K.shape)}")
    if not hasattr(idx, "shape") or not hasattr(idx, "dtype"):
        raise InputError(f"idx must be an integer array, got {type(idx).__name__}")
    namespace(q, K, V, idx, log_w_num, log_w_den, names="q, K, V, idx and the log-weights")
    check_indices(idx, "idx", lead=lead, n=n)
    xp = array_namespace(idx)
    for name, lw in (("log_w_num", log_w_num), ("log_w_den", log_w_den)):
        check_array(lw, name, ndim=(1, len(lead) + 1), last_dim=idx.shape[-1])
        if lw.ndim > 1 and tuple(lw.shape[:-1]) != lead:
            raise InputError(f"{name} must have shape (m,) or {lead + (idx.shape[-1],)}, got {tuple(lw.shape)}")
        if lw.dtype != K.dtype:
            raise InputError(f"{name} must have K's dtype {K.dtype}, got {lw.dtype}")
    if not bool(xp.all(xp.abs(log_w_num - log_w_den) < 700.0)):
        raise InputError("log_w_num - log_w_den must stay within (-700, 700): e^{difference} scales the values")


def theory_walk_c(block_size: int, delta: float = 0.01) -> float:
    """The theory's walk constant c = 30 log(b / delta) (BalanceKV-NeurIPS Alg. 2 line 3), for ``walk_c``."""
    return walk_constant(block_size, delta)

"""Blockwise (parallel) BalanceKV, the practical variant of BalanceKV-NeurIPS Appendix B; the B.1 cache set-up.

Claim: BKV.vs-uniform (BalanceKV-NeurIPS Sec 4.1, App. B.1), against :mod:`kvbounds.algorithms.uniform_sampling`.

BalanceKV-NeurIPS App. B ("Implementation Detail"): view the n cached embeddings as blocks of length b, run the
SoftmaxBalance walk (Alg. 2) on all blocks in parallel, pad with zeros when b does not divide n, and
after the sign assignment "strictly select n/2 embeddings"; repeat T times. Here, per level:

1. pad the m current tokens with zero rows to a multiple of b and reshape to (..., m_pad/b, b, d);
2. per block, the normalized Gram y / R^2 of Alg. 2 line 6 (see
   :func:`kvbounds.algorithms.softmax_balance.normalized_kernel_gram`)::

       G[i, j] = exp((<k_i, k_j> - r_key^2) / sqrt d) * <w_i, w_j> / r_w^2

   with r_key, r_w the largest key / w norms *within the block* (the exponent is <= 0, so key norms
   of 50+ at d = 64 cannot overflow; far-apart keys underflow to 0, which is the exact value to
   double precision relative to R^2). ``value_kernel="value"``: w = v, the numerator's kernel.
   ``value_kernel="value+1"`` (default): w = [v, 1], so <w_i, w_j> = <v_i, v_j> + 1 and the walk
   balances the feature vectors phi(k) (x) [v, 1] -- i.e. the numerator sum e^{<k,q>/sqrt d} v and the
   denominator sum e^{<k,q>/sqrt d} at once, so one selection serves both halves of the estimator
   (Alg. 1 runs separate MergeAndReduce instances for them; a cache keeps one subset of tokens).
   Padded rows have k = 0 and w = 0 (the 1 included): their Gram rows vanish, so they never move the walk;
3. the walk (:func:`panel_walk`: :func:`kvbounds.algorithms.self_balancing_walk.gram_walk`'s walk, computing only the
   lower-triangle column panels of G that the walk reads, 5/8 of the Gram work at b = 256 with 64-row panels;
   c = 30 log(b/delta) by default, coin flips drawn from the numpy ``rng`` and moved with
   :func:`kvbounds.algorithms.arrays.like`) on all blocks at once;
   a FAIL (|x| > c) does not stop it: p is clipped, as in ``on_fail="continue"``;
4. strict halving: block j keeps floor(v_j / 2) of its v_j real tokens (b/2 for every full block): first
   the tokens of the block's minority sign (the +1 side on a tie, as in ``smaller_side``), in random
   priority order, then majority-sign tokens in random priority order until the quota is filled.
   Padded rows rank below every real token and the quota never exceeds the real tokens, so they are
   never kept. Only the last block can be partial, so a level keeps exactly floor(m/2) tokens: with
   n a multiple of 2^T b this is exactly n/2 per level, and in general n // 2^T after T levels
   (the remainder token of an odd level is dropped from the partial last block, at random).

The kept tokens of a level are re-blocked contiguously (in original order) for the next level.
Random draws per level: the walk's uniforms (batch + (blocks, b)), then the priorities; both are numpy
draws, so a seed gives the same indices on every backend (up to the walk's float rounding, i.e. exactly
for float64 inputs).
"""
from __future__ import annotations

import math
import sys

import numpy as np

from kvbounds.algorithms.arrays import array_namespace, like, to_numpy, device as _dev

from .block_walk import (ScratchPool, check_exponent_rounding, panel_walk_unchecked, block_gram, panel_walk,  # noqa: F401
                         panel_walk_stepwise, walk_diagnostic)
from .self_balancing_walk import walk_constant
from .uniform_sampling import check_int, check_rng, uniform_select
from .attention import shifted_logits
from .validation import (InputError, check_array, check_indices, check_positive, check_probability, check_scale,
                         namespace)

__all__ = ["VALUE_KERNELS", "METHODS", "check_kv", "check_levels", "WALK_PANEL", "MAX_BLOCK", "check_block",
           "argsort_head", "blockwise_balance_select", "gather_dev", "compress_cache", "weighted_attention"]

VALUE_KERNELS = ("value", "value+1")
METHODS = ("balance", "uniform")


def check_kv(K, V, *, finite: bool = True):
    check_array(K, "K", ndim=tuple(range(2, 8)), min_rows=1, finite=finite)
    check_array(V, "V", ndim=K.ndim, finite=finite)
    namespace(K, V, names="K and V")
    if tuple(V.shape[:-1]) != tuple(K.shape[:-1]):
        raise InputError(f"K and V must agree in all but the last dimension, got {tuple(K.shape)} and {tuple(V.shape)}")
    if K.dtype != V.dtype:
        raise InputError(f"K and V must have the same dtype, got {K.dtype} and {V.dtype}")


def check_levels(levels, n: int) -> int:
    levels = check_int(levels, "levels", minimum=0)
    if levels > 62 or n >> levels < 1:
        raise InputError(f"T too large: levels = {levels} would leave n // 2^T = 0 of n = {n} tokens")
    return levels


# panel width of the walk: at b = 256, d = 128 on one CPU thread the 64-row panel products run ~13% faster than
# 32-row ones (more of each block's Gram is computed: 5/8 instead of 9/16, at a higher FLOP rate); the steps are
# the same. The same uniforms give the same signs as panel_walk_stepwise at this width.
WALK_PANEL = 64
MAX_BLOCK = 2**26   # the walk only ever spans min(block_size, n) tokens; the coin draws span block_size


def check_block(block_size) -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) or block_size < 2 \
            or block_size % 2 or block_size > MAX_BLOCK:
        raise InputError(f"block_size must be an even integer in [2, {MAX_BLOCK}], got {block_size!r}")
    return int(block_size)



def argsort_head(r: np.ndarray, k: int) -> np.ndarray:
    """``np.argsort(r, axis=-1)[..., :k]`` in O(len + k log k) (argpartition, then sort the head)."""
    if k >= r.shape[-1]:
        return np.argsort(r, axis=-1)
    head = np.argpartition(r, k - 1, axis=-1)[..., :k]
    return np.take_along_axis(head, np.argsort(np.take_along_axis(r, head, axis=-1), axis=-1), axis=-1)


def _balance_level(Kc, Wc, nk2, nw2, *, b: int, c: float, rng: np.random.Generator, plus_one: bool = False,
                   diagnostics: list | None = None, scratch: ScratchPool | None = None):
    """One level on the current tokens: pre-scaled keys Kc (B, m, d), Wc (B, m, e) (B = flattened heads)
    and their squared norms nk2, nw2 (B, m) (with ``plus_one``, w carries an implicit extra coordinate 1,
    included in nw2, that padded rows do not have).

    Returns the numpy int64 positions (m // 2,) per batch entry, shape (B, m // 2), sorted, and the
    number of blocks whose walk hit FAIL."""
    xp = array_namespace(Kc, Wc)
    B, m, d = Kc.shape
    e = Wc.shape[-1]
    nb = -(-m // b)
    b_draw, b = b, min(b, m + m % 2)   # a block longer than the tokens: walk only the real ones (the padded rows
    pad = nb * b - m                   # never move the walk), drawing the same coins so a seed's result is kept
    if pad:
        Kc = xp.concat([Kc, xp.zeros((B, pad, d), dtype=Kc.dtype, device=_dev(Kc))], axis=1)
        Wc = xp.concat([Wc, xp.zeros((B, pad, e), dtype=Wc.dtype, device=_dev(Wc))], axis=1)
        nk2 = xp.concat([nk2, xp.zeros((B, pad), dtype=nk2.dtype, device=_dev(nk2))], axis=1)
        nw2 = xp.concat([nw2, xp.zeros((B, pad), dtype=nw2.dtype, device=_dev(nw2))], axis=1)
    ones = None
    if plus_one and pad:
        ones = like(np.concatenate([np.ones(m), np.zeros(pad)]).reshape(nb, b), Kc)
    signs, failed = panel_walk_unchecked(xp.reshape(Kc, (B, nb, b, d)), xp.reshape(Wc, (B, nb, b, e)),
                               xp.reshape(nk2, (B, nb, b)), xp.reshape(nw2, (B, nb, b)),
                               like(rng.random((B, nb, b_draw))[..., :b], Kc), c, panel=WALK_PANEL,
                               plus_one=plus_one, ones=ones, scratch=scratch)
    if diagnostics is not None:
        diagnostics.append(walk_diagnostic(xp.reshape(Kc, (B, nb, b, d)), xp.reshape(Wc, (B, nb, b, e)),
                                           xp.reshape(nk2, (B, nb, b)), xp.reshape(nw2, (B, nb, b)), signs, c, m,
                                           plus_one=plus_one, ones=ones))
    # strict halving: integer scores, exact on every backend. score = 2b*[minority] + b*[real] + priority
    valid_np = np.ones(nb * b, dtype=bool)
    valid_np[m:] = False
    valid = like(valid_np.reshape(nb, b), Kc)                                  # (nb, b) bool
    plus = signs > 0
    n_plus = xp.sum(xp.astype(plus & valid, xp.int64), axis=-1, keepdims=True)
    n_real = xp.sum(xp.astype(valid, xp.int64), axis=-1, keepdims=True)
    minority = xp.where(2 * n_plus <= n_real, plus, ~plus) & valid
    prio = like(argsort_head(rng.random((B, nb, b_draw)), b).astype(np.int64), Kc)   # random priorities
    score = 2 * b_draw * xp.astype(minority, xp.int64) + b_draw * xp.astype(valid, xp.int64) + prio
    order = xp.argsort(score, axis=-1, descending=True, stable=True)[..., : b // 2]   # (B, nb, b/2)
    offsets = like((np.arange(nb, dtype=np.int64) * b)[:, None], Kc)
    pos = xp.reshape(order + offsets, (B, nb * (b // 2)))[:, : m // 2]   # last block: top floor(v/2) only
    return xp.sort(pos, axis=-1), int(np.sum(failed))


def blockwise_balance_select(K, V, *, block_size: int, levels: int, rng: np.random.Generator,
                             delta: float = 0.01, c: float | None = None, value_kernel: str = "value+1",
                             diagnostics: list | None = None, _uniforms=None):
    """Indices (..., n // 2**levels) of the tokens kept by T = ``levels`` rounds of blockwise BalanceKV.

    ``K`` (..., n, d), ``V`` (..., n, s), any array-API backend; leading dimensions (heads) are
    independent and processed in the same array operations. Indices are integer arrays of the input's
    backend, sorted ascending along the last axis. ``c`` defaults to 30 log(block_size/delta) (the
    paper's constant, applied per block); ``value_kernel`` is "value" or "value+1" (module docstring).
    ``levels = 0`` keeps everything. ``diagnostics``: a list that receives one :func:`walk_diagnostic` dict per level.
    ``_uniforms``: internal (:mod:`kvbounds.algorithms.balance_layers`), an object whose ``random(shape)`` hands
    out the levels' uniforms instead of ``rng``."""
    check_kv(K, V, finite=False)   # finiteness: checked below on the squared norms (one pass fewer)
    b = check_block(block_size)
    n = K.shape[-2]
    T = check_levels(levels, n)
    check_rng(rng)
    check_probability(delta, "delta")
    if value_kernel not in VALUE_KERNELS:
        raise InputError(f"value_kernel must be one of {VALUE_KERNELS}, got {value_kernel!r}")
    c = walk_constant(b, delta) if c is None else c
    check_positive(c, "c")
    xp = array_namespace(K, V)
    lead = tuple(K.shape[:-2])
    B = int(np.prod(lead, dtype=np.int64)) if lead else 1
    d = K.shape[-1]
    scale = 1.0 / math.sqrt(d)
    # keys pre-scaled once: <k', k''> = <k, k''>/sqrt d. On the host into memory from the select's ScratchPool
    # (numpy's allocator: huge pages, see host_scratch.host_empty), handed on to the next level's w's after level 1
    scratch = ScratchPool()
    Kf = _scaled(xp.reshape(K, (B, n, d)), math.sqrt(scale), scratch)
    Wf = xp.reshape(V, (B, n, V.shape[-1]))
    # squared norms through vector_norm: one reduction, no (B, n, d) temporary (torch: 10x faster than sum(x * x))
    nk2, nw2 = xp.linalg.vector_norm(Kf, axis=-1) ** 2, xp.linalg.vector_norm(Wf, axis=-1) ** 2
    # a NaN/Inf entry makes its row's squared norm non-finite; so does a norm whose square overflows,
    # which would overflow the Gram too: both are bad input
    for name, nrm in (("K", nk2), ("V", nw2)):
        if not bool(xp.all(xp.isfinite(nrm))):
            raise InputError(f"{name} contains NaN or Inf (or a row whose squared norm overflows {K.dtype})")
    check_exponent_rounding(xp, nk2, d, K.dtype)
    plus_one = value_kernel == "value+1"     # w = [v, 1], the 1 added inside the walk (no concatenated copy)
    if plus_one:
        nw2 = nw2 + 1.0
    idx = xp.broadcast_to(xp.arange(n, dtype=xp.int64, device=_dev(K))[None, :], (B, n))
    Kc, Wc, kc2, wc2 = Kf, Wf, nk2, nw2
    if T == 0:
        idx = xp.asarray(idx, copy=True)
    # memory the select has touched is reused (ScratchPool): the walk's panel scratch; the next level's keys go into
    # the freed panel scratch, then Kf is dead (later levels gather from the current level) and holds the next
    # w's and panels
    for level in range(T):   # torch CPU: the large operations may use torch's threads; the walk's steps run in numpy
        pos, _ = _balance_level(Kc, Wc, kc2, wc2, b=b, c=float(c), rng=_uniforms or rng, plus_one=plus_one,
                                diagnostics=diagnostics, scratch=scratch)
        if diagnostics is not None:
            diagnostics[-1]["level"] = level + 1
        idx = _take_cols(idx, pos)
        if level + 1 < T:
            Kn = gather_dev(Kc, pos, out=scratch.take(Kc, B * pos.shape[-1] * d))
            scratch.give(_flat_view(Kc))
            Wn = gather_dev(Wc, pos, out=scratch.take(Wc, B * pos.shape[-1] * Wc.shape[-1]))
            if level > 0:                # level 0's w are the caller's V
                scratch.give(_flat_view(Wc))
            Kc, Wc = Kn, Wn
            kc2, wc2 = _take_cols(kc2, pos), _take_cols(wc2, pos)
    return xp.reshape(idx, lead + (idx.shape[-1],))


def _scaled(X, a: float, scratch: ScratchPool):
    """X * a, for a numpy array or torch CPU tensor written into memory taken from ``scratch`` (the same
    products, so the same values)."""
    if type(X) is np.ndarray and X.dtype.kind == "f":
        return np.multiply(X, X.dtype.type(a), out=scratch.take(X, X.size).reshape(X.shape))
    torch = sys.modules.get("torch")
    if (torch is not None and isinstance(X, torch.Tensor) and X.device.type == "cpu" and X.is_floating_point()
            and not X.requires_grad):
        return torch.mul(X, a, out=scratch.take(X, X.numel()).view(X.shape))
    return X * a


def _flat(idx, n):
    xp = array_namespace(idx)
    B = idx.shape[0]
    return xp.reshape(idx + xp.arange(B, dtype=idx.dtype, device=_dev(idx))[:, None] * n, (-1,))


def _take_cols(idx, pos):
    """idx (B, m), pos (B, m') integer (same backend) -> idx[b, pos[b, j]]."""
    xp = array_namespace(idx)
    B, m = idx.shape
    return xp.reshape(xp.take(xp.reshape(idx, (-1,)), _flat(pos, m), axis=0), pos.shape)


def gather_dev(X, idx, out=None):
    """X (B, n, e), idx (B, m) integer array of X's backend -> (B, m, e); ``out``: None, or a flat array of
    B m e elements (numpy or torch, from a :class:`ScratchPool`) that receives it."""
    xp = array_namespace(X)
    B, n, e = X.shape
    if out is None:
        res = xp.take(xp.reshape(X, (B * n, e)), _flat(idx, n), axis=0)
    elif type(X) is np.ndarray:
        res = np.take(X.reshape(B * n, e), _flat(idx, n), axis=0, out=out.reshape(-1, e))
    else:
        res = sys.modules["torch"].index_select(X.reshape(B * n, e), 0, _flat(idx, n), out=out.reshape(-1, e))
    return xp.reshape(res, (B, idx.shape[-1], e))


def _flat_view(X):
    """The flat view of a contiguous numpy array or torch tensor (its memory, to hand back to a ScratchPool), else
    None (other backends keep freeing their memory as before)."""
    if type(X) is np.ndarray:
        return X.reshape(-1) if X.flags.c_contiguous else None
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(X, torch.Tensor) and X.is_contiguous():
        return X.view(-1)
    return None


def compress_cache(K, V, *, sink: int, window: int, levels: int, block_size: int, rng: np.random.Generator,
                   method: str = "balance", delta: float = 0.01, c: float | None = None,
                   value_kernel: str = "value+1", diagnostics: list | None = None, _uniforms=None):
    """The BalanceKV-NeurIPS B.1 cache: tokens [0, sink) and the last ``window`` kept exactly, the middle compressed.

    The middle [sink, n - window) is reduced to n_mid // 2^levels tokens by :func:`blockwise_balance_select`
    (``method="balance"``) or by uniform sampling without replacement, drawn independently per head
    (``method="uniform"``, the paper's baseline). Returns ``(indices, log_weights)``, both (..., n_kept)
    on K's backend: indices sorted ascending (int64), log-weight 0 for the exact tokens and
    levels * log 2 for the kept middle tokens (the 2^T of the estimator; when 2^T does not divide n_mid
    the exact scale would be log(n_mid / kept), which differs by a factor 1 + O(2^T / n_mid))."""
    check_kv(K, V)
    n = K.shape[-2]
    sink = check_int(sink, "sink")
    window = check_int(window, "window")
    if sink + window > n:
        raise InputError(f"sink + window = {sink} + {window} exceeds the cache length n = {n}")
    if method not in METHODS:
        raise InputError(f"method must be one of {METHODS}, got {method!r}")
    b = check_block(block_size)
    check_rng(rng)
    levels = check_int(levels, "levels")
    xp = array_namespace(K, V)
    lead = tuple(K.shape[:-2])
    n_mid = n - sink - window
    dev = _dev(K)
    if n_mid == 0:
        mid = xp.zeros(lead + (0,), dtype=xp.int64, device=dev)
    else:
        check_levels(levels, n_mid)
        m = n_mid >> levels
        if method == "balance":
            mid = blockwise_balance_select(K[..., sink:n - window, :], V[..., sink:n - window, :], block_size=b,
                                           levels=levels, rng=rng, delta=delta, c=c, value_kernel=value_kernel,
                                           diagnostics=diagnostics, _uniforms=_uniforms)
        else:
            mid = like(uniform_select(n_mid, m, rng, batch=lead), K)
        mid = mid + sink
    head = xp.broadcast_to(xp.arange(sink, dtype=xp.int64, device=dev), lead + (sink,))
    tail = xp.broadcast_to(xp.arange(n - window, n, dtype=xp.int64, device=dev), lead + (window,))
    idx = xp.concat([head, xp.astype(mid, xp.int64), tail], axis=-1)
    logw_np = np.concatenate([np.zeros(sink), np.full(mid.shape[-1], levels * math.log(2.0)), np.zeros(window)])
    logw = xp.broadcast_to(like(logw_np, K), idx.shape)
    return idx, logw


def _on_device_of(x, ref, same_backend: bool):
    """x on ref's backend and device: converted from another backend, moved from another device of the same one
    (indices on the CPU beside CUDA keys), else x itself."""
    if not same_backend:
        return like(to_numpy(x), ref)
    return x if _dev(x) == _dev(ref) else array_namespace(ref).asarray(x, device=_dev(ref))


def weighted_attention(q, K, V, idx, logw, *, scale: float | None = None):
    """The cache estimator sum_i w_i e^{<k_i,q>/sqrt d} v_i / sum_i w_i e^{<k_i,q>/sqrt d} over the kept keys.

    ``q`` (..., d) or (..., nq, d); ``K`` (..., n, d), ``V`` (..., n, s); ``idx`` (..., m) integer
    indices (numpy or K's backend; a 1-D ``idx`` is shared by all heads); ``logw`` (..., m) or (m,) the
    log-weights (log 2^T for compressed tokens, 0 for exact ones). Computed as a softmax over logits
    <k, q>/sqrt d + log w (max-shifted: no overflow). Returns (..., s) or (..., nq, s)."""
    check_kv(K, V)
    check_array(q, "q", ndim=(K.ndim - 1, K.ndim), last_dim=K.shape[-1])
    namespace(q, K, V, names="q, K and V")
    lead = tuple(K.shape[:-2])
    if tuple(q.shape[:len(lead)]) != lead:
        raise InputError(f"q's leading dimensions {tuple(q.shape)} must match K's {tuple(K.shape)}")
    xp = array_namespace(q, K, V)
    n, d = K.shape[-2], K.shape[-1]
    check_indices(idx, "idx", lead=lead, n=n)
    ixp = array_namespace(idx)
    m = idx.shape[-1]
    check_array(logw, "logw", ndim=(1, len(lead) + 1), last_dim=m)
    if logw.ndim > 1 and tuple(logw.shape[:-1]) != lead:
        raise InputError(f"logw must have shape (m,) or {lead + (m,)}, got {tuple(logw.shape)}")
    scale = check_scale(scale, d)
    B = int(np.prod(lead, dtype=np.int64)) if lead else 1
    idx_d = _on_device_of(idx, K, ixp is xp)
    idx_d = xp.reshape(xp.broadcast_to(xp.astype(idx_d, xp.int64), lead + (m,)), (B, m))
    Ks = xp.reshape(gather_dev(xp.reshape(K, (B, n, d)), idx_d), lead + (m, d))
    Vs = xp.reshape(gather_dev(xp.reshape(V, (B, n, V.shape[-1])), idx_d), lead + (m, V.shape[-1]))
    lw = xp.astype(_on_device_of(logw, K, array_namespace(logw) is xp), K.dtype)
    lw = xp.broadcast_to(lw, lead + (m,))
    had_axis = q.ndim == K.ndim
    qq = q if had_axis else xp.expand_dims(q, axis=-2)
    w = xp.exp(shifted_logits(qq, Ks, scale, lw[..., None, :]))                        # (..., nq, m)
    out = xp.matmul(w / xp.sum(w, axis=-1, keepdims=True), Vs)
    return out if had_axis else out[..., 0, :]

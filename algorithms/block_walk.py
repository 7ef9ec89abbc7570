"""The self-balancing walk on blocks of tokens, as blockwise BalanceKV runs it (claim BKV.vs-uniform; BalanceKV-NeurIPS App. B).

Per block, the normalized Gram of Alg. 2 line 6 (:func:`block_gram`) and the walk of
:func:`kvbounds.algorithms.self_balancing_walk.gram_walk` on it, computed from lower-triangle column panels only
(:func:`panel_walk`, with :func:`panel_walk_stepwise` its reference), plus :func:`walk_diagnostic`, which says how
far a level's walk is from a fair coin. :mod:`kvbounds.algorithms.blockwise_balance_kv` selects tokens from the
signs and re-exports these functions.
"""
from __future__ import annotations

import math
import sys

import numpy as np

from kvbounds.algorithms.arrays import array_namespace, like, to_numpy, device as _dev

from .host_scratch import ScratchPool, exp_inplace, host_empty, host_view, native, on_host  # noqa: F401
from .validation import (InputError, check_array, check_int, check_positive, check_real, check_same_dtype,
                         namespace)

__all__ = ["check_exponent_rounding", "block_gram", "panel_scales", "gram_panel", "W_CHUNK", "check_walk_inputs",
           "STEP_ENTRIES", "panel_walk", "panel_walk_unchecked", "panel_walk_stepwise", "walk_diagnostic"]


def check_exponent_rounding(xp, nk2, d: int, dtype) -> None:
    """The Gram exponent <k'_i, k'_j> - max ||k'||^2 is <= 0 up to a rounding of ~ (d + 2) eps max ||k'||^2; past
    ~80 that rounding alone can overflow exp (NaN in the walk). Keys that large are rejected."""
    top = float(xp.max(nk2))
    if top * (d + 2) * float(xp.finfo(dtype).eps) > 80.0:
        raise InputError(f"keys too large for the Gram's exponent: scale * max||k||^2 = {top:.3g} in {dtype} "
                         f"(its rounding alone could overflow exp)")


def block_gram(Kb, Wb, *, scale: float):
    """Per-block normalized Gram y / R^2 (..., b, b) of keys Kb (..., b, d) and w's Wb (..., b, e).

    Equal to ``normalized_kernel_gram(Kb, Wb, r_key, r_w)`` with r_key, r_w the largest norms of each
    block (last two axes), computed with fewer passes over the (b, b) arrays: keys are pre-scaled by
    sqrt(scale) and w's by 1/r_w, so G = exp(<k'_i, k'_j> - max ||k'||^2) * <w'_i, w'_j>. The exponent
    is <= 0 up to rounding; a block whose w's are all 0 (padding) gets G = 0."""
    check_array(Kb, "Kb", ndim=tuple(range(2, 9)), min_rows=1)
    check_array(Wb, "Wb", ndim=Kb.ndim)
    if tuple(Kb.shape[:-1]) != tuple(Wb.shape[:-1]):
        raise InputError(f"Kb and Wb must agree in all but the last dimension, got {tuple(Kb.shape)} and {tuple(Wb.shape)}")
    check_positive(scale, "scale", allow_zero=True)
    xp = namespace(Kb, Wb, names="Kb and Wb")
    Ks = Kb * math.sqrt(scale)
    nk2, nw2 = xp.sum(Ks * Ks, axis=-1), xp.sum(Wb * Wb, axis=-1)
    if not (bool(xp.all(xp.isfinite(nk2))) and bool(xp.all(xp.isfinite(nw2)))):
        raise InputError(f"a row of Kb or Wb has a squared norm that overflows {Kb.dtype}")
    check_exponent_rounding(xp, nk2, Kb.shape[-1], Kb.dtype)
    return _gram(Ks, Wb, nk2, nw2)


def _gram(Ks, Wb, nk2, nw2):
    """block_gram from pre-scaled keys Ks (..., b, d), Wb (..., b, e) and their squared norms (..., b)."""
    xp = array_namespace(Ks, Wb)
    rk2 = xp.max(nk2, axis=-1)[..., None, None]                                 # scale * r_key^2 per block
    rw2 = xp.max(nw2, axis=-1)[..., None, None]                                 # r_w^2 per block
    Ws = Wb / xp.sqrt(xp.where(rw2 > 0, rw2, xp.ones_like(rw2)))
    # in-place updates (array API semantics) save two allocations of (..., b, b) per level
    E = xp.matmul(Ks, xp.matrix_transpose(Ks))
    E -= rk2
    G = xp.exp(E)
    del E
    G *= xp.matmul(Ws, xp.matrix_transpose(Ws))
    return G


def panel_scales(xp, nk2, nw2):
    """The Gram's normalisation per block, shaped to broadcast over a panel: (max ||k'||^2, 1 / max ||w||^2)."""
    rk2 = xp.max(nk2, axis=-1)[..., None, None]
    rw2 = xp.max(nw2, axis=-1)[..., None, None]
    return rk2, 1.0 / xp.where(rw2 > 0, rw2, xp.ones_like(rw2))


def gram_panel(Kr, Wr, m: int, rk2, inv_rw2, plus_one: bool, ones_r, out=None):
    """Rows start..start+m-1 of the block Gram from column ``start`` on, given the rows from ``start`` on
    (``Kr = Kb[..., start:, :]``, ``Wr``, ``ones_r = ones[..., start:]`` or None), normalised as in
    :func:`block_gram`: exp(<k_i, k_j> - max||k||^2) (<w_i, w_j> [+ o_i o_j]) / max||w||^2. The transposed
    panel: row l holds G[start + l, start:] (= column start + l, by symmetry), contiguous. Shared by the
    walks here and by :mod:`kvbounds.gpu.batched_walk`. ``out``: None, or the two flat scratch arrays of
    :func:`_panel_buffers` (numpy or torch): the panel is written into the first (and returned as a view of it),
    the w-Gram goes through the second a few blocks at a time; a walk reuses them from panel to panel instead of
    touching fresh memory for each (same operations on the same values, so the same panel)."""
    xp = array_namespace(Kr, Wr)
    if out is None:
        P = xp.matmul(Kr[..., :m, :], xp.matrix_transpose(Kr))
        Wp = xp.matmul(Wr[..., :m, :], xp.matrix_transpose(Wr))
    else:
        return _gram_panel_into(xp, Kr, Wr, m, rk2, inv_rw2, plus_one, ones_r, *out)
    P -= rk2
    P = exp_inplace(xp, P)
    if plus_one and ones_r is None:
        Wp += 1.0
    elif plus_one:
        Wp += ones_r[..., :m, None] * ones_r[..., None, :]
    Wp *= inv_rw2
    P *= Wp
    return P


def _gram_panel_into(xp, Kr, Wr, m, rk2, inv_rw2, plus_one, ones_r, P_buf, W_buf):
    """:func:`gram_panel` written into P_buf, a few blocks at a time (fused): per chunk of blocks the key products
    go straight into the panel, then minus max||k'||^2, exp in place, the w-Gram in W_buf, + 1 (or o_i o_j), times
    1/max||w||^2, and the product, while the chunk is still in cache (before: the exponent and exp were two passes
    over the whole panel in memory; at 1 thread 5-9% of a blockwise select at 8 x 8192 x 128, paired runs). Same
    operations on the same values, so the same panel. torch with several threads: :func:`_gram_panel_whole`."""
    nat = native(Kr)
    if nat is not np and nat.get_num_threads() > 1:
        return _gram_panel_whole(xp, Kr, Wr, m, rk2, inv_rw2, plus_one, ones_r, P_buf, W_buf)
    lead, rows = tuple(Kr.shape[:-2]), Kr.shape[-2]
    nblk = math.prod(lead)
    mm, exp = nat.matmul, nat.exp
    P = xp.reshape(P_buf[:nblk * m * rows], lead + (m, rows))
    P3 = xp.reshape(P, (nblk, m, rows))
    K3, W3 = xp.reshape(Kr, (nblk, rows, Kr.shape[-1])), xp.reshape(Wr, (nblk, rows, Wr.shape[-1]))
    rk3 = xp.reshape(xp.broadcast_to(rk2, lead + (1, 1)), (nblk, 1, 1))
    inv3 = xp.reshape(xp.broadcast_to(inv_rw2, lead + (1, 1)), (nblk, 1, 1))
    o3 = None if ones_r is None or not plus_one else xp.reshape(xp.broadcast_to(ones_r, lead + (rows,)), (nblk, rows))
    step = max(1, W_buf.shape[0] // (m * rows))
    for c0 in range(0, nblk, step):
        c1 = min(nblk, c0 + step)
        Pc = mm(K3[c0:c1, :m, :], xp.matrix_transpose(K3[c0:c1]), out=P3[c0:c1])
        Pc -= rk3[c0:c1]
        exp(Pc, out=Pc)
        Pc *= _w_gram_chunk(xp, mm, W3, o3, inv3, plus_one, W_buf, m, c0, c1)
    return P


def _gram_panel_whole(xp, Kr, Wr, m, rk2, inv_rw2, plus_one, ones_r, P_buf, W_buf):
    """:func:`gram_panel` written into P_buf in whole-panel passes, the w-Gram formed in W_buf chunk by chunk of
    blocks: the path for torch running several threads, whose operations split across threads only when large."""
    lead, rows = tuple(Kr.shape[:-2]), Kr.shape[-2]
    nblk = math.prod(lead)
    mm = native(Kr).matmul
    P = mm(Kr[..., :m, :], xp.matrix_transpose(Kr), out=xp.reshape(P_buf[:nblk * m * rows], lead + (m, rows)))
    P -= rk2
    P = exp_inplace(xp, P)
    P3, W3 = xp.reshape(P, (nblk, m, rows)), xp.reshape(Wr, (nblk, rows, Wr.shape[-1]))
    inv3 = xp.reshape(xp.broadcast_to(inv_rw2, lead + (1, 1)), (nblk, 1, 1))
    o3 = None if ones_r is None or not plus_one else xp.reshape(xp.broadcast_to(ones_r, lead + (rows,)), (nblk, rows))
    step = max(1, W_buf.shape[0] // (m * rows))
    for c0 in range(0, nblk, step):
        c1 = min(nblk, c0 + step)
        P3[c0:c1] *= _w_gram_chunk(xp, mm, W3, o3, inv3, plus_one, W_buf, m, c0, c1)
    return P


def _w_gram_chunk(xp, mm, W3, o3, inv3, plus_one, W_buf, m, c0, c1):
    """Blocks c0..c1's value-kernel factor of the panel, written into W_buf: (<w_i, w_j> + 1, or + o_i o_j) /
    max||w||^2 over the panel's m rows and every column (both panel paths multiply it in)."""
    rows = W3.shape[-2]
    Wp = mm(W3[c0:c1, :m, :], xp.matrix_transpose(W3[c0:c1]),
            out=xp.reshape(W_buf[:(c1 - c0) * m * rows], (c1 - c0, m, rows)))
    if o3 is None and plus_one:
        Wp += 1.0
    elif plus_one:
        Wp += o3[c0:c1, :m, None] * o3[c0:c1, None, :]
    Wp *= inv3[c0:c1]
    return Wp


W_CHUNK = 1 << 18    # entries of the w-Gram scratch (1 MiB in float32): a few blocks' rows at a time, cache-resident


def _panel_buffers(Kb, m: int, pool: ScratchPool | None):
    """The two flat scratch arrays of :func:`gram_panel`'s ``out`` (the first holds the largest panel, the second
    at least one block's w-Gram rows) from ``pool`` (a fresh one if None), or None off the host (CUDA, CuPy:
    fresh panels, as before)."""
    if not on_host(Kb):
        return None
    size = math.prod(tuple(Kb.shape[:-2])) * m * Kb.shape[-2]
    pool = ScratchPool() if pool is None else pool
    return pool.take(Kb, size), pool.take(Kb, min(size, max(W_CHUNK, m * Kb.shape[-2])))


def check_walk_inputs(Kb, Wb, nk2, nw2, uniforms, c, *, panel=32, plus_one=False, ones=None):
    """The arguments of :func:`panel_walk` / :func:`kvbounds.gpu.batched_walk.walk_signs` (both checked
    nothing; NaN keys gave signs, panel = 0 divided by zero, c = NaN was accepted). Kb (..., b, d) and Wb (..., b, e)
    finite float arrays of one backend, dtype and device; nk2, nw2, uniforms (..., b) finite, the norms >= 0 and the
    uniforms in [0, 1); ``ones`` None or a finite array broadcasting to (..., b); c > 0 finite; panel an integer
    >= 1; plus_one a bool. Kb's squared norms must keep the Gram's exponent within rounding (as block_gram)."""
    check_array(Kb, "Kb", ndim=tuple(range(2, 9)), min_rows=1)
    check_array(Wb, "Wb", ndim=Kb.ndim)
    xp = namespace(*[x for x in (Kb, Wb, nk2, nw2, uniforms, ones) if x is not None],
                   names="Kb, Wb, nk2, nw2, uniforms and ones")
    check_same_dtype(("Kb", Kb), ("Wb", Wb))
    lead = tuple(Kb.shape[:-1])
    if tuple(Wb.shape[:-1]) != lead:
        raise InputError(f"Kb and Wb must agree in all but the last dimension, got {tuple(Kb.shape)} and {tuple(Wb.shape)}")
    for name, x in (("nk2", nk2), ("nw2", nw2), ("uniforms", uniforms)):
        check_array(x, name, ndim=len(lead))
        if tuple(x.shape) != lead:
            raise InputError(f"{name} must have shape {lead} (Kb's without its last axis), got {tuple(x.shape)}")
    if bool(xp.any(nk2 < 0)) or bool(xp.any(nw2 < 0)):
        raise InputError("nk2 and nw2 are squared norms: they must be >= 0")
    if bool(xp.any(uniforms < 0)) or bool(xp.any(uniforms >= 1)):
        raise InputError("uniforms must lie in [0, 1)")
    if ones is not None:
        check_array(ones, "ones", ndim=tuple(range(1, len(lead) + 1)))
        if tuple(ones.shape) != lead[len(lead) - ones.ndim:]:
            raise InputError(f"ones must have shape {lead} or a trailing part of it, got {tuple(ones.shape)}")
    check_real(c, "c", minimum=0.0, strict=True)
    check_int(panel, "panel", minimum=1)
    if not isinstance(plus_one, (bool, np.bool_)):
        raise InputError(f"plus_one must be a bool, got {plus_one!r}")
    check_exponent_rounding(xp, nk2, Kb.shape[-1], Kb.dtype)


STEP_ENTRIES = 16384   # blocks x panel width above which panel_walk narrows its panel (torch's split size)


def panel_walk(Kb, Wb, nk2, nw2, uniforms, c: float, *, panel: int = 32, plus_one: bool = False, ones=None,
               scratch: ScratchPool | None = None):
    """:func:`panel_walk_unchecked` after :func:`check_walk_inputs` (InputError naming the argument on bad input)."""
    check_walk_inputs(Kb, Wb, nk2, nw2, uniforms, c, panel=panel, plus_one=plus_one, ones=ones)
    return panel_walk_unchecked(Kb, Wb, nk2, nw2, uniforms, float(c), panel=int(panel), plus_one=bool(plus_one), ones=ones,
                       scratch=scratch)


def panel_walk_unchecked(Kb, Wb, nk2, nw2, uniforms, c: float, *, panel: int = 32, plus_one: bool = False, ones=None,
                scratch: ScratchPool | None = None):
    """The walk of :func:`panel_walk_stepwise` (same arguments, same Gram panels, same signs up to rounding),
    organised for speed: within a column panel of m steps, each step updates only the m entries of s in its
    panel; the panel's signs then reach every later s_j in one batched product s_j += sum_l eta_l G[l, j]. The
    coin test u_i < 1/2 - x/(2c) is evaluated as x < c (1 - 2 u_i) (precomputed), and the FAIL flags are read at
    the end (s_i is final once step i has read it). On the host (numpy, torch CPU) the m steps of a panel run in
    numpy on views of the panel (no copies; IEEE float arithmetic, so the same values as torch's), at a fraction of
    torch's per-operation cost and never split across threads (so the ~b small steps per level never wait on a
    descheduled thread of a loaded machine; only the panels' products and passes may use torch's threads), and
    the panels reuse two scratch buffers (from ``scratch``, a :class:`ScratchPool` they are handed back to: the
    next level reuses them). Elsewhere (CUDA, CuPy) the steps are array operations on (blocks x m) entries, below
    the size at which torch splits an operation across threads (32768 elements; the panel shrinks for many
    blocks). Returns (signs (..., b), failed (...,) numpy bool)."""
    xp = array_namespace(Kb, Wb)
    b = Kb.shape[-2]
    blocks = int(np.prod(Kb.shape[:-2], dtype=np.int64)) if Kb.ndim > 2 else 1
    m = panel if b % panel == 0 else b
    while m > 8 and m % 2 == 0 and b % (m // 2) == 0 and blocks * m > STEP_ENTRIES:
        m //= 2
    rk2, inv_rw2 = panel_scales(xp, nk2, nw2)
    s = xp.zeros(tuple(Kb.shape[:-1]), dtype=Kb.dtype, device=_dev(Kb))
    thr = c * (1.0 - 2.0 * uniforms)                 # eta_i = +1 iff x_i < thr_i  (u_i < 1/2 - x_i/(2c))
    s_host, thr_host = host_view(s), host_view(thr)
    host = s_host is not None and thr_host is not None
    if host:
        s_host, thr_host = s_host.reshape(blocks, b), thr_host.reshape(blocks, b)
        E_host = np.empty((blocks, m), dtype=s_host.dtype)
        E = E_host if type(s) is np.ndarray else sys.modules["torch"].from_numpy(E_host)   # shares E_host
        pos, neg_h = np.ones(blocks, dtype=s_host.dtype), -np.ones(blocks, dtype=s_host.dtype)
    one = xp.ones_like(s[..., 0])
    neg = -one
    out = _panel_buffers(Kb, m, scratch)
    cols = []
    for start in range(0, b, m):
        P = gram_panel(Kb[..., start:, :], Wb[..., start:, :], m, rk2, inv_rw2, plus_one,
                        None if ones is None else ones[..., start:], out=out)   # (..., m, b - start)
        if host:
            _panel_steps_host(s_host, P, thr_host, start, m, E_host, pos, neg_h)
            Ep = xp.reshape(E, tuple(Kb.shape[:-2]) + (m,))
            cols.append(xp.asarray(Ep, copy=True))
        else:
            etas = []
            for l in range(m):
                i = start + l
                eta = xp.where(s[..., i] < thr[..., i], one, neg)
                etas.append(eta)
                if l + 1 < m:
                    s[..., i + 1:start + m] += eta[..., None] * P[..., l, l + 1:m]
            Ep = xp.stack(etas, axis=-1)                                  # (..., m)
            cols.append(Ep)
        if start + m < b:
            s[..., start + m:] += xp.matmul(Ep[..., None, :], P[..., :, m:])[..., 0, :]
    if out is not None and scratch is not None:
        scratch.give(*out)
    failed = to_numpy(xp.any(xp.abs(s) > c, axis=-1))
    return xp.concat(cols, axis=-1), failed


def _panel_steps_host(s, P, thr, start: int, m: int, E, pos, neg) -> None:
    """The m steps of one panel on numpy views: s (blocks, b), P (..., m, cols) the panel, thr (blocks, b); the
    signs go to E (blocks, m). Step l: eta = +1 iff s_i < thr_i, then s[i+1:start+m] += eta P[l, l+1:m]."""
    Ph = host_view(P).reshape(s.shape[0], m, -1)
    tmp = np.empty_like(E)
    for l in range(m):
        i = start + l
        e = E[:, l]
        np.copyto(e, np.where(s[:, i] < thr[:, i], pos, neg))
        if l + 1 < m:
            seg = s[:, i + 1:start + m]
            t = tmp[:, :m - l - 1]
            np.multiply(e[:, None], Ph[:, l, l + 1:m], out=t)
            np.add(seg, t, out=seg)


def panel_walk_stepwise(Kb, Wb, nk2, nw2, uniforms, c: float, *, panel: int = 32, plus_one: bool = False, ones=None):
    """The reference for :func:`panel_walk` (tests compare them): after each step, eta_i G[i, j] is added to every
    later s_j at once.

    The walk of :func:`kvbounds.algorithms.self_balancing_walk.gram_walk` on per-block Gram matrices that are
    never formed in full: the walk reads only the strictly lower triangle (x_i = sum_{j<i} eta_j G[i,j],
    and after choosing eta_i it adds eta_i G[j,i] to s_j for j > i), so we compute G column panel by
    column panel, rows from the panel's first column down: sum_p (b - p m) m of the b^2 entries, a
    fraction (P+1)/(2P) with P = b/m panels. Same arithmetic per entry as :func:`block_gram`, same
    signs given the same uniforms (up to the matmul's rounding).

    ``Kb`` (..., b, d) pre-scaled keys, ``Wb`` (..., b, e), ``nk2``/``nw2`` (..., b) squared norms
    (with ``plus_one`` the kernel is <w_i, w_j> + o_i o_j, nw2 must already include o_i^2, and ``ones``
    (..., b) gives o, default all 1: padded rows have o = 0 so that their Gram rows vanish),
    ``uniforms`` (..., b). Returns (signs (..., b), failed (...,) numpy bool)."""
    xp = array_namespace(Kb, Wb)
    b = Kb.shape[-2]
    m = panel if b % panel == 0 else b
    rk2, inv_rw2 = panel_scales(xp, nk2, nw2)
    s = xp.zeros(tuple(Kb.shape[:-1]), dtype=Kb.dtype, device=_dev(Kb))
    one = xp.ones_like(s[..., 0])
    neg = -one
    cols, xs = [], []
    for start in range(0, b, m):
        P = gram_panel(Kb[..., start:, :], Wb[..., start:, :], m, rk2, inv_rw2, plus_one,
                        None if ones is None else ones[..., start:])             # (..., m, b - start)
        for l in range(m):
            i = start + l
            x = s[..., i]
            xs.append(x)
            eta = xp.where(uniforms[..., i] < 0.5 - x / (2.0 * c), one, neg)   # p clipped to [0,1]: same test
            cols.append(eta)
            if i + 1 < b:
                s[..., i + 1:] += eta[..., None] * P[..., l, l + 1:]
    failed = to_numpy(xp.any(xp.abs(xp.stack(xs, axis=-1)) > c, axis=-1))
    return xp.stack(cols, axis=-1), failed


def walk_diagnostic(Kb, Wb, nk2, nw2, signs, c: float, m: int, *, plus_one: bool = False, ones=None) -> dict:
    """How far the walk of one level is from a fair coin: recomputes x_i = sum_{j<i} G_ij eta_j
    from the signs (the block Gram of :func:`block_gram`), p_i = clip(1/2 - x_i/(2c), 0, 1) over the m real
    tokens. Returns mean |p - 1/2|, the share of clipped p (|x| >= c), c and the median over blocks of
    log10 R^2, R^2 = e^{max ||k||^2/sqrt d} max ||w||^2 the normalisation of Alg. 2 line 6."""
    xp = array_namespace(Kb, Wb)
    b = Kb.shape[-2]
    G = _gram(Kb, Wb, nk2, nw2)
    if plus_one:
        o = xp.ones_like(nk2) if ones is None else xp.broadcast_to(ones, tuple(nk2.shape))
        rw2 = xp.max(nw2, axis=-1)[..., None, None]
        Gk = xp.exp(xp.matmul(Kb, xp.matrix_transpose(Kb)) - xp.max(nk2, axis=-1)[..., None, None])
        G = G + Gk * (o[..., :, None] * o[..., None, :]) / xp.where(rw2 > 0, rw2, xp.ones_like(rw2))
    lower = like(np.tril(np.ones((b, b)), -1), Kb)
    x = to_numpy(xp.matmul(G * lower, xp.astype(signs, Kb.dtype)[..., None])[..., 0])
    x = x.reshape(x.shape[0], -1)[:, :m]
    p = np.clip(0.5 - x / (2.0 * c), 0.0, 1.0)
    log_r2 = (to_numpy(xp.max(nk2, axis=-1)) + np.log(np.maximum(to_numpy(xp.max(nw2, axis=-1)), 1e-300))) / math.log(10)
    return dict(mean_abs_p_dev=float(np.mean(np.abs(p - 0.5))), clipped=float(np.mean(np.abs(x) >= c)), c=float(c),
                log10_R2=float(np.median(log_r2)), tokens=int(m))

"""Every public entry point of kvbounds.algorithms and traces.synthetic, as fuzz-harness entries (issue 11)."""
from __future__ import annotations

import math

import numpy as np

from fuzz_harness import RNG, Entry, as_numpy, compare_attention, make_array

from kvbounds.algorithms import attention as att
from kvbounds.algorithms import blockwise_balance_kv as bbk
from kvbounds.algorithms import blockwise_softmax as bsm
from kvbounds.algorithms import compressor_adapters as ca
from kvbounds.algorithms import index_reduction as ir
from kvbounds.algorithms import kcenter as kc
from kvbounds.algorithms import self_balancing_walk as sbw
from kvbounds.algorithms import softmax_balance as sb
from kvbounds.algorithms import subspace_attention as sa
from kvbounds.algorithms import token_selection as ts
from kvbounds.algorithms import uniform_sampling as us
from kvbounds.algorithms.balance_kv import BalanceKV
from kvbounds.algorithms.frequent_directions import FrequentDirections
from kvbounds.algorithms.merge_and_reduce import MergeAndReduce
from kvbounds.algorithms.subgen import SubGen
from kvbounds.traces import synthetic


def _sizes(rng, n_max=10, d_max=5, s_max=3):
    return int(rng.integers(1, n_max + 1)), int(rng.integers(1, d_max + 1)), int(rng.integers(1, s_max + 1))


def _qkv(rng, cls, *, batch_q=None):
    n, d, s = _sizes(rng)
    two = rng.random() < 0.5 if batch_q is None else batch_q
    q = make_array(rng, (int(rng.integers(1, 3)), d) if two else (d,), cls)
    return dict(q=q, K=make_array(rng, (n, d), cls), V=make_array(rng, (n, s), cls))


def _scale(scale, d):
    return 1.0 / math.sqrt(d) if scale is None else float(scale)


# -- attention --------------------------------------------------------------------------------------------

def _check_exact(out, q, K, V, scale):
    return compare_attention(out, q, K, V, _scale(scale, K.shape[1]))


def _check_weights(out, q, K, scale):
    n = K.shape[0]
    return compare_attention(np.asarray(as_numpy(out)), q, K, np.eye(n, dtype=K.dtype), _scale(scale, K.shape[1]))


def _check_causal(out, Q, K, V, scale):
    out = np.asarray(as_numpy(out))
    for j in range(Q.shape[0]):
        why = compare_attention(out[j], Q[j], K[:min(j + 1, K.shape[0])], V[:min(j + 1, K.shape[0])],
                                _scale(scale, K.shape[1]))
        if why:
            return f"query {j}: {why}"
    return None


def _causal_arrays(rng, cls):
    n, d, s = _sizes(rng, n_max=6)
    return dict(Q=make_array(rng, (n, d), cls), K=make_array(rng, (n, d), cls), V=make_array(rng, (n, s), cls))


ATTENTION = [
    Entry("exact_attention", _qkv, dict(scale=None), att.exact_attention, _check_exact),
    Entry("attention_weights", lambda r, c: {k: v for k, v in _qkv(r, c).items() if k != "V"}, dict(scale=None),
          att.attention_weights, _check_weights),
    Entry("causal_attention", _causal_arrays, dict(scale=None), att.causal_attention, _check_causal),
]


# -- uniform sampling -------------------------------------------------------------------------------------

def _check_select(out, n, m, rng, batch=()):
    out = np.asarray(out)
    if out.shape != tuple(batch) + (m,):
        return f"shape {out.shape}, expected {tuple(batch) + (m,)}"
    if m == 0:
        return None if out.size == 0 else f"indices {out} for m = 0"
    flat = out.reshape(-1, m)
    if flat.size and (flat.min() < 0 or flat.max() >= n or any(len(set(r)) != m for r in flat.tolist())
                      or np.any(np.diff(flat, axis=-1) <= 0)):
        return f"indices not sorted distinct in [0, {n}): {out}"
    return None


def _uniform_idx_arrays(rng, cls):
    a = _qkv(rng, cls)
    n = a["K"].shape[0]
    a["idx"] = np.sort(rng.choice(n, size=int(rng.integers(1, n + 1)), replace=False)).astype(np.int64)
    return a


def _check_parts(out, q, K, V, idx, scale):
    shift, num, den = (np.asarray(as_numpy(x), np.float64) for x in out)
    if np.any(den == 0):        # documented: sampled keys far below the all-keys shift underflow
        return None if np.all(num[den == 0] == 0) else "den = 0 but num != 0"
    return compare_attention(num / den[..., None], q, K[idx], V[idx], _scale(scale, K.shape[1]))


_REPLAY: dict = {}


def _uniform_estimate_call(q, K, V, m, rng, scale):
    # the reference replays the draw: remember the generator's state
    _REPLAY["rng"] = None
    if isinstance(rng, np.random.Generator):
        _REPLAY["rng"] = np.random.default_rng()
        _REPLAY["rng"].bit_generator.state = rng.bit_generator.state
    return us.uniform_estimate(q, K, V, m, rng, scale=scale)


def _check_uniform_estimate_replay(out, q, K, V, m, rng, scale):
    idx = us.uniform_select(K.shape[0], m, _REPLAY["rng"])
    return compare_attention(out, q, K[idx], V[idx], _scale(scale, K.shape[1]))


UNIFORM = [
    Entry("uniform_select", lambda r, c: {}, dict(n=7, m=3, rng=RNG, batch=()),
          lambda n, m, rng, batch: us.uniform_select(n, m, rng, batch=batch), _check_select),
    Entry("uniform_parts", _uniform_idx_arrays, dict(scale=None),
          lambda q, K, V, idx, scale: us.uniform_parts(q, K, V, idx, scale=scale), _check_parts),
    Entry("uniform_estimate", lambda r, c: _qkv(r, c), dict(m=1, rng=RNG, scale=None),
          _uniform_estimate_call, _check_uniform_estimate_replay),
]


# -- blockwise softmax ------------------------------------------------------------------------------------

def _chunk_arrays(rng, cls):
    s = int(rng.integers(1, 4))
    L1, L2 = int(rng.integers(0, 5)), int(rng.integers(1, 5))
    return dict(l1=make_array(rng, (L1,), cls), v1=make_array(rng, (L1, s), cls),
                l2=make_array(rng, (L2,), cls), v2=make_array(rng, (L2, s), cls),
                mask2=rng.random(L2) < 0.8)


def _chunks(l1, v1, l2, v2, mask2):
    return [(l1, v1), (l2, v2, None, mask2)]


def _check_blockwise(out, l1, v1, l2, v2, mask2):
    l = np.concatenate([np.asarray(l1, np.float64), np.where(mask2, l2, -np.inf)])
    keep = np.isfinite(l)
    V = np.concatenate([v1, v2])[keep]
    # logits as keys with a one-dimensional query 1: the attention reference with scale 1
    return compare_attention(out, np.ones(1), l[keep][:, None], V, 1.0)


BLOCKWISE_SOFTMAX = [
    Entry("blockwise_softmax", _chunk_arrays, {}, lambda **kw: bsm.blockwise_softmax(_chunks(**kw)), _check_blockwise),
    Entry("softmax_concat", _chunk_arrays, {}, lambda **kw: bsm.softmax_concat(_chunks(**kw)), _check_blockwise),
    Entry("OnlineSoftmax", _chunk_arrays, {},
          lambda l1, v1, l2, v2, mask2: bsm.OnlineSoftmax().add(l1, v1).add(l2, v2, mask=mask2).result(),
          _check_blockwise),
]


# -- k-center ---------------------------------------------------------------------------------------------

def _X(rng, cls):
    n, d, _ = _sizes(rng, n_max=12)
    return dict(X=make_array(rng, (n, d), cls))


def _check_kcenter(out, X, k, start=0):
    if X.ndim != 2:
        return None
    X = np.asarray(X, np.float64)
    C = np.asarray(as_numpy(out.centers))
    k_out = C.shape[-1]
    if len(set(C.tolist())) != k_out:
        return f"a centre is chosen twice: {C}"
    s = float(np.max(np.abs(X))) or 1.0
    Xs = X / s
    D = np.linalg.norm(Xs[:, None, :] - Xs[None, C, :], axis=-1)          # (n, k)
    ref = np.array([D[:, :j + 1].min(axis=1).max() for j in range(k_out)]) * s
    got = np.asarray(out.radii, np.float64)
    tol = 1e-6 * s * math.sqrt(X.shape[1]) + 1e-300
    if not np.all(np.abs(got - ref) <= tol):
        return f"radii {got} differ from the direct computation {ref}"
    return None


def _check_farthest_first(out, X, k, start, **kw):
    ref = kc.greedy_k_center(X, k, start=start)
    same = all(np.array_equal(getattr(out, f), getattr(ref, f)) for f in ("centers", "radii", "assignment", "exhausted"))
    return None if same else "differs from greedy_k_center"


KCENTER = [
    Entry("greedy_k_center", _X, dict(k=3, start=0), lambda X, k, start: kc.greedy_k_center(X, k, start=start),
          _check_kcenter),
    Entry("FarthestFirst", lambda r, c: dict(X=_X(r, c)["X"][None]), dict(k=3, start=0),
          lambda X, k, start: kc.FarthestFirst(X, start=start).result(k), _check_farthest_first, torch_ok=False),
    Entry("covering_radius_curve", _X, dict(k_max=3), lambda X, k_max: kc.covering_radius_curve(X, k_max)),
    Entry("normalized_radius", _X, dict(k=2), lambda X, k: kc.normalized_radius(X, k)),
    Entry("stream_cluster_counts", _X, dict(delta=0.5), lambda X, delta: kc.stream_cluster_counts(X, delta)),
    Entry("recent_plus_centers", lambda r, c: dict(K=_X(r, c)["X"]), dict(window=1, k=2, start="first"),
          lambda K, window, k, start: kc.recent_plus_centers(K, window=window, k=k, start=start)),
    Entry("clusterability", _X, dict(k=4, delta_rel=0.25, checkpoints=3),
          lambda X, k, delta_rel, checkpoints: kc.clusterability(X, k=k, delta_rel=delta_rel, checkpoints=checkpoints)),
]


# -- walks and balancing ----------------------------------------------------------------------------------

def _check_signs(out, **kw):
    s = np.asarray(as_numpy(out))
    return None if np.all(np.abs(s) == 1) else f"signs not +-1: {s}"


def _kv(rng, cls, n_max=10):
    n, d, s = _sizes(rng, n_max=n_max)
    return dict(K=make_array(rng, (n, d), cls), V=make_array(rng, (n, s), cls))


def _kvq(rng, cls):
    a = _kv(rng, cls)
    a["q"] = make_array(rng, (a["K"].shape[1],), cls)
    a["signs"] = np.where(rng.random(a["K"].shape[0]) < 0.5, -1.0, 1.0)
    return a


def _check_balance(out, K, **kw):
    keep = np.asarray(as_numpy(out.keep))
    return None if keep.dtype == bool and 2 * keep.sum() <= keep.shape[-1] else f"keep {keep} is not a smaller side"


WALKS = [
    Entry("self_balancing_walk", lambda r, c: dict(U=_X(r, c)["X"]), dict(delta=0.1, rng=RNG, r=None, c=None),
          lambda U, delta, rng, r, c: sbw.self_balancing_walk(U, delta=delta, rng=rng, r=r, c=c), _check_signs),
    Entry("walk_constant", lambda r, c: {}, dict(n=8, delta=0.1), lambda n, delta: sbw.walk_constant(n, delta)),
    Entry("softmax_balance", _kv, dict(delta=0.1, rng=RNG, r_key=None, r_value=None, memory="gram"),
          lambda K, V, delta, rng, r_key, r_value, memory: sb.softmax_balance(
              K, V, delta=delta, rng=rng, r_key=r_key, r_value=r_value, memory=memory, on_fail="continue"),
          _check_balance),
    Entry("softmax_balance[panel]", _kv, dict(delta=0.1, rng=RNG, r_key=None, r_value=None, memory="panel"),
          lambda K, V, delta, rng, r_key, r_value, memory: sb.softmax_balance(
              K, V, delta=delta, rng=rng, r_key=r_key, r_value=r_value, memory=memory, on_fail="continue"),
          _check_balance),
    Entry("normalized_kernel_gram", _kv, dict(r_key=10.0, r_value=10.0, scale=None),
          lambda K, V, r_key, r_value, scale: sb.normalized_kernel_gram(K, V, r_key, r_value, scale=scale)),
    Entry("signed_kernel_sum", _kvq, dict(scale=None),
          lambda K, V, signs, q, scale: sb.signed_kernel_sum(K, V, signs, q, scale=scale)),
]


# -- streaming estimators ---------------------------------------------------------------------------------

def _stream(rng, cls):
    n, d, s = _sizes(rng, n_max=12)
    return dict(K=make_array(rng, (n, d), cls), V=make_array(rng, (n, s), cls), q=make_array(rng, (d,), cls))


def _feed(update, K, V):
    """update(k_j, v_j) for the rows of a well-formed stream; a malformed one goes to update() as it is."""
    if not (hasattr(K, "ndim") and hasattr(V, "ndim") and K.ndim == 2 and V.ndim == 2 and K.shape[0] == V.shape[0]):
        return update(K, V)
    for j in range(K.shape[0]):
        update(K[j], V[j])


def _mr_call(K, V, q, t, T, delta, r_key, scale):
    mr = MergeAndReduce(K.shape[-1] if hasattr(K, "shape") and K.ndim == 2 else 1,
                        V.shape[-1] if hasattr(V, "shape") and V.ndim == 2 else 1,
                        t=t, T=T, delta=delta, rng=np.random.default_rng(0), r_key=r_key, scale=scale)
    _feed(mr.update, K, V)
    return mr.estimate(q)


def _mr_ok(out, **kw):
    m, u = out
    return m == -math.inf and bool(np.all(np.asarray(as_numpy(u)) == 0))


def _bkv_call(K, V, q, batch_size, levels, eps, r, delta, seed):
    bkv = BalanceKV(K.shape[-1] if hasattr(K, "shape") and K.ndim == 2 else 1, batch_size=batch_size, levels=levels,
                    eps=eps, r=r, delta=delta, seed=seed)
    _feed(bkv.update, K, V)
    return bkv.query(q)


def _bounded_stream(rng, cls):
    a = _stream(rng, cls)
    for k in ("K", "q"):                                  # BalanceKV needs ||k|| <= r
        x = np.asarray(a[k], np.float64)
        nrm = np.linalg.norm(x, axis=-1, keepdims=True)
        a[k] = np.where(nrm > 4.0, x / np.where(nrm > 0, nrm, 1) * 4.0, x).astype(a[k].dtype)
    return a


def _subgen_call(K, V, Q, delta, s, t, seed, scaled):
    sg = SubGen(K.shape[-1] if hasattr(K, "shape") and K.ndim == 2 else 1, delta=delta, s=s, t=t, seed=seed,
                scaled=scaled)
    return sg.stream(K, V, Q)


def _subgen_arrays(rng, cls):
    n, d, s = _sizes(rng, n_max=8)
    return dict(K=make_array(rng, (n, d), cls), V=make_array(rng, (n, s), cls), Q=make_array(rng, (n, d), cls))


def _fd_call(A, B, ell):
    fd = FrequentDirections(A.shape[-1] if hasattr(A, "shape") and A.ndim else 1, ell)
    fd.update(A)
    fd.update(B)
    return fd.sketch(), fd.certificate(), fd.sketch(compact=True), fd.certificate(compact=True)


def _fd_arrays(rng, cls):
    n, d, _ = _sizes(rng, n_max=12)
    return dict(A=make_array(rng, (n, d), cls), B=make_array(rng, (int(rng.integers(0, 6)), d), cls))


def _check_fd(out, A, B, ell):
    S, delta, Sc, delta_c = (np.asarray(as_numpy(x), np.float64) for x in out)
    M = np.concatenate([np.atleast_2d(A), np.atleast_2d(B)]).astype(np.float64)
    s = 2.0 ** math.frexp(float(np.max(np.abs(M))))[1] if np.any(M) else 1.0
    G = (M / s).T @ (M / s) - (S / s).T @ (S / s)
    ev = np.linalg.eigvalsh((G + G.T) / 2)
    tol = 1e-5 * (np.linalg.norm(M / s) ** 2 + 1) if M.dtype == np.float64 and A.dtype == np.float64 else 1e-2 * (np.linalg.norm(M / s) ** 2 + 1)
    tol += np.finfo(np.float64).tiny / s / s      # the certificate is absolute: below float64's range it is 0
    cert = float(delta) / s / s
    if ev.min() < -tol or ev.max() > cert + tol:
        return f"A^T A - S^T S has eigenvalues [{ev.min():.3g}, {ev.max():.3g}], certificate {cert:.3g}"
    return None


STREAMING = [
    Entry("MergeAndReduce", _stream, dict(t=2, T=2, delta=0.1, r_key=None, scale=None), _mr_call,
          nonfinite_ok=_mr_ok),
    Entry("BalanceKV", _bounded_stream, dict(batch_size=2, levels=2, eps=0.5, r=4.0, delta=0.1, seed=0), _bkv_call),
    Entry("SubGen.stream", _subgen_arrays, dict(delta=0.5, s=2, t=2, seed=0, scaled=True), _subgen_call),
    Entry("FrequentDirections", _fd_arrays, dict(ell=2), _fd_call, _check_fd),
]


# -- blockwise BalanceKV and token selection --------------------------------------------------------------

def _check_select_idx(out, K, levels, **kw):
    idx = np.asarray(as_numpy(out))
    n = K.shape[-2]
    return None if idx.shape[-1] == n >> levels and (idx.size == 0 or (idx.min() >= 0 and idx.max() < n)) \
        else f"indices {idx} for n = {n}, levels = {levels}"


def _weighted_arrays(rng, cls):
    a = _qkv(rng, cls)
    n = a["K"].shape[0]
    m = int(rng.integers(1, n + 1))
    a["idx"] = np.sort(rng.choice(n, size=m, replace=False)).astype(np.int64)
    a["logw"] = (rng.integers(0, 3, m) * math.log(2.0)).astype(a["K"].dtype)
    return a


def _check_weighted(out, q, K, V, idx, logw, scale):
    return compare_attention(out, q, K[idx], V[idx], _scale(scale, K.shape[1]), extra=logw)


BLOCKWISE = [
    Entry("blockwise_balance_select", lambda r, c: _kv(r, c, 16), dict(block_size=4, levels=1, rng=RNG, delta=0.01,
                                                                       c=None, value_kernel="value+1"),
          lambda K, V, **kw: bbk.blockwise_balance_select(K, V, **kw), _check_select_idx),
    Entry("compress_cache", lambda r, c: _kv(r, c, 16), dict(sink=1, window=1, levels=1, block_size=4, rng=RNG,
                                                             method="balance"),
          lambda K, V, **kw: bbk.compress_cache(K, V, **kw)),
    Entry("weighted_attention", _weighted_arrays, dict(scale=None),
          lambda q, K, V, idx, logw, scale: bbk.weighted_attention(q, K, V, idx, logw, scale=scale), _check_weighted),
    Entry("block_gram", lambda r, c: dict(Kb=_X(r, c)["X"], Wb=_X(r, c)["X"]), dict(scale=0.5),
          lambda Kb, Wb, scale: bbk.block_gram(Kb, Wb, scale=scale)),
]


def _selection_entry(name: str, kwargs: dict):
    def call(K, V, Q, q, budget, rng, **sel_kw):
        sel = ts.make_selector(name, **sel_kw)
        idx, lw = sel.select(K, V, budget=budget, rng=rng, Q=Q)
        return ts.estimate(q, K, V, idx, lw)

    def arrays(rng, cls):
        a = _kv(rng, cls, 12)
        a["Q"] = make_array(rng, a["K"].shape, cls)
        a["q"] = make_array(rng, a["K"].shape[1:], cls)
        return a

    return Entry(f"select[{name}]", arrays, dict(budget=4, rng=RNG, **kwargs), call)


def _kernel_thinning_entry():
    """KernelThinning (kvbounds.algorithms.kernel_thinning; an InputError naming the extra without goodpoints)."""
    def call(K, V, Q, q, budget, rng, **kw):
        from kvbounds.algorithms.kernel_thinning import KernelThinning
        idx, lw = KernelThinning(**kw).select(K, V, budget=budget, rng=rng, Q=Q)
        return ts.estimate(q, K, V, idx, lw)

    return Entry("select[kernel_thinning]", _selection_entry("uniform", {}).arrays, dict(budget=4, rng=RNG, sink=1,
                                                                                           window=1), call)


SELECTION = [_selection_entry(n, kw) for n, kw in (
    ("streaming_llm", dict(sink=1)), ("h2o", dict(recent=1)), ("uniform", dict(sink=1, window=1)),
    ("kcenter", dict(window=1, weights="cluster_size")), ("balancekv", dict(sink=1, window=1, block_size=2)))] + [
    _kernel_thinning_entry()] + [
    Entry("relative_error", _weighted_arrays, dict(scale=None),
          lambda q, K, V, idx, logw, scale: ts.relative_error(q, K, V, idx, logw, scale=scale),
          nonfinite_ok=lambda out, V, **kw: not np.any(np.asarray(as_numpy(V))))]


# -- subspace attention -----------------------------------------------------------------------------------

def _basis(rng, d, r, dtype):
    return np.linalg.qr(rng.standard_normal((d, r)))[0].T.astype(dtype)


def _static_arrays(rng, cls):
    a = _stream(rng, cls)
    d, s = a["K"].shape[1], a["V"].shape[1]
    a["B"] = _basis(rng, d, int(rng.integers(1, d + 1)), a["K"].dtype)
    a["E"] = _basis(rng, s, int(rng.integers(1, s + 1)), a["K"].dtype)
    return a


def _static_call(K, V, q, B, E, gamma):
    return sa.StaticSubspaceAttention(B, E, gamma=gamma).extend(K, V).attend(q)


def _calib_call(K, V, q, B, E, r, r_v, gamma):
    Q = K if gamma == "calibrated" else None
    return sa.StaticSubspaceAttention.from_calibration(K, V, r, r_v, gamma=gamma, Q_cal=Q).extend(K, V).attend(q)


def _adaptive_call(K, V, q, r, ell, tau, L):
    d = K.shape[-1] if hasattr(K, "shape") and K.ndim == 2 else 1
    dv = V.shape[-1] if hasattr(V, "shape") and V.ndim == 2 else 1
    r_ = min(r, d, dv) if isinstance(r, int) and not isinstance(r, bool) else r
    m = sa.AdaptiveSubspaceAttention(d, r_, r_, ell_k=ell, ell_v=ell, tau_k=tau, tau_v=tau, L=L, d_v=dv)
    return m.extend(K, V).attend(q)


def _decode_arrays(rng, cls):
    J, r, L, d = (int(rng.integers(1, 4)) for _ in range(4))
    return dict(q=make_array(rng, (d,), cls), B=make_array(rng, (J, r, d), cls), E=make_array(rng, (J, r, d), cls),
                C=make_array(rng, (J, r, L), cls), D=make_array(rng, (J, r, L), cls))


SUBSPACE = [
    Entry("calibrate_gamma", lambda r, c: _calib_arrays(r, c), {}, lambda Q, K, B: sa.calibrate_gamma(Q, K, B)),
    Entry("top_basis", _X, dict(r=1), lambda X, r: sa.top_basis(X, r)),
    Entry("resolve_gamma", lambda r, c: {}, dict(gamma="sqrt(r/d)", r=2, d=4, calibrated=None),
          lambda gamma, r, d, calibrated: sa.resolve_gamma(gamma, r, d, calibrated)),
    Entry("StaticSubspaceAttention", _static_arrays, dict(gamma="sqrt(r/d)"), _static_call),
    Entry("StaticSubspaceAttention.from_calibration", _static_arrays, dict(r=1, r_v=1, gamma="calibrated"),
          _calib_call),
    Entry("AdaptiveSubspaceAttention", _stream, dict(r=1, ell=2, tau=0.5, L=4), _adaptive_call),
    Entry("coefficient_decode", _decode_arrays, dict(gamma=1.0),
          lambda q, B, E, C, D, gamma: sa.coefficient_decode(q, B, E, C, D, gamma=gamma)),
    Entry("exact_decode", lambda r, c: _qkv(r, c, batch_q=False), {},
          lambda q, K, V: sa.exact_decode(q, K, V),
          lambda out, q, K, V: compare_attention(out, q, K, V, 1.0 / math.sqrt(K.shape[1]))),
]


def _calib_arrays(rng, cls):
    a = _static_arrays(rng, cls)
    return dict(Q=make_array(rng, (int(rng.integers(1, 4)), a["K"].shape[1]), cls), K=a["K"], B=a["B"])


# -- compressor adapters, INDEX reduction, synthetic traces -----------------------------------------------

def _compressor_call(K, V, q, name, setting, seed):
    comp = ca.make_compressor(name, setting, d=4, r=1.0, u_size=K.shape[0] if hasattr(K, "shape") and K.ndim else 0,
                              seed=seed)
    comp.consume(K, V)
    return comp.query(q)


def _index_arrays(rng, cls):
    inst = ir.random_instance(8, 4, 1.0, rng)
    _, K, V = inst.stream()
    if K.shape[0] == 0:
        K, V = inst.keys[:1], inst.values[:1]
    return dict(K=K.astype(np.float32) if cls == "float32" else K, V=V.astype(np.float32) if cls == "float32" else V,
                q=inst.keys[0].astype(np.float32) if cls == "float32" else inst.keys[0])


ADAPTERS = [Entry(f"compressor[{name}]", _index_arrays, dict(name=name, setting=3, seed=0), _compressor_call)
            for name in ("uniform", "balancekv", "blockwise", "subgen")] + [
    Entry("random_instance", lambda r, c: {}, dict(n=8, d=4, r=1.0, rng=RNG),
          lambda n, d, r, rng: ir.random_instance(n, d, r, rng).stream()),
]


def _trace_call(kind, n, d, s, seed, **kw):
    tr = synthetic.make_trace(kind, n=n, d=d, s=s, seed=seed, **kw)
    return tr.Q, tr.K, tr.V


TRACES = [Entry(f"make_trace[{kind}]", lambda r, c: {}, dict(kind=kind, n=6, d=3, s=2, seed=0, **kw), _trace_call)
          for kind, kw in (("gaussian", dict(scale=1.0)), ("bounded_norm", dict(r=1.0)),
                           ("clustered", dict(m=2, r=1.0, spread=0.05)), ("low_rank", dict(rank=1, r=1.0, noise=0.01)),
                           ("heavy_tailed_values", dict(r=1.0, tail=1.5)))]

ENTRIES = (ATTENTION + UNIFORM + BLOCKWISE_SOFTMAX + KCENTER + WALKS + STREAMING + BLOCKWISE + SELECTION + SUBSPACE
           + ADAPTERS + TRACES)


# -- helpers that are public too ----------------------------------------------------------------------------

def _gram_arrays(rng, cls):
    n = int(rng.integers(1, 8))
    X = make_array(rng, (n, 3), cls)
    G = np.asarray(X, np.float64) @ np.asarray(X, np.float64).T
    g = float(np.max(np.abs(G))) if np.all(np.isfinite(G)) and np.any(G) else 1.0
    return dict(G=(G / g).astype(X.dtype), uniforms=rng.random(n).astype(X.dtype))


def _walk_arrays(rng, cls):
    return dict(U=_X(rng, cls)["X"])


def _check_softmax_weights(out, q, K, scale):
    if q.ndim > 2 or K.ndim != 2:
        return None
    return compare_attention(out, q, K, np.eye(K.shape[0], dtype=K.dtype), float(scale))


EXTRA = [
    Entry("softmax_weights", lambda r, c: {k: v for k, v in _qkv(r, c).items() if k != "V"},
          dict(scale=0.5), lambda q, K, scale: att.softmax_weights(q, K, scale), _check_softmax_weights),
    Entry("gram_walk", _gram_arrays, dict(c=2.0), lambda G, uniforms, c: sbw.gram_walk(G, uniforms, c, on_fail="continue")),
    Entry("self_balancing_walk_result", _walk_arrays, dict(delta=0.1, rng=RNG),
          lambda U, delta, rng: sbw.self_balancing_walk_result(U, delta=delta, rng=rng, on_fail="continue")),
    Entry("smaller_side", lambda r, c: dict(signs=np.where(r.random(int(r.integers(1, 9))) < .5, -1.0, 1.0)), {},
          lambda signs: sbw.smaller_side(signs)),
    Entry("erase_threshold+bucket_index", lambda r, c: {}, dict(rule="alg1", eps=0.5, n=8, r=2.0, d=4, vmax=3.0),
          lambda rule, eps, n, r, d, vmax: (bkv_mod.erase_threshold(rule, eps=eps, n=n, r=r, d=d, vmax=vmax),
                                            bkv_mod.bucket_index(vmax))),
    Entry("shrunk", lambda r, c: dict(B=_X(r, c)["X"]), dict(ell=2),
          lambda B, ell: fd_mod.shrunk(B, ell, keep=ell - 1 if isinstance(ell, int) else ell, out_rows=2 * ell
                                       if isinstance(ell, int) else ell)),
    Entry("draw_slot_batch+group_attention", lambda r, c: {}, dict(R=3, n=8, d=4, r=1.0, rng=RNG),
          lambda R, n, d, r, rng: ir.group_attention(ir.draw_slot_batch(R, n, d, r, rng))),
    Entry("draw_public_coins", lambda r, c: {}, dict(n=8, d=4, r=1.0, rng=RNG),
          lambda n, d, r, rng: ir.draw_public_coins(n, d, r, rng)),
]

from kvbounds.algorithms import balance_kv as bkv_mod  # noqa: E402
from kvbounds.algorithms import frequent_directions as fd_mod  # noqa: E402

ENTRIES = ENTRIES + EXTRA


# -- the released BalanceKV walk, the end-to-end contract (CompressedKV), FD's eigh path -----------------------

from kvbounds.algorithms import balance_kv_released as bkr  # noqa: E402

LOG2 = math.log(2.0)


def _signs_arrays(rng, cls):
    B, m = int(rng.integers(1, 4)), int(rng.integers(1, 10))
    return dict(signs=np.where(rng.random((B, m)) < 0.5, -1, 1).astype(np.int64))


def _check_cut_weights(out, signs):
    """A direct transcription of the rule: the first positions where #(-1), #(+1) reach m // 2."""
    out = np.asarray(out)
    for b, row in enumerate(np.asarray(signs).tolist()):
        m, half = len(row), len(row) // 2

        def first(v):
            cnt = 0
            for i, x in enumerate(row):
                cnt += x == v
                if cnt == half:
                    return i
            return 0
        c = max(first(-1), first(1))
        ref = [(-2 if x == row[c] else 2) if i <= c else 1 for i, x in enumerate(row)]
        if out[b].tolist() != ref:
            return f"row {b} {row}: weights {out[b].tolist()}, expected {ref}"
    return None


def _check_released_select(out, K, V, levels, **kw):
    idx, w = (np.asarray(as_numpy(x)) for x in out)
    n = K.shape[-2]
    m = n >> levels
    if idx.shape != K.shape[:-2] + (m,) or w.shape != idx.shape:
        return f"shapes {idx.shape}, {w.shape}; expected {K.shape[:-2] + (m,)}"
    flat = idx.reshape(-1, m)
    if flat.size and (flat.min() < 0 or flat.max() >= n or any(len(set(r)) != m for r in flat.tolist())):
        return f"indices {idx} not distinct in [0, {n})"
    if not np.all(np.isin(w, [2 ** t for t in range(levels + 1)])):
        return f"weights {w} not products of levels = {levels} factors 1 or 2"
    return None


WALK_PARAMS = dict(gamma=4.0, temp=1.0, beta=0.0, kernel_const=0.025, walk_c=None)


def _check_compress_released(out, K, V, sink, window, levels, estimator, **kw):
    idx, lwn, lwd = (np.asarray(as_numpy(x), np.float64) for x in out)
    n = K.shape[-2]
    kept = sink + window + ((n - sink - window) >> levels)
    if idx.shape != K.shape[:-2] + (kept,) or lwn.shape != idx.shape or lwd.shape != idx.shape:
        return f"shape {idx.shape}, expected {K.shape[:-2] + (kept,)}"
    flat = idx.reshape(-1, kept)
    if np.any(np.diff(flat, axis=-1) <= 0) or (flat.size and (flat.min() < 0 or flat.max() >= n)):
        return f"indices {idx} not sorted distinct in [0, {n})"
    exact = np.r_[np.arange(sink), np.arange(n - window, n)]
    if not np.all(flat[:, :sink] == np.arange(sink)) or not np.all(flat[:, kept - window:] == np.arange(n - window, n)):
        return f"sink/window tokens {exact} not all kept: {idx}"
    mid = slice(sink, kept - window)
    if np.any(lwn[..., :sink]) or np.any(lwd[..., :sink]) or np.any(lwn[..., kept - window:]) \
            or np.any(lwd[..., kept - window:]):
        return "non-zero log-weights on the exact tokens"
    ln, ld = lwn[..., mid] / LOG2, lwd[..., mid] / LOG2
    tol = 1e-5
    if np.any(np.abs(ln - np.rint(ln)) > tol) or np.any(ln < -tol) or np.any(ln > levels + tol):
        return f"log_w_num / log 2 = {ln} not integers in [0, {levels}]"
    if estimator == "released" and np.any(np.abs(ld - levels) > tol):
        return f"log_w_den {lwd} != levels log 2"
    return None


def _check_log_weights(out, weights, levels, estimator):
    lw, flat = (np.asarray(as_numpy(x), np.float64) for x in out)
    ref_n = np.log(np.asarray(weights, np.float64)) if estimator != "unweighted" else np.full(weights.shape, levels * LOG2)
    ref_d = np.full(weights.shape, levels * LOG2) if estimator == "released" else \
        (ref_n if estimator == "consistent" else np.full(weights.shape, levels * LOG2))
    ok = lw.shape == ref_n.shape and np.allclose(lw, ref_n, rtol=1e-12, atol=0) and np.allclose(flat, ref_d, rtol=1e-12, atol=0)
    return None if ok else f"({lw}, {flat}) != ({ref_n}, {ref_d})"


def _split_arrays(rng, cls):
    a = _weighted_arrays(rng, cls)
    w = a.pop("logw")
    a["log_w_num"] = w
    a["log_w_den"] = (rng.integers(0, 3, w.shape[0]) * LOG2).astype(w.dtype) if rng.random() < 0.5 else w.copy()
    return a


def _check_split(out, q, K, V, idx, log_w_num, log_w_den, scale):
    lwn, lwd = np.asarray(log_w_num, np.float64), np.asarray(log_w_den, np.float64)
    # sum_i e^{s_i + lwd_i} (e^{lwn_i - lwd_i} v_i) / sum_i e^{s_i + lwd_i}; lwn = lwd = 0 and all indices: exact
    Vw = np.asarray(V, np.float64)[idx] * np.exp(lwn - lwd)[:, None]
    return compare_attention(out, q, K[idx], Vw, _scale(scale, K.shape[1]), extra=lwd)


def _ckv_arrays(rng, cls):
    H, m, d, dv = (int(rng.integers(1, 3)), int(rng.integers(1, 7)), int(rng.integers(1, 4)),
                   int(rng.integers(1, 4)))
    choices = np.array([0.0, 0.0, LOG2, 2 * LOG2, -np.inf, 0.5])
    return dict(keys=make_array(rng, (H, m, d), cls), values=make_array(rng, (H, m, dv), cls),
                a=choices[rng.integers(0, 6, (H, m))], b=choices[rng.integers(0, 6, (H, m))])


def _memory_call(keys, values, a, b, extra_floats):
    return ts.memory_floats(ts.CompressedKV(keys, values, a, b, extra_floats=extra_floats))


def _check_memory(out, keys, values, a, b, extra_floats):
    """A hand count, token by token: key if either side uses it, value if the numerator does; weights
    per head and side (none for a = b = 0 tokens, one when constant, else one per token, a = b once); keys and
    values each at their own width."""
    d, dv = keys.shape[-1], values.shape[-1]
    total = extra_floats
    for h in range(a.shape[0]):
        wa, wb = [], []
        for i in range(a.shape[1]):
            ua, ub = math.isfinite(a[h, i]), math.isfinite(b[h, i])
            total += d * (ua or ub) + dv * ua
            if (ua or ub) and not (a[h, i] == 0 and b[h, i] == 0):
                wa.append(a[h, i])
                wb.append(b[h, i])
        if wa == wb:
            total += 0 if not wa else (1 if len(set(wa)) == 1 else len(wa))
        else:
            for side in ([x for x in wa if math.isfinite(x)], [x for x in wb if math.isfinite(x)]):
                total += 0 if not side else (1 if len(set(side)) == 1 else len(side))
    return None if out == total else f"memory_floats = {out}, hand count {total}"


def _gather_arrays(rng, cls):
    a = _kv(rng, cls, 8)
    H = int(rng.integers(1, 3))
    a["K"], a["V"] = np.stack([a["K"]] * H), np.stack([a["V"]] * H)
    n = a["K"].shape[1]
    a["indices"] = rng.integers(0, n, (H, int(rng.integers(1, n + 1)))).astype(np.int64)
    a["log_weights"] = (rng.integers(0, 3, a["indices"].shape) * LOG2)
    return a


def _check_gather(out, K, V, indices, log_weights):
    K, V, indices, log_weights = (np.asarray(as_numpy(x)) for x in (K, V, indices, log_weights))
    out = ts.CompressedKV(*(np.asarray(as_numpy(x)) for x in (out.keys, out.values, out.log_w_num, out.log_w_den)))
    indices = np.broadcast_to(indices, K.shape[:1] + indices.shape[-1:])
    log_weights = np.broadcast_to(log_weights, indices.shape)
    for h in range(K.shape[0]):
        if not (np.array_equal(out.keys[h], K[h][indices[h]]) and np.array_equal(out.values[h], V[h][indices[h]])
                and np.allclose(out.log_w_num[h], log_weights[h], rtol=1e-6) and np.array_equal(out.log_w_num, out.log_w_den)):
            return f"head {h}: the gathered selection differs from numpy's fancy indexing"
    return None


def _concat_call(keys, values, a, b, extra_floats):
    p = ts.CompressedKV(keys, values, a, b, extra_floats=extra_floats)
    q = ts.CompressedKV(keys[..., :1, :], values[..., :1, :], a[..., :1], b[..., :1])
    return ca.concat_compressed([p, q])


def _check_concat(out, keys, values, a, b, extra_floats):
    ok = (np.array_equal(out.keys, np.concatenate([keys, keys[..., :1, :]], -2))
          and np.array_equal(out.values, np.concatenate([values, values[..., :1, :]], -2))
          and np.array_equal(out.log_w_num, np.concatenate([a, a[..., :1]], -1))
          and np.array_equal(out.log_w_den, np.concatenate([b, b[..., :1]], -1)) and out.extra_floats == extra_floats)
    return None if ok else "concatenation differs from numpy's"


def _cache_arrays(rng, cls):
    H, n, d = int(rng.integers(1, 3)), int(rng.integers(3, 14)), int(rng.integers(1, 4))
    return dict(K=make_array(rng, (H, n, d), cls), V=make_array(rng, (H, n, d), cls))


def _compressor_e2e_call(cls_):
    def call(K, V, sink, window, budget_floats, rng):
        return cls_(sink=sink, window=window).compress(K, V, budget_floats=budget_floats, rng=rng)
    return call


def _ckv_nonfinite_ok(out, **kw):
    """SubGen's representatives / samples flag the unused side with log-weight -inf (documented). The cache lives
    on the input's backend (torch in, torch out): compared on the host."""
    keys, values, a, b = (np.asarray(as_numpy(x)) for x in (out.keys, out.values, out.log_w_num, out.log_w_den))
    return bool(np.all(np.isfinite(keys)) and np.all(np.isfinite(values))
                and np.all(np.isfinite(a) | (a == -np.inf)) and np.all(np.isfinite(b) | (b == -np.inf)))


def _check_e2e_compressor(out, K, V, sink, window, budget_floats, rng):
    n = K.shape[1]
    K, out = np.asarray(as_numpy(K)), ts.CompressedKV(*(np.asarray(as_numpy(x)) for x in (
        out.keys, out.values, out.log_w_num, out.log_w_den)))
    if not (np.array_equal(out.keys[:, :sink], K[:, :sink].astype(np.float32))
            and np.array_equal(out.keys[:, out.keys.shape[1] - window:], K[:, n - window:].astype(np.float32))):
        return "sink/window keys not kept exactly"
    return None


E2E = [
    Entry("cut_weights", _signs_arrays, {}, lambda signs: bkr.cut_weights(signs), _check_cut_weights, torch_ok=False),
    Entry("released_select", lambda r, c: _kv(r, c, 16), dict(levels=1, block_size=4, rng=RNG, **WALK_PARAMS),
          lambda K, V, **kw: bkr.released_select(K, V, **kw), _check_released_select),
    Entry("released_select[walk_c]", lambda r, c: _kv(r, c, 16), dict(levels=2, block_size=2, rng=RNG, walk_c=30.0,
                                                                      temp=0.1),
          lambda K, V, **kw: bkr.released_select(K, V, **kw), _check_released_select),
    Entry("compress_cache_released", lambda r, c: _kv(r, c, 16),
          dict(sink=1, window=1, levels=1, block_size=4, rng=RNG, estimator="released"),
          lambda K, V, **kw: bkr.compress_cache_released(K, V, **kw), _check_compress_released),
    Entry("released_log_weights", lambda r, c: dict(weights=2 ** r.integers(0, 3, (2, int(r.integers(1, 5))))),
          dict(levels=2, estimator="released"),
          lambda weights, levels, estimator: bkr.released_log_weights(weights, levels, estimator), _check_log_weights),
    Entry("expand_groups", lambda r, c: dict(x=make_array(r, (int(r.integers(1, 3)), int(r.integers(1, 5))), c)),
          dict(group=2), lambda x, group: bkr.expand_groups(x, group),
          lambda out, x, group: None if x.ndim < 2 or np.array_equal(np.asarray(as_numpy(out)), np.repeat(x, group, axis=-2),
                                                                     equal_nan=x.dtype.kind in "fc")
          else "differs from np.repeat",
          nonfinite_ok=lambda out, x, group: not np.all(np.isfinite(np.asarray(as_numpy(x))))),
    Entry("split_weighted_attention", _split_arrays, dict(scale=None),
          lambda q, K, V, idx, log_w_num, log_w_den, scale: bkr.split_weighted_attention(
              q, K, V, idx, log_w_num, log_w_den, scale=scale), _check_split),
    Entry("split_weighted_attention[exact]", lambda r, c: _qkv(r, c), dict(scale=None),
          lambda q, K, V, scale: bkr.split_weighted_attention(
              q, K, V, np.arange(K.shape[0]) if hasattr(K, "shape") and K.ndim == 2 else np.arange(1),
              *(2 * [np.zeros(K.shape[0], dtype=K.dtype) if hasattr(K, "shape") and K.ndim == 2 else np.zeros(1)]),
              scale=scale) if not hasattr(K, "numpy") else bkr.split_weighted_attention(
              q, K, V, __import__("torch").arange(K.shape[0]), *(2 * [__import__("torch").zeros(K.shape[0], dtype=K.dtype)]),
              scale=scale),
          _check_exact),
    Entry("theory_walk_c", lambda r, c: {}, dict(block_size=8, delta=0.01),
          lambda block_size, delta: bkr.theory_walk_c(block_size, delta),
          lambda out, block_size, delta: None if math.isclose(out, 30 * math.log(block_size / delta)) else f"{out}"),
    Entry("memory_floats", _ckv_arrays, dict(extra_floats=3), _memory_call, _check_memory, torch_ok=False),
    Entry("gather_selection", _gather_arrays, {}, lambda **kw: ts.gather_selection(**kw), _check_gather),
    Entry("concat_compressed", _ckv_arrays, dict(extra_floats=3), _concat_call, _check_concat, torch_ok=False,
          nonfinite_ok=_ckv_nonfinite_ok),
    Entry("SubGenCompressor", _cache_arrays, dict(sink=1, window=1, budget_floats=40, rng=RNG),
          _compressor_e2e_call(ca.SubGenCompressor), _check_e2e_compressor, nonfinite_ok=_ckv_nonfinite_ok),
    Entry("SubspaceCompressor", _cache_arrays, dict(sink=1, window=1, budget_floats=40, rng=RNG),
          _compressor_e2e_call(ca.SubspaceCompressor), _check_e2e_compressor),
    Entry("shrunk_gram", lambda r, c: dict(B=make_array(r, (int(r.integers(0, 4)), int(r.integers(4, 7))), c)),
          dict(ell=2), lambda B, ell: fd_mod.shrunk_gram(B, ell, keep=ell - 1 if isinstance(ell, int) else ell,
                                                           out_rows=2 * ell if isinstance(ell, int) else ell),
          torch_ok=False),
]

ENTRIES = ENTRIES + E2E

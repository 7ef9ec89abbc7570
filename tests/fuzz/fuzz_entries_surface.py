"""Fuzz entries of issue 24: the surfaces added after issue 11 (the compressed-cache contract's estimate, the walks
of kvbounds.algorithms.block_walk and kvbounds.gpu, the backend layer, the end-to-end layer's array functions,
the weighted attention and cache of the transformers integration, the kvpress presses, the equal-memory
budget solver)."""
from __future__ import annotations

import math

import numpy as np

from fuzz_harness import RNG, Entry, as_numpy, eps_of, make_array

from kvbounds.algorithms import block_walk as bw
from kvbounds.algorithms.balance_layers import compress_cache_layers, compress_cache_released_layers
from kvbounds.algorithms import token_selection as ts
from kvbounds.algorithms.blockwise_balance_kv import blockwise_balance_select
from kvbounds.algorithms import arrays as be
from kvbounds.algorithms.validation import InputError
from kvbounds.methods import _registry
from kvbounds.gpu import batched_walk as gbw
from kvbounds.gpu import support as gs
from kvbounds.gpu import triton_walk as gtw

LOG2 = math.log(2.0)


# -- CompressedKV.estimate against a 40-digit reference ------------------------------------------------------

def _estimate_arrays(rng, cls):
    H, m, d, s, L = (int(rng.integers(1, 4)) for _ in range(5))
    choices = np.array([0.0, 0.0, LOG2, 2 * LOG2, -np.inf, 0.5])
    a, b = choices[rng.integers(0, 6, (H, m))], choices[rng.integers(0, 6, (H, m))]
    b[:, 0] = np.where(rng.random(H) < 0.9, 0.0, b[:, 0])          # mostly a denominator token per head
    return dict(keys=make_array(rng, (H, m, d), cls), values=make_array(rng, (H, m, s), cls), a=a, b=b,
                q=make_array(rng, (H, L, d), cls))


def _estimate_call(keys, values, a, b, q, scale):
    return ts.CompressedKV(keys, values, a, b).estimate(q, scale=scale)


def _check_estimate(out, keys, values, a, b, q, scale):
    import mpmath as mp
    mp.mp.dps = 40
    d = keys.shape[-1]
    sc = 1.0 / math.sqrt(d) if scale is None else float(scale)
    K, V, Q = (np.asarray(x, np.float64) for x in (keys, values, q))
    eps = eps_of(keys, values, q)
    Q = Q[None] if Q.ndim == 1 else Q                               # (d,) is one query: (1, d)
    if Q.shape[-2] == 0:                                            # zero queries: an empty answer
        return None if np.asarray(out).size == 0 else f"answer {out} for zero queries"
    lead = np.broadcast_shapes(Q.shape[:-2], K.shape[:-2])          # q (..., L, d) broadcasts with the heads
    flat = lambda x, tail: np.broadcast_to(x, lead + x.shape[x.ndim - tail:]).reshape((-1,) + x.shape[x.ndim - tail:])
    Q, K, V, a, b = flat(Q, 2), flat(K, 2), flat(V, 2), flat(np.asarray(a), 1), flat(np.asarray(b), 1)
    out = np.asarray(out, np.float64).reshape(Q.shape[0], Q.shape[1], V.shape[2])
    for h in range(K.shape[0]):
        for j in range(Q.shape[1]):
            l = [mp.mpf(sc) * mp.fsum(mp.mpf(float(x)) * mp.mpf(float(y)) for x, y in zip(Q[h, j], K[h, i]))
                 for i in range(K.shape[1])]
            den = mp.fsum(mp.exp(l[i] + b[h, i]) for i in range(len(l)) if b[h, i] > -np.inf)
            w = [mp.exp(l[i] + a[h, i]) / den if a[h, i] > -np.inf else mp.mpf(0) for i in range(len(l))]
            qn = float(np.linalg.norm(Q[h, j]))
            kn = float(np.max(np.linalg.norm(K[h], axis=1)))
            delta = 2 * (d + 4) * eps * (sc * qn * kn + 2 * LOG2 + 1) + 16 * eps
            for c in range(V.shape[2]):
                ref = mp.fsum(w[i] * mp.mpf(float(V[h, i, c])) for i in range(len(l)))
                mass = mp.fsum(abs(w[i] * mp.mpf(float(V[h, i, c]))) for i in range(len(l)))
                tol = float(4 * mass * mp.expm1(mp.mpf(4 * delta)) + 64 * eps * mass) + 1e-300
                err = abs(mp.mpf(float(out[h, j, c])) - ref)
                if not err <= tol:
                    return f"head {h}, query {j}, column {c}: |out - mpmath| = {float(err):.3g} > {tol:.3g}"
    return None


ESTIMATE = [Entry("CompressedKV.estimate", _estimate_arrays, dict(scale=None), _estimate_call, _check_estimate,
                  torch_ok=False)]


# -- the walks: panel_walk, walk_signs (gpu), batched_select (gpu) ----------------------------------------------

def _walk_arrays(rng, cls):
    B, b, d, e = int(rng.integers(1, 3)), int(rng.integers(1, 12)), int(rng.integers(1, 4)), int(rng.integers(1, 3))
    Kb, Wb = make_array(rng, (B, b, d), cls), make_array(rng, (B, b, e), cls)
    with np.errstate(over="ignore"):
        nk2 = (Kb.astype(np.float64) ** 2).sum(-1).astype(Kb.dtype)
        nw2 = ((Wb.astype(np.float64) ** 2).sum(-1) + 1.0).astype(Wb.dtype)
    return dict(Kb=Kb, Wb=Wb, nk2=nk2, nw2=nw2, uniforms=rng.random((B, b)).astype(Kb.dtype))


def _check_walk(out, Kb, Wb, nk2, nw2, uniforms, c, panel, plus_one, **kw):
    signs = np.asarray(as_numpy(out[0]))
    if not np.all(np.abs(signs) == 1):
        return f"signs not +-1: {signs}"
    ref, _ = bw.panel_walk_stepwise(Kb, Wb, nk2, nw2, uniforms, float(c), panel=int(panel), plus_one=bool(plus_one))
    if not np.array_equal(signs, np.asarray(ref)):
        return f"signs {signs} differ from panel_walk_stepwise's {np.asarray(ref)}"
    return None


WALK_PARAMS = dict(c=5.0, panel=4, plus_one=True)

RNGS = object()         # stands for one numpy Generator per trial (replaced in the call; a corruption replaces it)


def _batched_arrays(rng, cls):
    trials, heads, n, d = int(rng.integers(1, 3)), int(rng.integers(1, 3)), int(rng.integers(1, 13)), \
        int(rng.integers(1, 4))
    return dict(K=make_array(rng, (trials, heads, n, d), cls), V=make_array(rng, (trials, heads, n, d), cls))


def _trial_rngs(K, rngs):
    if rngs is RNGS:
        return [np.random.default_rng(100 + t) for t in range(K.shape[0] if hasattr(K, "shape") and K.ndim else 1)]
    return rngs


def _batched_call(K, V, block_size, levels, rngs, delta, c, method):
    return gbw.batched_select(K, V, block_size=block_size, levels=levels, rngs=_trial_rngs(K, rngs), delta=delta,
                              c=c, method=method)


def _check_batched(out, K, V, block_size, levels, rngs, delta, c, method):
    out = np.asarray(as_numpy(out))
    for t in range(K.shape[0]):
        ref = blockwise_balance_select(K[t], V[t], block_size=block_size, levels=levels,
                                       rng=np.random.default_rng(100 + t), delta=delta, c=c)
        if not np.array_equal(out[t], np.asarray(ref)):
            return f"trial {t}: {out[t].tolist()} != blockwise_balance_select's {np.asarray(ref).tolist()}"
    return None



def _layers_arrays(rng, cls):
    """Two layers of one head's K (16 x d) and V (16 x s) (compress_cache_layers stacks layers first)."""
    d, s = int(rng.integers(1, 5)), int(rng.integers(1, 5))
    return dict(K=make_array(rng, (2, 1, 16, d), cls), V=make_array(rng, (2, 1, 16, s), cls))


def _probes_call(device_type):
    """Both probes asked (the second is not skipped when the first refuses), the first refusal raised after."""
    out = []
    for probe in (gtw.triton_available, gbw.compiled_available):
        try:
            out.append(probe(device_type))
        except InputError as e:
            out.append(e)
    refused = [x for x in out if isinstance(x, InputError)]
    if refused:
        raise refused[0]
    return tuple(out)


def _check_layers(out, K, **kw):
    idx, lw = out
    if idx.shape[:2] != K.shape[:2] or lw.shape != idx.shape:
        return f"shapes {idx.shape} / {lw.shape} do not lead with K's layers and heads {K.shape[:2]}"
    if idx.size and (idx.min() < 0 or idx.max() >= K.shape[-2]):
        return "an index outside the n tokens"
    return None if np.all(np.isfinite(lw)) else "non-finite log-weights"

WALKS = [
    Entry("panel_walk", _walk_arrays, dict(WALK_PARAMS),
          lambda Kb, Wb, nk2, nw2, uniforms, c, panel, plus_one: bw.panel_walk(
              Kb, Wb, nk2, nw2, uniforms, c, panel=panel, plus_one=plus_one), _check_walk),
    Entry("walk_signs", _walk_arrays, dict(WALK_PARAMS, method="exact"),
          lambda Kb, Wb, nk2, nw2, uniforms, c, panel, plus_one, method: gbw.walk_signs(
              Kb, Wb, nk2, nw2, uniforms, c, panel=panel, plus_one=plus_one, method=method), _check_walk),
    Entry("walk_signs[blocked]", _walk_arrays, dict(WALK_PARAMS, method="blocked"),
          lambda Kb, Wb, nk2, nw2, uniforms, c, panel, plus_one, method: gbw.walk_signs(
              Kb, Wb, nk2, nw2, uniforms, c, panel=panel, plus_one=plus_one, method=method),
          lambda out, **kw: None if np.all(np.abs(np.asarray(as_numpy(out[0]))) == 1) else "signs not +-1"),
    Entry("compress_cache_layers", _layers_arrays, dict(sink=1, window=1, levels=1, block_size=4, rng=RNG),
          lambda K, V, **kw: compress_cache_layers(K, V, **kw), _check_layers, torch_ok=False),
    Entry("compress_cache_released_layers", _layers_arrays, dict(sink=1, window=1, levels=1, block_size=4, rng=RNG),
          lambda K, V, **kw: compress_cache_released_layers(K, V, **kw)[:2], _check_layers, torch_ok=False),
    Entry("batched_select", _batched_arrays, dict(block_size=4, levels=1, rngs=RNGS, delta=0.01, c=None,
                                                  method="exact"), _batched_call, _check_batched),
    Entry("batched_select[block >> n]", _batched_arrays, dict(block_size=2 ** 16, levels=2, rngs=RNGS, delta=0.01,
                                                              c=None, method="exact"), _batched_call, _check_batched),
    # the valid device types compile a kernel once (seconds: past the time limit on a first call); the entry
    # checks that every other value is refused, and that the answers are bools when the probe is already cached
    Entry("compiled_available+triton_available", lambda r, c: {}, dict(device_type="gpu"), _probes_call,
          lambda out, **kw: None if all(isinstance(x, bool) for x in out) else f"not bools: {out}"),
]


# -- the backend layer ----------------------------------------------------------------------------------------

def _conv_arrays(rng, cls):
    shape = tuple(int(rng.integers(1, 4)) for _ in range(int(rng.integers(1, 3))))
    return dict(x=make_array(rng, shape, cls), ref=make_array(rng, (2,), cls))


def _conv_call(x, ref):
    y = be.like(x, ref)
    be.synchronize(y)
    return (be.to_numpy(y), be.backend_of(y), be.is_gpu_array(y), str(be.device(y)),
            be.array_namespace(y, ref).__name__)


def _check_conv(out, x, ref):
    y = out[0]
    x = np.asarray(x)
    want = x.astype(ref.dtype) if x.dtype.kind == "f" else x
    if y.shape != x.shape or not np.array_equal(y, want, equal_nan=True):
        return f"like/to_numpy round trip {y} != {want}"
    return None


def _conv_nonfinite_ok(out, x, **kw):
    return not bool(np.all(np.isfinite(np.asarray(as_numpy(x), np.float64))))   # conversions pass values through


def _asarray_check(out, x, backend, dtype):
    y = be.to_numpy(out)
    want = np.asarray(x).astype(dtype)
    return None if y.shape == want.shape and np.array_equal(y, want, equal_nan=True) else f"{y} != {want}"


BACKEND = [
    Entry("validate_backend+resolve+why_unavailable", lambda r, c: {}, dict(name="numpy"),
          lambda name: (be.validate_backend(name), be.resolve(name)[1], be.why_unavailable(name))),
    Entry("available_backends", lambda r, c: {}, {}, lambda: be.available_backends(),
          lambda out: None if "numpy" in out else f"{out} lacks numpy"),
    Entry("asarray", lambda r, c: dict(x=_conv_arrays(r, c)["x"]), dict(backend="numpy", dtype="float64"),
          lambda x, backend, dtype: be.asarray(x, backend, dtype), _asarray_check,
          nonfinite_ok=lambda out, x, **kw: _conv_nonfinite_ok(out, x)),
    Entry("like+to_numpy+backend_of+is_gpu_array+device+synchronize+array_namespace", _conv_arrays, {},
          _conv_call, _check_conv, nonfinite_ok=_conv_nonfinite_ok),
    Entry("gpu_support+describe", lambda r, c: {}, dict(claim_id="SG.e2e", backend="cupy"),
          lambda claim_id, backend: (gs.gpu_support(claim_id), gs.describe([claim_id], backend))),
]


# -- the end-to-end layer's array functions -------------------------------------------------------------------

def _e2e_cache(rng, cls):
    H, n, d = int(rng.integers(1, 3)), int(rng.integers(3, 20)), int(rng.integers(1, 5))
    return dict(K=make_array(rng, (H, n, d), cls).astype(np.float32),
                V=make_array(rng, (H, n, d), cls).astype(np.float32))


def _compress_ours_entry(method):
    from kvbounds.e2e import _methods as M

    def call(K, V, floats, rng, sink, window):
        return M.compress_ours(method, K, V, floats, rng, sink=sink, window=window, block_size=4)

    def check(out, K, V, floats, rng, sink, window):
        used = ts.memory_floats(ts.CompressedKV(*(np.asarray(as_numpy(x)) for x in (
            out.keys, out.values, out.log_w_num, out.log_w_den)), extra_floats=out.extra_floats, rank=out.rank,
            projected=out.projected))
        return None if used <= floats * K.shape[0] else f"holds {used} floats, budget {floats} x {K.shape[0]} heads"

    def nonfinite_ok(out, **kw):
        a, b = (np.asarray(as_numpy(x)) for x in (out.log_w_num, out.log_w_den))
        return bool(np.all(np.isfinite(np.asarray(as_numpy(out.keys)))) and np.all(np.isfinite(a) | (a == -np.inf))
                    and np.all(np.isfinite(b) | (b == -np.inf)))

    return Entry(f"compress_ours[{method}]", _e2e_cache, dict(floats=120, rng=RNG, sink=1, window=1), call, check,
                 nonfinite_ok=nonfinite_ok)


def _methods():
    from kvbounds.e2e import _methods as M
    return M


def _warm_transformers():
    import kvbounds.e2e._attention  # noqa: F401 - imports outside the timed call (seconds on a first import)
    import transformers.integrations.sdpa_attention  # noqa: F401
    import kvbounds.e2e._weighted_cache  # noqa: F401


def _weighted_arrays(rng, cls):
    _warm_transformers()
    H, L, d = int(rng.integers(1, 3)), int(rng.integers(1, 4)), int(rng.integers(1, 4))
    M = L + int(rng.integers(0, 5))
    return dict(query=make_array(rng, (1, H, L, d), cls), key=make_array(rng, (1, H, M, d), cls),
                value=make_array(rng, (1, H, M, d), cls), logw=rng.integers(0, 3, (1, H, M)) * LOG2)


def _t(x):
    import torch
    return torch.as_tensor(x) if isinstance(x, np.ndarray) else x


def _weighted_sdpa_call(query, key, value, logw, scaling):
    from kvbounds.e2e._attention import weighted_sdpa
    return weighted_sdpa(_t(query), _t(key), _t(value), _t(logw), _t(logw), scale=scaling)


def _weighted_forward_call(query, key, value, logw, scaling):
    """The transformers path: a WeightedLayer holding the first M - L tokens with their log-weights, ``update``
    with the L new ones (weight 0), then the attention reads the layer from the keys it returned."""
    from kvbounds.e2e._attention import weighted_attention_forward
    from kvbounds.e2e import WeightedLayer
    query, key, value, logw = _t(query), _t(key), _t(value), _t(logw)
    L = query.shape[2] if getattr(query, "ndim", 0) == 4 else 0
    cut = lambda x, sl: x[..., sl, :] if getattr(x, "ndim", 0) >= 2 else x
    M = key.shape[-2] if getattr(key, "ndim", 0) >= 2 else 0
    layer = WeightedLayer(cut(key, slice(0, M - L)), cut(value, slice(0, M - L)),
                          logw[..., :M - L] if getattr(logw, "ndim", 0) else logw,
                          logw[..., :M - L] if getattr(logw, "ndim", 0) else logw)
    keys, values = layer.update(cut(key, slice(M - L, M)), cut(value, slice(M - L, M)))
    return weighted_attention_forward(None, query, keys, values, None, scaling=scaling)[0]


def _check_weighted(out, query, key, value, logw, scaling, forward=False):
    from fuzz_harness import compare_attention
    out = np.asarray(as_numpy(out))
    out = out if forward else out.transpose(0, 2, 1, 3)              # (1, L, H, d)
    L, M = query.shape[2], key.shape[2]
    if forward:      # the layer stores its weights in float32 (documented); the new tokens get weight 0
        logw = np.concatenate([logw[..., :M - L].astype(np.float32), np.zeros(logw.shape[:-1] + (L,))], -1)
    sc = 1.0 / math.sqrt(query.shape[-1]) if scaling is None else float(scaling)
    for h in range(query.shape[1]):
        for i in range(L):
            vis = M - L + i + 1
            live = logw[0, h, :vis] > -np.inf                         # -inf: the key is not attended
            why = compare_attention(out[0, i, h], query[0, h, i], key[0, h, :vis][live], value[0, h, :vis][live],
                                    sc, extra=logw[0, h, :vis][live])
            if why:
                return f"head {h}, query {i}: {why}"
    return None


def _weighted_cache_call(K, V, a, b):
    from kvbounds.e2e._attention import WeightedCache
    from kvbounds.e2e._weighted_cache import WeightedLayer, check_log_weights
    cache = WeightedCache([(_t(K), _t(V), _t(a), _t(b))])
    layer = cache.layers[0]
    assert isinstance(layer, WeightedLayer)
    if layer.weighted:
        check_log_weights(layer.log_w_num, "log_w_num", tuple(layer.keys.shape[:-1]))
    return layer.keys, layer.values, layer.log_w_num, layer.log_w_den


def _cache_arrays(rng, cls):
    _warm_transformers()
    H, m, d = int(rng.integers(1, 3)), int(rng.integers(1, 6)), int(rng.integers(1, 4))
    choices = np.array([0.0, LOG2, -np.inf])
    return dict(K=make_array(rng, (1, H, m, d), cls), V=make_array(rng, (1, H, m, d), cls),
                a=choices[rng.integers(0, 3, (1, H, m))], b=choices[rng.integers(0, 2, (1, H, m))])


def _press_arrays(rng, cls):
    import kvbounds.presses._kvpress  # noqa: F401 - imports kvpress outside the timed call (seconds on a first import)
    return {}


def _press_call(compression_ratio, sink, window, seed):
    from kvbounds.presses import _kvpress as P
    classes = (P.KVBoundsPress, P.BalanceKVPress, P.BalanceKVReleasedPress, P.SubGenPress, P.SubspacePress,
               P.UniformPress, P.KCenterPress, P.H2OPress, P.KernelThinningPress)
    return [c(compression_ratio=compression_ratio, sink=sink, window=window, seed=seed).budget for c in classes]


def _compress_layer_call(K, V, budget, rng, sink, window):
    return _methods().compress_layer("uniform", K, V, budget, rng, sink=sink, window=window)


# every registered method of the package with a layer-level compress (kvbounds.methods), but those that need the
# queries (H2O: its prefill form) or an optional package (kernel thinning: goodpoints)
E2E = [_compress_ours_entry(m.name) for m in _registry.methods(source="kvbounds")
       if m.compress is not None and not m.needs_queries and not m.requires] + [
    Entry("compress_layer", _e2e_cache, dict(budget=0.5, rng=RNG, sink=1, window=1),
          _compress_layer_call),
    Entry("balance_levels", lambda r, c: {}, dict(n=16, d=4, sink=1, window=1, floats=100, per_token_weights=0),
          lambda **kw: _methods().balance_levels(**kw)),
    Entry("balance_floats+balance_layout", lambda r, c: {},
          dict(n=16, d=4, sink=1, window=1, floats=100, per_token_weights=0),
          lambda floats, **kw: (_methods().balance_floats(T=1, **kw), _methods().balance_layout(floats=floats, **kw))),
    Entry("balance_budgets", lambda r, c: {}, dict(n=64, window=4, levels=(3, 2)),
          lambda **kw: _methods().balance_budgets(**kw)),
    Entry("budget_problem", lambda r, c: {}, dict(n=256, d=4, sink=4, window=4, budget=0.5),
          lambda **kw: _methods().budget_problem(**kw)),
    Entry("source+runs_on+path_note", lambda r, c: {}, dict(method="uniform", where="host"),
          lambda method, where: (_methods().source(method), _methods().runs_on(method, where),
                                 _methods().path_note(method, where))),
    Entry("equal_memory_baseline", lambda r, c: {}, dict(baseline_loss=0.5),
          lambda baseline_loss: __import__("kvbounds.e2e._checks",
                                           fromlist=["x"]).equal_memory_baseline(baseline_loss)),
    Entry("weighted_sdpa", _weighted_arrays, dict(scaling=None), _weighted_sdpa_call, _check_weighted,
          torch_ok=False),
    Entry("weighted_attention_forward", _weighted_arrays, dict(scaling=None), _weighted_forward_call,
          lambda out, **kw: _check_weighted(out, forward=True, **kw), torch_ok=False),
    Entry("WeightedCache+WeightedLayer+check_log_weights", _cache_arrays, {}, _weighted_cache_call,
          nonfinite_ok=lambda out, **kw: bool(np.all(np.isfinite(np.asarray(as_numpy(out[0])))))),
    Entry("KVBoundsPress+BalanceKVPress+BalanceKVReleasedPress+SubGenPress+SubspacePress+UniformPress+KCenterPress"
          "+H2OPress+KernelThinningPress", _press_arrays, dict(compression_ratio=0.5, sink=4, window=4, seed=0), _press_call),
]

def _check_play(out, name, setting, n, d, r, reps, rng, rule):
    ok = all(len(out[k]) == reps for k in ("correct", "group_accuracy", "stored", "state_bits"))
    return None if ok and np.all((out["group_accuracy"] >= 0) & (out["group_accuracy"] <= 1)) else f"{out}"


ADAPTERS = [Entry("play", lambda r, c: {}, dict(name="uniform", setting=3, n=8, d=4, r=1.0, reps=2, rng=RNG,
                                                rule="abs"),
                  lambda rule, **kw: __import__("kvbounds.algorithms.compressor_adapters", fromlist=["x"]).play(
                      **kw, rule=rule), _check_play)]


# -- the walk diagnostics (kvbounds.algorithms.walk_diagnostics) ------------------------------------------------

def _wdg():
    return __import__("kvbounds.algorithms.walk_diagnostics", fromlist=["x"])


def _wdg_kv(rng, cls):
    B, n, d, s = (int(rng.integers(1, k)) for k in (3, 10, 5, 4))
    return dict(K=make_array(rng, (B, n, d), cls), V=make_array(rng, (B, n, s), cls))


def _wdg_gram(rng, cls):
    """A Gram X X^T of random vectors (positive semi-definite, exactly symmetric) and uniforms."""
    B, n, e = (int(rng.integers(1, k)) for k in (3, 10, 5))
    X = make_array(rng, (B, n, e), cls)
    with np.errstate(over="ignore", invalid="ignore"):
        G = np.matmul(X, np.swapaxes(X, -1, -2))
    return dict(G=G, uniforms=rng.random((B, n)))


def _check_wdg(out, G, uniforms, c, r2, log_scale, gamma):
    for key in ("offdiag_share", "cosine_offdiag_share", "max_coherence", "theorem_equal_random",
                "greedy_equal_random"):
        v = np.asarray(out[key])
        if np.any(v < 0) or np.any(v > 1 + 1e-6):
            return f"{key} = {v} outside [0, 1]"
    if not np.all(out["random_equal_random"] == 1.0):
        return "the random rule differs from itself"
    if np.any(np.asarray(out["greedy_disc_ratio"]) < -1e-9):
        return "negative discrepancy"
    return None


def _check_wdg_signs(out, G, uniforms, c, r2, log_scale, gamma):
    """The theorem rule against gram_walk on G / r2 (r2 given, else max diag), block by block."""
    from kvbounds.algorithms.self_balancing_walk import gram_walk
    Gn = np.asarray(G, np.float64)
    for b in range(Gn.shape[0]):
        top = float(np.diagonal(Gn[b]).max()) if r2 is None else float(r2)
        if top <= 0 or not np.isfinite(Gn[b] / top).all():
            continue
        ref = gram_walk(Gn[b] / top, np.asarray(uniforms[b], np.float64), float(c), on_fail="continue").signs
        if not np.array_equal(ref, out["theorem"][b]):
            return f"block {b}: theorem signs {out['theorem'][b]} != gram_walk's {ref}"
    return None


def _check_wdg_kernel(out, K, V, **kw):
    """|G_ij| <= R^2 (Cauchy-Schwarz), up to the exponent's rounding (a few (d + 2) eps of its size, e^{log_scale +
    beta}) and the value product's (a few (s + 2) eps)."""
    d, s = K.shape[-1], V.shape[-1]
    Kn = np.asarray(K, np.float64)
    sc = 1 / math.sqrt(d) if kw.get("scale") is None else float(kw["scale"])
    m = float(kw.get("temp", 1.0)) * sc * np.max((Kn * Kn).sum(-1), axis=-1)
    slack = np.exp(4 * (d + 2) * 2.2e-16 * np.maximum(m, 1.0)) * (1 + 4 * (s + 2) * 2.2e-16)
    top = np.asarray(out.r2)[..., None, None] * slack[..., None, None]
    if np.any(np.abs(out.gram) > top) or np.any(np.diagonal(out.gram, axis1=-2, axis2=-1) < 0):
        return "a kernel entry beyond R^2 or a negative diagonal"
    return None


def _check_first_blocks(out, K, V, block_size, sink, window):
    Kb, _ = out
    n = K.shape[-2]
    nb = (n - sink - window) // block_size
    ref = np.asarray(K, np.float64)[..., sink:sink + nb * block_size, :]
    return None if np.array_equal(Kb.reshape(ref.shape), ref) else "blocks differ from the middle's tokens"


def _qd_inputs(rng, cls):
    """Signs, keys, values and held-out queries of a few blocks (the query side of the walk diagnostics)."""
    B, n, d, s, m = (int(rng.integers(1, k)) for k in (3, 10, 5, 4, 5))
    return dict(signs=np.where(rng.random((B, n)) < 0.5, 1.0, -1.0), K=make_array(rng, (B, n, d), cls),
                V=make_array(rng, (B, n, s), cls), Q=make_array(rng, (B, m, d), cls))


def _qd_call(signs, K, V, Q, scale):
    qd = __import__("kvbounds.algorithms.query_discrepancy", fromlist=["x"])
    out = qd.query_discrepancy(signs, K, V, Q, scale=scale)
    return out, qd.query_terms(K, Q, scale=scale), qd.held_out_queries(np.swapaxes(Q, 0, 0), 1, Q.shape[1])


def _check_qd(out, signs, K, V, Q, scale):
    ratios, A, held = out
    for key, v in ratios.items():
        if np.any(np.asarray(v) < 0) or not np.all(np.isfinite(v)):
            return f"{key} = {v}: a ratio of squared norms must be finite and >= 0"
    if np.any(A < 0) or np.any(A > 1) or held.shape != Q.shape:
        return "terms outside [0, 1] (each query's largest is 1) or held-out queries reshaped wrong"
    return None


KERNEL_PARAMS = dict(scale=None, temp=1.0, const=1.0, beta=0.0, centre=False)
WALK_DIAGNOSTICS = [
    Entry("exp_kernel_gram", _wdg_kv, KERNEL_PARAMS, lambda **kw: _wdg().exp_kernel_gram(**kw), _check_wdg_kernel),
    Entry("walk_diagnostics", _wdg_gram, dict(c=2.0, r2=None, log_scale=0.0, gamma=4.0),
          lambda **kw: _wdg().walk_diagnostics(**kw), _check_wdg),
    Entry("rule_signs", _wdg_gram, dict(c=2.0, r2=None, log_scale=0.0, gamma=4.0),
          lambda **kw: _wdg().rule_signs(**kw), _check_wdg_signs),
    Entry("block_diagnostics", _wdg_kv, dict(KERNEL_PARAMS, rng=RNG, delta=0.01, c=None, gamma=4.0),
          lambda **kw: _wdg().block_diagnostics(**kw)),
    Entry("centring_comparison", _wdg_kv, dict(rng=RNG, temp=0.1, const=0.025, gamma=4.0),
          lambda **kw: _wdg().centring_comparison(**kw)),
    Entry("centred", lambda r, c: dict(K=make_array(r, (2, 5, 3), c)), {}, lambda K: _wdg().centred(K)),
    Entry("key_geometry", lambda r, c: dict(K=make_array(r, (2, int(r.integers(1, 7)), 3), c)),
          dict(scale=None, temp=1.0, centre=True), lambda **kw: _wdg().key_geometry(**kw),
          lambda out, **kw: None if np.all(out["key_energy"] >= 0) and np.all(out["key_distance"] >= 0) else f"{out}"),
    Entry("first_level_blocks", _wdg_kv, dict(block_size=2, sink=1, window=1),
          lambda **kw: _wdg().first_level_blocks(**kw), _check_first_blocks),
    Entry("blockwise_walk_cause", _wdg_kv, dict(block_size=2, rng=RNG, sink=0, window=0, delta=0.01),
          lambda **kw: _wdg().blockwise_walk_cause(**kw)),
    Entry("query_discrepancy+query_terms+held_out_queries", _qd_inputs, dict(scale=None), _qd_call, _check_qd,
          torch_ok=False),
    Entry("summarize_diagnostics", _wdg_kv, dict(rng=RNG),
          lambda K, V, rng: _wdg().summarize_diagnostics(_wdg().block_diagnostics(K, V, rng=rng))),
    Entry("summarize", lambda r, c: dict(values=make_array(r, (int(r.integers(1, 9)),), c)), {},
          lambda values: _wdg().summarize(values)),
]

ENTRIES = ESTIMATE + WALKS + BACKEND + E2E + ADAPTERS + WALK_DIAGNOSTICS

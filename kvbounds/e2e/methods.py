"""Every method of the end-to-end harness as ``compress(prefill, budget, rng) -> list[CompressedKV]`` (one per layer).

Ours (``source="kvbounds"``), each keeping the first ``sink`` and last ``window`` tokens exactly and spending
the same number of floats per layer and KV head, ``budget * n * 2d`` (keys, values and log-weights counted by
:func:`kvbounds.algorithms.token_selection.memory_floats`):

* ``uniform_control``: uniform sampling again from its own random stream, the end-to-end checks' null control;
* ``streaming_llm``, ``uniform``, ``kcenter`` (ClusterGen Sec. 4.1, weights 1), ``kcenter_sized`` (cluster sizes as
  weights): :mod:`kvbounds.algorithms.token_selection` selections;
* ``balancekv``: blockwise BalanceKV, the paper's pseudocode (BalanceKV-NeurIPS = "BalanceKV: KV Cache Compression through
  Discrepancy Theory", arXiv:2502.07861, later version, App. B.1), T the fewest halvings that fit the budget;
* ``balancekv_released``: the authors' released walk (helper module ``balance_kv_released``, when present);
* ``subgen``: SubGen's estimator (SubGen, arXiv:2402.06082, Alg. 1), split numerator/denominator weights;
* ``subspace``: top-r projection of the middle keys/values (Subspace-FD-draft draft, SUB.lowrank's falsifier 1).

kvpress presses (``source="kvpress"``, NVIDIA kvpress, when installed): ``kvpress:<name>`` with
``compression_ratio = 1 - budget``; their ``compress`` is called layer by layer on the states captured in the
shared exact prefill (exactly what kvpress's forward hook does after each attention layer of a prefill).
"""
from __future__ import annotations

import math

import numpy as np

from kvbounds.algorithms import compressor_adapters as ca
from kvbounds.algorithms import token_selection as ts
from kvbounds.algorithms.balance_layers import compress_cache_layers
from kvbounds.algorithms.blockwise_balance_kv import compress_cache
from kvbounds.algorithms.validation import InputError
from kvbounds.gpu.backend import array_namespace

from .method_names import CONTROLS, DEFAULT_METHODS, KVPRESS, OURS, PRESSES  # noqa: F401 (re-exported)


def source(method: str) -> str:
    return "kvpress" if method.startswith("kvpress:") else "kvbounds"


def kvpress_available() -> str | None:
    """None when kvpress imports, else the reason (the rows are skipped with this note)."""
    try:
        import kvpress  # noqa: F401
    except Exception as e:   # noqa: BLE001 - any import failure means "skip the kvpress rows"
        return f"kvpress not installed ({type(e).__name__}: {e}); pip install 'kvbounds[hf]'"
    return None


def balance_levels(n: int, d: int, sink: int, window: int, floats: int, per_token_weights: int = 0) -> int:
    """The fewest halvings T whose blockwise BalanceKV cache fits ``floats`` per head: keys and values of the
    kept tokens, one constant log-weight (2^T) per head, plus ``per_token_weights`` per kept middle token."""
    n_mid = n - sink - window
    T = 0
    while (sink + window + (n_mid >> T)) * 2 * d + (n_mid >> T) * per_token_weights + 1 > floats:
        T += 1
        if n_mid >> T == 0:
            raise InputError(f"budget {floats} floats cannot hold BalanceKV's exact sink + window")
    return T


def balance_budgets(n: int, window: int, levels=(3, 2)) -> list[float]:
    """Budgets (fractions of the cache's floats) that blockwise BalanceKV reaches exactly with ``window`` exact
    tokens at each end and T halvings of the middle, plus 0.1% slack for its one weight per head: at these
    budgets every method holds the same memory (BalanceKV's cache sizes are n_mid / 2^T, nothing between)."""
    return [round((2 * window + ((n - 2 * window) >> T)) / n + 1e-3, 6) for T in levels]


def compress_ours(method: str, K: np.ndarray, V: np.ndarray, floats: int, rng: np.random.Generator, *,
                  sink: int, window: int, block_size: int = 64) -> ts.CompressedKV:
    """One layer, K/V (Hkv, n, d) float32 (numpy on the host path; torch on the model's device on the device
    path, see :func:`compress_all`), ``floats`` per KV head; the result lives where K does."""
    n, d = K.shape[-2], K.shape[-1]
    if method == "streaming_llm":
        return ts.StreamingLLM(sink=sink).compress(K, V, budget=floats // (2 * d))
    if method in ("uniform", "uniform_control"):
        return ts.Uniform(sink=sink, window=window).compress(K, V, budget=(floats - 1) // (2 * d), rng=rng)
    if method == "kcenter":
        return ts.KCenter(window=window).compress(K, V, budget=floats // (2 * d))
    if method == "kcenter_sized":
        return ts.KCenter(window=window, weights="cluster_size").compress(K, V, budget=floats // (2 * d + 1))
    if method == "balancekv":
        T = balance_levels(n, d, sink, window, floats)
        idx, lw = compress_cache(K, V, sink=sink, window=window, levels=T, block_size=block_size, rng=rng)
        return ts.gather_selection(K, V, idx, lw)
    if method == "balancekv_released":
        fn = ca.released_balancekv()
        if fn is None:
            raise InputError("balancekv_released needs kvbounds.algorithms.balance_kv_released (not present)")
        T = balance_levels(n, d, sink, window, floats, per_token_weights=1)   # a = log w per token, b = T log 2
        # SmolLM2's keys overflow the released kernel in float32 from n ~ 1024 on: those levels run in float64
        idx, a, b = fn(K, V, sink=sink, window=window, levels=T, block_size=block_size, rng=rng, overflow="float64")
        c = ts.gather_selection(K, V, idx, a)
        if isinstance(K, np.ndarray):
            c.log_w_den = np.array(np.broadcast_to(np.asarray(b, np.float32), c.log_w_num.shape))
        else:
            xp = array_namespace(K)
            c.log_w_den = xp.asarray(xp.broadcast_to(xp.astype(b, xp.float32), c.log_w_num.shape), copy=True)
        return c
    if method == "subgen":
        return ca.SubGenCompressor(sink=sink, window=window).compress(K, V, budget_floats=floats, rng=rng)
    if method == "subspace":
        return ca.SubspaceCompressor(sink=sink, window=window).compress(K, V, budget_floats=floats)
    raise InputError(f"unknown method {method!r}; ours: {', '.join(OURS + CONTROLS)}; kvpress: {', '.join(KVPRESS)}")


def _balancekv_layers(state, floats: int, rng, *, sink: int, window: int, block_size: int = 64):
    """compress_ours("balancekv") of every layer on the host, the layers' walks stacked
    (:func:`kvbounds.algorithms.balance_layers.compress_cache_layers`: the same indices as one call per layer)."""
    K = np.stack([X[0].float().cpu().numpy() for X in state.keys])
    V = np.stack([X[0].float().cpu().numpy() for X in state.values])
    T = balance_levels(state.n, K.shape[-1], sink, window, floats)
    idx, lw = compress_cache_layers(K, V, sink=sink, window=window, levels=T, block_size=block_size, rng=rng)
    return [ts.gather_selection(K[l], V[l], idx[l], lw[l]) for l in range(K.shape[0])]


# Methods whose heads are independent and drawn in head order (SubGen's value samples; the others draw nothing):
# every layer's heads in one call, layer after layer, give each layer the tokens, weights and draws of its own call.
LAYERS_AS_HEADS = ("kcenter", "kcenter_sized", "subgen", "subspace")


def _layers_as_heads(method: str, state, floats: int, rng, *, sink: int, window: int) -> list[ts.CompressedKV]:
    """compress_ours of every layer on the host in one call on the (layers x heads, n, d) stack, split back."""
    K, V = (np.concatenate([X[0].float().cpu().numpy() for X in xs]) for xs in (state.keys, state.values))
    L = len(state.keys)
    H = K.shape[0] // L
    c = compress_ours(method, K, V, floats, rng, sink=sink, window=window)
    return [ts.CompressedKV(*(x[l * H:(l + 1) * H] for x in (c.keys, c.values, c.log_w_num, c.log_w_den)),
                            extra_floats=c.extra_floats // L, rank=c.rank, projected=c.projected) for l in range(L)]


def make_press(method: str, budget: float, seed: int):
    import kvpress
    name = method.split(":", 1)[1]
    if name not in PRESSES:
        raise InputError(f"unknown kvpress method {method!r}; choose from {', '.join(KVPRESS)}")
    cls = getattr(kvpress, PRESSES[name])
    kw = dict(compression_ratio=float(1.0 - budget))
    if name == "random":
        kw["seed"] = int(seed)
    return cls(**kw)


def compress_kvpress(method: str, lm, state, budget: float, seed: int, *,
                     keep_on_device: bool = False) -> list[ts.CompressedKV]:
    """Run a kvpress press's ``compress`` on every layer of the shared prefill ``state``; its output copied to the
    host as numpy, or with ``keep_on_device`` kept as float32 tensors where the press left them."""
    import torch
    press = make_press(method, budget, seed)
    model = lm.model
    press.post_init_from_model(model)
    inner = model.model
    out = []
    with torch.no_grad():
        for l, layer in enumerate(inner.layers):
            module = layer.self_attn
            module.rotary_emb = inner.rotary_emb
            kw = dict(state.attn_kwargs[l])
            k, v = press.compress(module, kw["hidden_states"], state.keys[l], state.values[l], None, kw)
            if keep_on_device:
                k, v = k[0].float(), v[0].float()
                z = torch.zeros(k.shape[:-1], dtype=torch.float32, device=k.device)
                out.append(ts.CompressedKV(k, v, z, z.clone()))
                continue
            k, v = k[0].float().cpu().numpy(), v[0].float().cpu().numpy()
            z = np.zeros(k.shape[:-1], np.float32)
            out.append(ts.CompressedKV(k, v, z, z.copy()))
    return out


WHERE = ("host", "device")
# Methods of ours that cannot run on torch tensors, with the reason: compress_all(where="device") gives them the
# host path. Empty: every method of ours runs on torch tensors (tests/test_e2e_device.py tries each on torch:cpu).
HOST_ONLY: dict[str, str] = {}
# Device-path methods that still read a few small arrays on the host inside modules the harness does not own (no
# copy of K or V; at most one integer per token and head). Everything else stays on the device.
DEVICE_HOST_COPIES: dict[str, str] = {
    "balancekv": "the walk's FAIL flags, one bool per head and level (block_walk.panel_walk)",
    "kcenter": "greedy k-center's radii and cluster labels (kcenter.greedy_k_center, recent_plus_centers)",
    "kcenter_sized": "greedy k-center's radii and cluster labels (kcenter.greedy_k_center, recent_plus_centers)",
    "subgen": "greedy k-center's radii (kcenter.greedy_k_center)",
}


def runs_on(method: str, where: str = "host") -> str:
    """Where :func:`compress_all` runs ``method``: "host" (numpy float32 copies of K, V) or "device" (torch
    tensors on the model's device); kvpress presses always run their torch ``compress`` on the device."""
    if where not in WHERE:
        raise InputError(f"where must be one of {WHERE}, got {where!r}")
    if method.startswith("kvpress:"):
        return "device"
    return "host" if where == "host" or method in HOST_ONLY else "device"


def path_note(method: str, where: str = "host") -> str:
    """One line saying where ``method`` ran under ``where`` and what crossed to the host (for benchmark rows)."""
    path = runs_on(method, where)
    if method.startswith("kvpress:"):
        return "torch press on the device; " + ("output kept there" if where == "device" else
                                                 "output copied to the host (numpy) and back")
    if path == "host":
        why = f" ({HOST_ONLY[method]})" if where == "device" and method in HOST_ONLY else ""
        return f"host: numpy float32 copies of K, V{why}"
    extra = DEVICE_HOST_COPIES.get(method)
    return "device: torch float32 K, V, cache kept there" + (f"; host reads: {extra}" if extra else "")


def compress_all(method: str, lm, state, budget: float, rng: np.random.Generator, *, sink: int, window: int,
                 seed: int = 0, where: str = "host") -> list[ts.CompressedKV]:
    """Every layer of the prefill ``state`` compressed by ``method`` at ``budget``, one :class:`CompressedKV` per layer.

    ``where="host"`` (the records of BKV.e2e / SG.e2e): each layer's K, V copied to the host as float32 numpy and
    the compressed cache held in numpy. ``where="device"``: K, V passed as float32 torch tensors on the model's
    device and the compressed cache kept there (``harness._to_layers`` then moves nothing); methods in
    :data:`HOST_ONLY` keep the host path (:func:`runs_on` says which ran). The random draws come from ``rng`` on
    both paths, so a seed selects the same tokens."""
    path = runs_on(method, where)
    if method.startswith("kvpress:"):
        return compress_kvpress(method, lm, state, budget, seed, keep_on_device=where == "device")
    d = state.keys[0].shape[-1]
    floats = int(math.floor(budget * state.n * 2 * d))
    if path == "host" and method == "balancekv":   # every layer in one walk: the same tokens as layer by layer
        return _balancekv_layers(state, floats, rng, sink=sink, window=window)
    if path == "host" and method in LAYERS_AS_HEADS:
        return _layers_as_heads(method, state, floats, rng, sink=sink, window=window)
    if path == "device":
        layer = lambda X: X[0].float()
    else:
        layer = lambda X: X[0].float().cpu().numpy()
    return [compress_ours(method, layer(state.keys[l]), layer(state.values[l]), floats, rng, sink=sink,
                          window=window) for l in range(len(state.keys))]

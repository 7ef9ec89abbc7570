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
* ``subspace``: top-r projection of the middle keys/values (Subspace-FD-draft draft, SUB.lowrank's falsifier 1);
* ``h2o``: heavy hitters by accumulated attention plus recent tokens (H2O, arXiv:2306.14048; :mod:`.h2o`).

Equal memory (issue 21): every method holds within 1% of ``budget x exact floats``, never more than +1%
(:data:`MEMORY_TOLERANCE`; the harness turns a row outside it into an error row). BalanceKV takes the largest
T-cache that fits and fills the rest with exact recent tokens (:func:`balance_layout`); SubGen and subspace fill
what their draws / ranks leave with exact recent tokens (:func:`_filled`); kvpress presses get the compression
ratio that holds at most the target (:func:`compress_kvpress`).

kvpress presses (``source="kvpress"``, NVIDIA kvpress, when installed): ``kvpress:<name>`` with
``compression_ratio = 1 - budget``; their ``compress`` is called layer by layer on the states captured in the
shared exact prefill (exactly what kvpress's forward hook does after each attention layer of a prefill).
"""
from __future__ import annotations

import math

import numpy as np

from kvbounds.algorithms import compressor_adapters as ca
from kvbounds.algorithms import token_selection as ts
from kvbounds.algorithms.blockwise_balance_kv import compress_cache
from kvbounds.algorithms.validation import InputError, check_int, check_rng
from kvbounds.algorithms.arrays import array_namespace

from .method_names import (CONTROLS, DEFAULT_METHODS, KVPRESS, NEEDS_INPUTS, NEEDS_SCORES, OURS,  # noqa: F401
                           PRESSES, QUICK_METHODS, RANDOMIZED)


def _check_method(method) -> str:
    if not isinstance(method, str):
        raise InputError(f"method must be a method name (str), got {type(method).__name__}")
    return method


def _check_sizes(**sizes) -> None:
    """Token counts and float budgets of the budget solver: integers >= 0 (n, d, floats >= 1)."""
    for name, v in sizes.items():
        check_int(v, name, minimum=1 if name in ("n", "d", "floats") else 0)


def _check_kv(K, V) -> None:
    """K (Hkv, n, d) and V (Hkv, n, dv) arrays (numpy or torch) of the same heads and tokens."""
    for name, x in (("K", K), ("V", V)):
        if not hasattr(x, "shape") or not hasattr(x, "dtype") or len(x.shape) != 3:
            raise InputError(f"{name} must be a (KV heads, tokens, head_dim) numpy array or torch tensor, got "
                             f"{getattr(x, 'shape', type(x).__name__)}")
    if tuple(V.shape[:2]) != tuple(K.shape[:2]):
        raise InputError(f"V {tuple(V.shape)} must have K's heads and tokens {tuple(K.shape[:2])}")


def source(method: str) -> str:
    _check_method(method)
    return "kvpress" if method.startswith("kvpress:") else "kvbounds"


def kvpress_available() -> str | None:
    """None when kvpress imports, else the reason (the rows are skipped with this note)."""
    try:
        import kvpress  # noqa: F401
    except Exception as e:   # noqa: BLE001 - any import failure means "skip the kvpress rows"
        return f"kvpress not installed ({type(e).__name__}: {e}); pip install 'kvbounds[kvpress]'"
    return None


def balance_levels(n: int, d: int, sink: int, window: int, floats: int, per_token_weights: int = 0) -> int:
    """The fewest halvings T whose blockwise BalanceKV cache fits ``floats`` per head: keys and values of the
    kept tokens, one constant log-weight (2^T) per head, plus ``per_token_weights`` per kept middle token."""
    _check_sizes(n=n, d=d, sink=sink, window=window, floats=floats, per_token_weights=per_token_weights)
    n_mid = n - sink - window
    if n_mid <= 0:
        raise InputError(f"sink + window = {sink} + {window} leaves no middle to compress in n = {n} tokens")
    T = 0
    while balance_floats(n, d, sink, window, T, per_token_weights) > floats:
        T += 1
        if n_mid >> T == 0:
            raise InputError(f"budget {floats} floats cannot hold BalanceKV's exact sink + window")
    return T


def balance_floats(n: int, d: int, sink: int, window: int, T: int, per_token_weights: int = 0) -> int:
    """Floats per head of a blockwise BalanceKV cache: sink + window exact tokens, n_mid // 2^T kept middle
    tokens with ``per_token_weights`` each, and one constant log-weight (T log 2)."""
    _check_sizes(n=n, d=d, sink=sink, window=window, T=T, per_token_weights=per_token_weights)
    kept = (n - sink - window) >> T
    return (sink + window + kept) * 2 * d + kept * per_token_weights + 1


def balance_layout(n: int, d: int, sink: int, window: int, floats: int, per_token_weights: int = 0) -> tuple[int, int]:
    """(T, window') of the BalanceKV cache at equal memory: the largest T-cache that fits ``floats`` (the fewest
    halvings, :func:`balance_levels`), the floats left over filled with exact recent tokens (window' >= window;
    BalanceKV-NeurIPS B.1 keeps the last window exactly, so a longer window is the same algorithm). Within one
    token's floats of ``floats``, never above it."""
    T = balance_levels(n, d, sink, window, floats, per_token_weights)
    lo, hi = 0, n - sink - window - (1 << T)   # largest extra e with the cache still fitting (monotone in e)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if balance_floats(n, d, sink, window + mid, T, per_token_weights) <= floats:
            lo = mid
        else:
            hi = mid - 1
    return T, window + lo


def balance_budgets(n: int, window: int, levels=(3, 2)) -> list[float]:
    """Budgets (fractions of the cache's floats) at which blockwise BalanceKV with ``window`` exact tokens at each
    end and T halvings of the middle needs no filling (plus 0.1% slack for its weight per head). No longer needed
    for equal memory (:func:`balance_layout` fills any budget); kept for callers that want these sizes."""
    _check_sizes(n=n, window=window)
    if isinstance(levels, (str, bytes)) or not hasattr(levels, "__iter__"):
        raise InputError(f"levels must be a sequence of halvings T (integers >= 0), got {levels!r}")
    levels = [check_int(T, "levels[i]") for T in levels]
    return [round((2 * window + ((n - 2 * window) >> T)) / n + 1e-3, 6) for T in levels]


# equal memory: every method holds within MEMORY_TOLERANCE of budget x exact floats and never more than +tolerance
MEMORY_TOLERANCE = 0.01


def budget_problem(n: int, d: int, sink: int, window: int, budget: float) -> str | None:
    """Why ``budget`` cannot be met within :data:`MEMORY_TOLERANCE` by every method at context ``n`` (None when it
    can): it must lie in (0, 1], leave a middle (sink + window < n), cover the exact sink + window plus at least one
    middle token, and hold at least 1/tolerance tokens' floats (a token is the granularity of every method)."""
    try:
        _check_sizes(n=n, d=d, sink=sink, window=window)
    except InputError as e:
        return str(e)
    if not (isinstance(budget, (int, float)) and 0 < budget <= 1):
        return f"budget must lie in (0, 1], got {budget!r}"
    if sink + window >= n:
        return f"n = {n} is too small for sink + window = {sink} + {window} (need n > sink + window)"
    tokens = budget * n
    if tokens < sink + window + 2:
        return (f"budget {budget:g} holds {tokens:.0f} tokens' floats at n = {n}: not more than the exact sink + "
                f"window ({sink + window})")
    if tokens < 1 / MEMORY_TOLERANCE + 2:
        return (f"budget {budget:g} holds {tokens:.0f} tokens' floats at n = {n}: one token is more than "
                f"{MEMORY_TOLERANCE:.0%} of it, so equal memory within {MEMORY_TOLERANCE:.0%} cannot be met")
    return None


def compress_ours(method: str, K: np.ndarray, V: np.ndarray, floats: int, rng: np.random.Generator, *,
                  sink: int, window: int, block_size: int = 64) -> ts.CompressedKV:
    """One layer, K/V (Hkv, n, d) float32 (numpy on the host path; torch on the model's device on the device
    path, see :func:`compress_all`), ``floats`` per KV head; the result lives where K does."""
    _check_method(method)
    _check_kv(K, V)
    _check_sizes(floats=floats, sink=sink, window=window)
    check_int(block_size, "block_size", minimum=1)
    check_rng(rng)
    n, d = K.shape[-2], K.shape[-1]
    if method == "streaming_llm":
        return ts.StreamingLLM(sink=sink).compress(K, V, budget=floats // (2 * d))
    if method in ("uniform", "uniform_control"):
        return ts.Uniform(sink=sink, window=window).compress(K, V, budget=(floats - 1) // (2 * d), rng=rng)
    if method == "kcenter":
        return ts.KCenter(window=window).compress(K, V, budget=floats // (2 * d))
    if method == "kernel_thinning":      # uniform's layout and weights, the middle by kernel thinning (goodpoints)
        from kvbounds.algorithms.kernel_thinning import KernelThinning
        return KernelThinning(sink=sink, window=window).compress(K, V, budget=(floats - 1) // (2 * d), rng=rng)
    if method == "balancekv":
        T, win = balance_layout(n, d, sink, window, floats)
        idx, lw = compress_cache(K, V, sink=sink, window=win, levels=T, block_size=block_size, rng=rng)
        return ts.gather_selection(K, V, idx, lw)
    if method == "balancekv_released":
        fn = ca.released_balancekv()
        if fn is None:
            raise InputError("balancekv_released needs kvbounds.algorithms.balance_kv_released (not present)")
        # a = log w per token (one float each, counted), b = T log 2 (one per head)
        T, win = balance_layout(n, d, sink, window, floats, per_token_weights=1)
        # SmolLM2's keys overflow the released kernel in float32 from n ~ 1024 on: those levels run in float64
        idx, a, b = fn(K, V, sink=sink, window=win, levels=T, block_size=block_size, rng=rng, overflow="float64")
        c = ts.gather_selection(K, V, idx, a)
        if isinstance(K, np.ndarray):
            c.log_w_den = np.array(np.broadcast_to(np.asarray(b, np.float32), c.log_w_num.shape))
        else:
            xp = array_namespace(K)
            c.log_w_den = xp.asarray(xp.broadcast_to(xp.astype(b, xp.float32), c.log_w_num.shape), copy=True)
        return c
    if method in ("subgen", "subspace", "kcenter_sized"):
        return _filled(method, K, V, floats, rng, sink=sink, window=window)
    raise InputError(f"unknown method {method!r}; ours: {', '.join(OURS + CONTROLS)}; kvpress: {', '.join(KVPRESS)}")


_SUBSPACE_PROBE = True   # False: subspace's rounds on every head (the code before issue 26; tests compare the two)
_SUBGEN_COUNT = True     # False: SubGen's rounds build their caches (the code before; tests compare the two)


def _filled(method: str, K, V, floats: int, rng, *, sink: int, window: int, traversal=None) -> ts.CompressedKV:
    """SubGen / subspace / k-center with cluster sizes at equal memory. k-center's clusters of size 1 need no
    weight, so it holds less than counted: it gets more centres the same way as SubGen. SubGen's l2 draws repeat tokens, so it holds less than the floats it is
    given: it is given more (its nominal budget raised by the shortfall over its efficiency, the same seed each
    round, at most 6 rounds; when the draws saturate, exact recent tokens as below). A subspace rank costs 2 (n_mid + d) floats at once: the floats left over go to exact
    recent tokens (a longer last window). Either way the largest cache that fits ``floats`` is kept. ``traversal``
    (numpy): the greedy k-center traversal (:class:`~kvbounds.algorithms.kcenter.FarthestFirst`) of SubGen's middle
    or of k-center's keys before its window, shared by the rounds that keep the window (the same clusters as a new
    traversal per round). Subspace's held
    floats per head depend only on n, d and the rank (not on the data): its rounds run on the first head and the
    cache is built once, for every head, at the round kept."""
    d, H = K.shape[-1], K.shape[0]
    seed = int(rng.integers(2**63))
    best = [0.0, None, floats, 0]            # held floats per head, cache, nominal budget, extra window
    probe = method == "subspace" and _SUBSPACE_PROBE
    Kr, Vr, Hr = (K[:1], V[:1], 1) if probe else (K, V, H)
    count = method == "subgen" and _SUBGEN_COUNT and isinstance(K, np.ndarray)
    if count:                                # checked once, as the compressor checks them
        K, V = ca._check_cache(K, V, sink, window, floats)
        Kr, Vr = K, V
    norms2 = np.sum(V.astype(np.float64) ** 2, axis=-1) if count else None     # SubGen's l2 weights, every round

    def build(nominal: int, extra: int):
        c, trav = ca.SubGenCompressor(sink=sink, window=window + extra), None if extra else traversal
        if count:                            # K, V checked above
            return c._compress_checked(K, V, nominal, np.random.default_rng(seed), trav)
        return c.compress(K, V, budget_floats=nominal, rng=np.random.default_rng(seed), traversal=trav)

    def run(nominal: int, extra: int) -> float:
        K, V = Kr, Vr
        if count:                            # the floats it would hold; the cache kept is built once, below
            from .subgen_rounds import subgen_held_floats
            held = subgen_held_floats(K, V, nominal, seed, sink=sink, window=window + extra,
                                      traversal=None if extra else traversal, norms2=norms2) / Hr
            if best[0] < held <= floats:
                best[:] = [held, (nominal, extra), nominal, extra]
            return held
        if method == "subgen":
            c = build(nominal, extra)
        elif method == "kcenter_sized":
            # the last window's weights are 0 (no float), a centre's log-size one float unless its cluster is 1
            c = ts.KCenter(window=window, weights="cluster_size", traversal=traversal).compress(
                K, V, budget=min(K.shape[-2], window + (nominal - window * 2 * d) // (2 * d + 1)))
        else:
            c = ca.SubspaceCompressor(sink=sink, window=window + extra).compress(K, V, budget_floats=nominal)
        held = ts.memory_floats(c) / Hr
        if best[0] < held <= floats:
            best[:] = [held, c, nominal, extra]
        return held

    done = lambda: best[0] >= (1 - MEMORY_TOLERANCE / 2) * floats
    if method in ("subgen", "kcenter_sized"):    # phase 1: more draws / centres, secant on the nominal budget
        nominal, prev, base = floats, None, (sink + window) * 2 * d
        for _ in range(5):
            held = run(nominal, 0)
            if done():
                break
            eff = ((held - prev[1]) / (nominal - prev[0]) if prev and nominal != prev[0] else
                   (held - base) / max(nominal - base, 1))
            if eff < 0.5 and held <= floats:
                break                        # the draws saturate: few distinct tokens left
            prev = (nominal, held)
            nominal = int(nominal + (floats - held) / max(eff, 0.1) - (d if held > floats else 0))
    else:
        run(floats, 0)
    extra = 0                                # phase 2: what is left goes to exact recent tokens
    for _ in range(4):
        short = int(floats - best[0]) // (2 * d)
        if done() or best[1] is None or short <= 0 or K.shape[-2] - sink - window - extra - short < 2:
            break
        extra += short
        run(best[2] + (short * 2 * d if method == "subgen" else 0), extra)
    if best[1] is None:
        raise InputError(f"{method} holds more than the budget of {floats} floats per head")
    if probe:
        return ca.SubspaceCompressor(sink=sink, window=window + best[3]).compress(K, V, budget_floats=best[2])
    return build(best[2], best[3]) if count else best[1]


def compress_layer(method: str, K, V, budget: float, rng: np.random.Generator, *, sink: int, window: int
                   ) -> ts.CompressedKV:
    """One layer's K, V (Hkv, n, d) compressed by ``method`` to ``budget`` (a fraction of their floats), the step
    :func:`compress_all` takes per layer; used by the presses of :mod:`kvbounds.press`."""
    _check_kv(K, V)
    if isinstance(budget, bool) or not isinstance(budget, (int, float, np.integer, np.floating)) \
            or not 0 < budget <= 1:
        raise InputError(f"budget must be a number in (0, 1] (a fraction of the layer's floats), got {budget!r}")
    floats = int(math.floor(budget * K.shape[-2] * 2 * K.shape[-1]))
    return compress_ours(method, K, V, floats, rng, sink=sink, window=window)


def make_press(method: str, budget: float, seed: int, ratio: float | None = None):
    import kvpress
    name = method.split(":", 1)[1]
    if name not in PRESSES:
        raise InputError(f"unknown kvpress method {method!r}; choose from {', '.join(KVPRESS)}")
    cls = getattr(kvpress, PRESSES[name])
    kw = dict(compression_ratio=float(1.0 - budget if ratio is None else ratio))
    if name == "random":
        kw["seed"] = int(seed)
    return cls(**kw)


def compress_kvpress(method: str, lm, state, budget: float, seed: int, *,
                     keep_on_device: bool = False) -> list[ts.CompressedKV]:
    """Run a kvpress press's ``compress`` on every layer of the shared prefill ``state`` at the compression ratio
    that holds at most ``budget`` of the exact floats (1 - budget, raised by the excess for presses that spread
    the budget unevenly over layers, e.g. PyramidKV; at most 4 tries); its output copied to the host as numpy,
    or with ``keep_on_device`` kept as float32 tensors where the press left them."""
    d = state.keys[0].shape[-1]
    per_layer = state.keys[0].shape[1] * state.n * 2 * d
    target = math.floor(budget * state.n * 2 * d) * state.keys[0].shape[1] * len(state.keys)
    ratio, best = 1.0 - budget, None
    for _ in range(4):
        out = _press_layers(method, lm, state, budget, seed, min(max(ratio, 0.0), 0.999), keep_on_device)
        # a press keeps tokens with weights 0: 2d floats each (memory_floats' count, without reading the weights)
        held = sum(int(c.keys.shape[0]) * int(c.keys.shape[-2]) * 2 * d for c in out)
        if held <= target * (1 + MEMORY_TOLERANCE) and (best is None or held > best[0]):
            best = (held, out)
        if target * (1 - MEMORY_TOLERANCE / 2) <= held <= target:
            break
        ratio += (held - target) / (per_layer * len(state.keys)) + (0.5 / state.n if held > target else 0.0)
    if best is None:
        raise InputError(f"{method} holds more than {budget:g} of the cache at every compression ratio tried")
    return best[1]


def _press_layers(method: str, lm, state, budget: float, seed: int, ratio: float, keep_on_device: bool):
    import torch
    press = make_press(method, budget, seed, ratio)
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
_FIT = "; memory_floats: the log-weights (one per token and head), to fit the budget (equal memory)"
DEVICE_HOST_COPIES: dict[str, str] = {
    "balancekv": "the walk's FAIL flags, one bool per head and level (block_walk.panel_walk)",
    "kcenter": "greedy k-center's radii and cluster labels (kcenter.greedy_k_center, recent_plus_centers)",
    "kcenter_sized": "greedy k-center's radii and cluster labels (kcenter.greedy_k_center, recent_plus_centers)" + _FIT,
    "subgen": "greedy k-center's radii (kcenter.greedy_k_center)" + _FIT,
    "subspace": _FIT[2:],
}


def runs_on(method: str, where: str = "host") -> str:
    """Where :func:`compress_all` runs ``method``: "host" (numpy float32 copies of K, V) or "device" (torch
    tensors on the model's device); kvpress presses always run their torch ``compress`` on the device."""
    _check_method(method)
    if where not in WHERE:
        raise InputError(f"where must be one of {WHERE}, got {where!r}")
    if method.startswith("kvpress:"):
        return "device"
    return "host" if where == "host" or method in HOST_ONLY else "device"


def path_note(method: str, where: str = "host") -> str:
    """One line saying where ``method`` ran under ``where`` and what crossed to the host (for benchmark rows)."""
    _check_method(method)
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
                 seed: int = 0, where: str = "host", block_size: int = 64) -> list[ts.CompressedKV]:
    """Every layer of the prefill ``state`` compressed by ``method`` at ``budget``, one :class:`CompressedKV` per layer.

    ``where="host"`` (the records of BKV.e2e / SG.e2e): each layer's K, V copied to the host as float32 numpy and
    the compressed cache held in numpy. ``where="device"``: K, V passed as float32 torch tensors on the model's
    device and the compressed cache kept there (``harness._to_layers`` then moves nothing); methods in
    :data:`HOST_ONLY` keep the host path (:func:`runs_on` says which ran). The random draws come from ``rng`` on
    both paths, so a seed selects the same tokens."""
    path = runs_on(method, where)
    if method == "h2o":
        from .h2o import h2o_compress
        return h2o_compress(lm, state, budget, window=window, where=path)
    if method.startswith("kvpress:"):
        return compress_kvpress(method, lm, state, budget, seed, keep_on_device=where == "device")
    d = state.keys[0].shape[-1]
    floats = int(math.floor(budget * state.n * 2 * d))
    if path == "host":          # every layer at once where that gives each layer its own call's cache
        from .layer_stacks import compress_stacked
        out = compress_stacked(method, state, floats, rng, sink=sink, window=window, block_size=block_size)
        if out is not None:
            return out
    if path == "device":
        layer = lambda X: X[0].float()
    else:
        layer = lambda X: X[0].float().cpu().numpy()
    return [compress_ours(method, layer(state.keys[l]), layer(state.values[l]), floats, rng, sink=sink,
                          window=window, block_size=block_size) for l in range(len(state.keys))]

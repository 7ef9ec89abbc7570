"""Every method of the end-to-end harness as ``compress(prefill, budget, rng) -> list[CompressedKV]`` (one per layer).

The methods are the entries of the method registry (:mod:`kvbounds.methods`: each one's name, role, source and
functions). Ours (``source="kvbounds"``) each keep the first ``sink`` and last ``window`` tokens exactly and spend
the same number of floats per layer and KV head, ``budget * n * 2d`` (keys, values and log-weights counted by
:func:`kvbounds.algorithms.token_selection.memory_floats`), through the registry's contract
``compress(K, V, floats, rng, *, sink, window, block_size, Q)`` (:func:`compress_ours`), or, for a method that reads
the model's prefill (H2O, kvpress's presses), its ``compress_prefill``.

Equal memory: every method holds within 1% of ``budget x exact floats``, never more than +1%
(:data:`MEMORY_TOLERANCE`; the harness turns a row outside it into an error row). BalanceKV takes the largest
T-cache that fits and fills the rest with exact recent tokens (:func:`balance_layout`); SubGen and subspace fill
what their draws / ranks leave with exact recent tokens (:func:`fit_to_floats`); kvpress presses get the
compression ratio that holds at most the target (:func:`compress_kvpress`). Those fits live in
:mod:`kvbounds.algorithms.equal_memory` and are importable from here.

kvpress presses (``source="kvpress"``, NVIDIA kvpress, when installed): ``kvpress:<name>`` with
``compression_ratio = 1 - budget``; their ``compress`` is called layer by layer on the states captured in the
shared exact prefill (exactly what kvpress's forward hook does after each attention layer of a prefill).
"""
from __future__ import annotations

import math
from functools import cache

import numpy as np

from kvbounds import methods as registry
from kvbounds.algorithms import token_selection as ts
from kvbounds.algorithms.equal_memory import (MEMORY_TOLERANCE, balance_budgets, balance_floats,  # noqa: F401
                                              balance_layout, balance_levels, budget_problem, check_layer_kv,
                                              check_sizes, fit_to_floats)
from kvbounds.algorithms.validation import InputError, check_int, check_rng

from . import _method_names as method_lists


def _check_method(method) -> str:
    if not isinstance(method, str):
        raise InputError(f"method must be a method name (str), got {type(method).__name__}")
    return method


def source(method: str) -> str:
    """Who implements ``method``: its registry entry's source (``kvbounds``, ``kvpress``, ``external``)."""
    _check_method(method)
    if method in registry.names():
        return registry.get_method(method).source
    return "kvpress" if method.startswith("kvpress:") else "kvbounds"


def kvpress_available() -> str | None:
    """None when kvpress imports, else the reason (the rows are skipped with this note)."""
    try:
        import kvpress  # noqa: F401
    except Exception as e:   # noqa: BLE001 - any import failure means "skip the kvpress rows"
        return f"kvpress not installed ({type(e).__name__}: {e}); pip install 'kvbounds[kvpress]'"
    return None


def compress_ours(method: str, K: np.ndarray, V: np.ndarray, floats: int, rng: np.random.Generator, *,
                  sink: int, window: int, block_size: int = 64, Q=None) -> ts.CompressedKV:
    """One layer, K/V (Hkv, n, d) float32 (numpy on the host path; torch on the model's device on the device
    path, see :func:`compress_all`), ``floats`` per KV head, by the registered method's ``compress``
    (:mod:`kvbounds.methods`; ``Q``: the layer's queries, for a method that reads them); the result lives where K
    does."""
    _check_method(method)
    check_layer_kv(K, V)
    check_sizes(floats=floats, sink=sink, window=window)
    check_int(block_size, "block_size", minimum=1)
    check_rng(rng)
    m = registry.get_method(method)
    if m.compress is None:
        raise InputError(f"{method} runs on a model's prefill only (compress_all), not on one layer's K, V")
    return m.function()(K, V, floats, rng, sink=sink, window=window, block_size=block_size, Q=Q)


def compress_layer(method: str, K, V, budget: float, rng: np.random.Generator, *, sink: int, window: int, Q=None
                   ) -> ts.CompressedKV:
    """One layer's K, V (Hkv, n, d) compressed by ``method`` to ``budget`` (a fraction of their floats), the step
    :func:`compress_all` takes per layer; used by the presses of :mod:`kvbounds.presses`."""
    check_layer_kv(K, V)
    if isinstance(budget, bool) or not isinstance(budget, (int, float, np.integer, np.floating)) \
            or not 0 < budget <= 1:
        raise InputError(f"budget must be a number in (0, 1] (a fraction of the layer's floats), got {budget!r}")
    floats = int(math.floor(budget * K.shape[-2] * 2 * K.shape[-1]))
    return compress_ours(method, K, V, floats, rng, sink=sink, window=window, Q=Q)


def make_press(method: str, budget: float, seed: int, ratio: float | None = None):
    """The press of a ``kvpress:`` entry, or of a registered method with ``make_press`` (a press of one's own), at
    compression ratio ``ratio`` (default 1 - budget); a press with a ``seed`` field gets ``seed``."""
    _check_method(method)
    r = float(1.0 - budget if ratio is None else ratio)
    if method in registry.names() and registry.get_method(method).make_press is not None:
        press = registry.get_method(method).function("make_press")(r)
        if hasattr(press, "seed"):
            press.seed = int(seed)
        return press
    import kvpress
    name = method.split(":", 1)[1] if ":" in method else method
    if name not in method_lists.PRESSES:
        raise InputError(f"unknown kvpress method {method!r}; choose from {', '.join(method_lists.KVPRESS)}")
    cls = getattr(kvpress, method_lists.PRESSES[name])
    kw = dict(compression_ratio=r)
    if name == "random":
        kw["seed"] = int(seed)
    return cls(**kw)


def needs_inputs(method: str) -> bool:
    """Whether ``method`` reads the prefill's captured attention inputs (a kvpress press, one's own press, or a
    method registered with ``needs_queries``), read from the registry when asked (a method registered after this
    module was imported counts)."""
    _check_method(method)
    if method.startswith("kvpress:"):
        return True
    if method in registry.names():
        m = registry.get_method(method)
        return bool(m.needs_queries or m.make_press is not None)
    return False


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


def compress_kvpress_prefill(method: str, lm, state, budget: float, *, seed: int, sink: int, window: int,
                             where: str = "host") -> list[ts.CompressedKV]:
    """The registry's prefill form of a ``kvpress:`` method (:func:`compress_kvpress`; its output kept on the
    device when ``where="device"``)."""
    return compress_kvpress(method, lm, state, budget, seed, keep_on_device=where == "device")


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
# Methods of ours that cannot run on torch tensors, with the reason (each entry's ``host_only``):
# compress_all(where="device") gives them the host path. Empty: every method of ours runs on torch tensors
# (tests/e2e/test_e2e_device.py tries each on torch:cpu).
# Device-path methods that still read a few small arrays on the host inside modules the harness does not own (no
# copy of K or V; at most one integer per token and head; each entry's ``device_host_reads``). Everything else stays
# on the device.
# Both, and the method lists of kvbounds.e2e._method_names, are read from the registry when first asked for (PEP
# 562): the registry's methods name this module's functions, so it must not read the registry while it is imported.
@cache
def _host_only() -> dict[str, str]:
    return {m.name: m.host_only for m in registry.methods() if m.host_only}


@cache
def _device_host_copies() -> dict[str, str]:
    return {m.name: m.device_host_reads for m in registry.methods() if m.device_host_reads}


def __getattr__(name):
    if name == "HOST_ONLY":
        return _host_only()
    if name == "DEVICE_HOST_COPIES":
        return _device_host_copies()
    if name in method_lists.__all__:
        return getattr(method_lists, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _on_kvpress(method: str) -> bool:
    return source(method) == "kvpress"


def runs_on(method: str, where: str = "host") -> str:
    """Where :func:`compress_all` runs ``method``: "host" (numpy float32 copies of K, V) or "device" (torch
    tensors on the model's device); kvpress presses always run their torch ``compress`` on the device."""
    _check_method(method)
    if where not in WHERE:
        raise InputError(f"where must be one of {WHERE}, got {where!r}")
    if _on_kvpress(method):
        return "device"
    return "host" if where == "host" or method in _host_only() else "device"


def path_note(method: str, where: str = "host") -> str:
    """One line saying where ``method`` ran under ``where`` and what crossed to the host (for benchmark rows)."""
    _check_method(method)
    path = runs_on(method, where)
    if _on_kvpress(method):
        return "torch press on the device; " + ("output kept there" if where == "device" else
                                                 "output copied to the host (numpy) and back")
    if path == "host":
        why = f" ({_host_only()[method]})" if where == "device" and method in _host_only() else ""
        return f"host: numpy float32 copies of K, V{why}"
    extra = _device_host_copies().get(method)
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
    m = registry.get_method(method)
    if m.compress_prefill is not None:      # a method that reads the model's prefill (H2O, kvpress's presses)
        return m.function("compress_prefill")(method, lm, state, budget, seed=seed, sink=sink, window=window,
                                              where=where)
    d = state.keys[0].shape[-1]
    floats = int(math.floor(budget * state.n * 2 * d))
    if path == "host":          # every layer at once where that gives each layer its own call's cache
        from ._layer_stacks import compress_stacked
        out = compress_stacked(method, state, floats, rng, sink=sink, window=window, block_size=block_size)
        if out is not None:
            return out
    if path == "device":
        layer = lambda X: X[0].float()
    else:
        layer = lambda X: X[0].float().cpu().numpy()
    return [compress_ours(method, layer(state.keys[l]), layer(state.values[l]), floats, rng, sink=sink,
                          window=window, block_size=block_size) for l in range(len(state.keys))]

"""The walks BalanceKV runs inside a stream, recorded as they happen and measured with
:mod:`kvbounds.algorithms.walk_diagnostics`, without changing what they do.

* :func:`record_merge_and_reduce`: every SoftmaxBalance call (BalanceKV-NeurIPS Alg. 2) made by a MergeAndReduce
  (Alg. 1's numerator and denominator instances, :class:`kvbounds.algorithms.balance_kv.BalanceKV`): its cell K, V,
  radii, c, signs, and the state of its Generator before the call, from which the walk's uniforms are drawn again;
* :func:`record_halvings`: every halving of the streaming press (:mod:`kvbounds.presses._streaming.balance`, the walk
on pair
  differences): the group's keys, values and liveness, the Gram D of the differences, the uniforms and the signs.

Both wrap a module-level function for the duration of a ``with`` block (the wrapped function returns exactly what
the original returns) and restore it on exit; only walks run by the thread that entered the block are recorded (the
runner's trials run one per process, or one thread at a time in-process). :func:`merge_and_reduce_diagnostics` /
:func:`halving_diagnostics` then recompute each walk's signs from the recorded uniforms (they must equal the recorded signs: ``replayed``) and
the block's numbers as recorded, and with the block's keys centred (the released code's centring; the walk's R^2
then from the centred block, as the released walk normalises by its block).
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import threading
from typing import Any

import numpy as np

from kvbounds.algorithms import walk_diagnostics as wd
from kvbounds.algorithms.validation import InputError
from kvbounds.algorithms.arrays import to_numpy
from kvbounds.algorithms import merge_and_reduce as mr
from kvbounds.algorithms.softmax_balance import normalized_kernel_gram

__all__ = ["DELTA", "WalkCall", "Halving", "record_merge_and_reduce", "record_halvings", "merge_and_reduce_diagnostics",
           "halving_diagnostics", "summary", "per_layer"]

DELTA = 0.01          # the streaming walk's delta (kvbounds.presses._streaming.balance.walk_signs' default)


@dataclasses.dataclass
class WalkCall:
    """One SoftmaxBalance call of a MergeAndReduce: its inputs, constant, signs and Generator state before it."""
    K: np.ndarray
    V: np.ndarray
    r_key: float
    r_value: float
    scale: float
    c: float
    signs: np.ndarray
    rng_state: dict
    bit_generator: type


@dataclasses.dataclass
class Halving:
    """One halving of the streaming press: rows = layers x batch x KV heads stacked."""
    K: np.ndarray           # (B, 2P, d)
    V: np.ndarray           # (B, 2P, e)
    alive: np.ndarray       # (B, 2P) bool
    scale: float
    D: np.ndarray           # (B, P, P) the normalised Gram of the pair differences
    uniforms: np.ndarray    # (B, P)
    signs: np.ndarray       # (B, P)
    delta: float = DELTA    # the walk's delta: c = 30 log(max(P, 2) / delta) max_p D_pp


@contextlib.contextmanager
def _wrapped(module, name: str, make):
    """``module.name`` replaced by ``make(original, recording)`` inside the block; ``recording()`` is true in the
    entering thread while the block runs. On exit the original comes back (unless another wrapper was put over this
    one meanwhile: this one then stays in the chain, passing calls through and recording nothing)."""
    original = getattr(module, name)
    state = dict(active=True, thread=threading.get_ident())
    wrapper = make(original, lambda: state["active"] and threading.get_ident() == state["thread"])
    setattr(module, name, wrapper)
    try:
        yield
    finally:
        state["active"] = False
        if getattr(module, name) is wrapper:
            setattr(module, name, original)


@contextlib.contextmanager
def record_merge_and_reduce():
    """``with record_merge_and_reduce() as calls:`` every SoftmaxBalance call of a MergeAndReduce inside the block is
    appended to ``calls`` (a list of :class:`WalkCall`)."""
    calls: list[WalkCall] = []

    def make(original, recording):
        def softmax_balance(K, V, *, delta, rng, **kw):
            if not recording():
                return original(K, V, delta=delta, rng=rng, **kw)
            state = copy.deepcopy(rng.bit_generator.state)
            res = original(K, V, delta=delta, rng=rng, **kw)
            scale = kw.get("scale")
            calls.append(WalkCall(np.asarray(to_numpy(K), np.float64), np.asarray(to_numpy(V), np.float64),
                                  float(res.r_key), float(res.r_value),
                                  1 / math.sqrt(K.shape[-1]) if scale is None else float(scale), float(res.c),
                                  np.asarray(to_numpy(res.signs), np.float64), state, type(rng.bit_generator)))
            return res
        return softmax_balance

    with _wrapped(mr, "softmax_balance", make):
        yield calls


@contextlib.contextmanager
def record_halvings():
    """``with record_halvings() as halvings:`` every halving of a streaming BalanceKV press inside the block is
    appended to ``halvings`` (a list of :class:`Halving`)."""
    # the probe wraps the streaming walk in place: the one import of another room's internals (test_structure.py)
    from kvbounds.presses._streaming import balance
    halvings: list[Halving] = []
    pending: dict[str, Any] = {}

    def make_gram(original, recording):
        def pair_gram(K, V, alive, scale):
            if recording():
                pending.update(K=K.double().numpy(), V=V.double().numpy(), alive=alive.numpy().copy(),
                               scale=float(scale))
            return original(K, V, alive, scale)
        return pair_gram

    def make_walk(original, recording):
        def walk_signs(D, uniforms, *args, **kw):
            signs, disc2 = original(D, uniforms, *args, **kw)
            if not (recording() and pending):
                return signs, disc2
            delta = args[0] if args else kw.get("delta", DELTA)
            halvings.append(Halving(D=D.numpy().copy(), uniforms=uniforms.double().numpy().copy(),
                                    signs=signs.numpy().copy(), delta=float(delta), **pending))
            pending.clear()
            return signs, disc2
        return walk_signs

    with _wrapped(balance, "pair_gram", make_gram), _wrapped(balance, "walk_signs", make_walk):
        yield halvings


def merge_and_reduce_diagnostics(calls: list[WalkCall]) -> list[dict]:
    """Per recorded call: ``{"raw": ..., "centred": ..., "replayed": bool, "tokens": t}``. raw: the walk's own
    normalised Gram (:func:`kvbounds.algorithms.softmax_balance.normalized_kernel_gram` with its radii, R^2 = 1, its
    c); centred: the block's keys centred, the kernel e^{<k, k'> scale} <v, v'> with R^2 from the centred block.
    The released rule is left out (it is not Alg. 1's walk)."""
    out = []
    for call in calls:
        rng = np.random.Generator(call.bit_generator())
        rng.bit_generator.state = call.rng_state
        U = rng.random(call.K.shape[:-1])
        G = normalized_kernel_gram(call.K, call.V, call.r_key, call.r_value, scale=call.scale)
        raw = wd.walk_diagnostics(G, U, c=call.c, r2=1.0)
        raw.update(wd.key_geometry(call.K, scale=call.scale))
        replayed = bool(np.array_equal(wd.rule_signs(G, U, c=call.c, r2=1.0)["theorem"], call.signs))
        kg = wd.exp_kernel_gram(call.K, call.V, scale=call.scale, const=0.0, centre=True)
        cen = wd.walk_diagnostics(kg.gram, U, c=call.c, r2=kg.r2)
        cen.update(wd.key_geometry(call.K, scale=call.scale, centre=True))
        out.append(dict(raw=raw, centred=cen, replayed=replayed, tokens=int(call.K.shape[-2])))
    return out


def halving_diagnostics(halvings: list[Halving]) -> list[dict]:
    """Per recorded halving: ``{"raw": ..., "centred": ..., "replayed": bool, "pairs": P}``, each number per row
    (layer x batch x KV head). raw: the walk's D and c = 30 log(max(P, 2) / delta), R^2 = max_p D_pp (as the walk);
    centred: D of the group's keys minus their mean over its live tokens."""
    from kvbounds.presses._streaming.balance import pair_gram   # the walk's own Gram matrix (another room's internals)
    import torch
    out = []
    for h in halvings:
        P = h.D.shape[-1]
        c = 30.0 * math.log(max(P, 2) / h.delta)
        raw = wd.walk_diagnostics(h.D, h.uniforms, c=c)
        replayed = bool(np.array_equal(wd.rule_signs(h.D, h.uniforms, c=c)["theorem"], h.signs))
        w = h.alive[..., None].astype(np.float64)
        mu = (h.K * w).sum(-2, keepdims=True) / np.maximum(w.sum(-2, keepdims=True), 1.0)
        Kc = (h.K - mu) * w
        Dc, _, _ = pair_gram(torch.as_tensor(Kc), torch.as_tensor(h.V), torch.as_tensor(h.alive), h.scale)
        cen = wd.walk_diagnostics(Dc.numpy(), h.uniforms, c=c)
        raw.update(wd.key_geometry(h.K, scale=h.scale, alive=h.alive))
        cen.update(wd.key_geometry(h.K, scale=h.scale, alive=h.alive, centre=True))
        out.append(dict(raw=raw, centred=cen, replayed=replayed, pairs=P))
    return out


def summary(diags: list[dict]) -> dict:
    """{"raw": {number: {median, min, max}}, "centred": ..., "walks": count, "replayed": all replayed} over the
    per-walk dicts of :func:`merge_and_reduce_diagnostics` or :func:`halving_diagnostics` (record fields)."""
    if not diags:
        return dict(walks=0)
    return dict(raw=wd.summarize_diagnostics(*[d["raw"] for d in diags]),
                centred=wd.summarize_diagnostics(*[d["centred"] for d in diags]),
                walks=len(diags), replayed=all(d["replayed"] for d in diags))


def per_layer(diags: list[dict], n_layers: int) -> list[dict]:
    """:func:`summary` per layer of the per-halving dicts of :func:`halving_diagnostics`, whose rows are layer-major
    (the press stacks layers x batch x KV heads): one summary per layer, in layer order."""
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
        raise InputError(f"n_layers must be an integer >= 1, got {n_layers!r}")
    out = []
    for layer in range(n_layers):
        part = []
        for d in diags:
            rows = d["raw"]["offdiag_share"].shape[0]
            if rows % n_layers:
                raise InputError(f"{rows} rows do not split into {n_layers} layers")
            sl = slice(layer * (rows // n_layers), (layer + 1) * (rows // n_layers))
            part.append({side: {k: v[sl] if isinstance(v, np.ndarray) else v for k, v in d[side].items()}
                         for side in ("raw", "centred")} | dict(replayed=d["replayed"]))
        out.append(summary(part))
    return out

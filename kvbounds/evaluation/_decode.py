"""``kvbounds evaluate SPEC --decode`` (on by itself for a kvpress decoding press): the battery at decode time, on
streams that grow past the compressed prompt, the protocol of kvpress's ``DecodingPress`` on a bare stream.

A stream of P + N tokens (:mod:`kvbounds.streams`): the press compresses the prompt's P tokens to a fixed
``target`` = floor(f P) tokens (f the evaluation's headline fraction); then tokens arrive one by one, each appended
to the cache exactly, and every ``interval`` tokens the press compresses the cache back to ``target``, reading the
queries of the tokens buffered since its last compression (as ``DecodingPress`` passes its buffered hidden states;
a decoding press's own ``compression_interval`` when SPEC is one). After each compression at history length t, the
next ``interval`` queries (held out) read the cache, and every control of the battery is built on the whole history
of t tokens at the floats the cache holds then. The stream's metric, for the method and each control, is the mean
over these checkpoints of the relative attention error (:func:`kvbounds.battery.relative_error`); the
calls are the power rule's (:func:`kvbounds.battery.power_vs_controls`, one setting per family).

Presses only: a compressor with the method contract compresses a whole prefix, and a cache it returned (weighted
tokens) is not a stream it can take again; the package's own streaming algorithms are checked at decode time by the
claims BKV.decode and SG.decode.
"""
from __future__ import annotations

import math

import numpy as np

from kvbounds.algorithms.validation import InputError

CLAIM = "evaluate"
CHECK = "decode"
SOURCE = "kvbounds evaluate --decode: the battery while the cache is recompressed as the stream grows"
# per profile: families (None: the battery's), streams per family, prompt tokens, new tokens, interval, head dim
SETUP = {"smoke": dict(families=("synthetic benign", "concentrated"), streams=10, prompt=96, new=160, interval=80,
                       d=32),
         "quick": dict(families=None, streams=20, prompt=192, new=320, interval=80, d=64),
         "full": dict(families=None, streams=40, prompt=256, new=256, interval=64, d=64)}

__all__ = ["decode_trials", "run_trial", "run_decode", "SETUP"]


def decode_trials(spec: str, profile: str, ratio: float, seed: int, interval: int | None = None) -> list[dict]:
    from ._streams import families, stream_seed
    s = SETUP[profile]
    fams = s["families"] or families(profile)
    return [dict(spec=spec, family=f, rep=i, prompt=s["prompt"], new=s["new"], interval=int(interval or s["interval"]),
                 d=s["d"], fraction=round(1.0 - ratio, 6), stream_seed=stream_seed(seed, f, i), mode="decode")
            for f in fams for i in range(s["streams"])]


def _positions(kept_keys: np.ndarray, K: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """The stream positions (among ``pool``) of the keys a press kept (a press returns keys, not positions); a key
    that occurs several times maps to its occurrences in order."""
    index: dict[bytes, list[int]] = {}
    for p in pool[::-1]:
        index.setdefault(K[p].tobytes(), []).append(int(p))
    out = []
    for row in kept_keys:
        hits = index.get(np.ascontiguousarray(row).tobytes())
        if not hits:
            raise InputError("the press returned a key that is not one of the cache's: a decode-time press must keep "
                             "tokens (merging presses are evaluated on the prompt only)")
        out.append(hits.pop())
    return np.sort(np.asarray(out, np.int64))


def run_trial(params: dict, seed: int = 0, backend: str = "numpy"):
    from kvbounds import battery
    from kvbounds.algorithms.compressed_kv import CompressedKV
    from kvbounds.core import make_record
    from kvbounds.streams import make_stream
    from ._spec import resolve
    from kvbounds.battery import relative_error
    from ._streams import in_canonical_order
    from ._stream_press import ratio_for, run_press
    spec = resolve(params["spec"])
    if spec.make_press is None:
        raise InputError(f"{spec.spec} is a compressor, not a press: the decode-time check runs presses")
    P, N, step = int(params["prompt"]), int(params["new"]), int(params["interval"])
    seed = int(params["stream_seed"])
    try:
        real = params["family"] in ("real SmolLM2", "real MiniLM")
        s = make_stream(params["family"], P + N, int(params["d"]), seed=seed,
                        unit=int(params["rep"]) if real and "rep" in params else None)
    except LookupError as e:
        return make_record(CLAIM, params, measured=math.nan, bound=math.nan, holds=True, bound_kind="shape",
                           check=CHECK, source=SOURCE, missing=str(e), family=params["family"])
    K, V, Q = s.K, s.V, s.Q
    d, dv = K.shape[1], V.shape[1]
    target = max(1, int(math.floor(params["fraction"] * P)))
    rng = np.random.default_rng([seed, 1])
    scale = 1.0 / math.sqrt(d)

    def press_keep(pool: np.ndarray, queries_from: int) -> np.ndarray:
        n = len(pool)
        if n <= target:
            return pool
        press = spec.make_press(ratio_for(target, n))
        if hasattr(press, "seed"):
            press.seed = int(rng.integers(2**62))
        k, _ = run_press(press, K[pool][None], V[pool][None], Q[queries_from:pool[-1] + 1][None], target,
                         name=spec.spec, seed=int(rng.integers(2**62)))
        return _positions(k[0], K, pool)

    kept = press_keep(np.arange(P), 0)
    method, ctl = [], {}
    t = P
    while t < P + N:
        q = Q[t:min(t + step, P + N)]
        x = q @ K[:t].T * scale
        w = np.exp(x - x.max(-1, keepdims=True))
        exact = (w @ V[:t]) / w.sum(-1, keepdims=True)
        z = np.zeros((1, len(kept)))
        cache = CompressedKV(K[kept][None], V[kept][None], z, z.copy())
        method.append(relative_error(battery.attention(in_canonical_order(cache), q, scale), exact))
        held = battery.cache_floats(cache)
        for name, c in battery.controls(K[None, :t], V[None, :t], held, rng).items():
            ctl.setdefault(name, []).append(relative_error(battery.attention(in_canonical_order(c), q, scale), exact))
        new = np.arange(t, min(t + step, P + N))
        t = int(new[-1]) + 1
        if t < P + N:
            kept = press_keep(np.concatenate([kept, new]), int(new[0]))
    m = float(np.mean(method))
    controls = {k: float(np.mean(v)) for k, v in ctl.items()}
    whole = battery.stream_floats(P, d, dv)
    from ._streams import unit_of
    extra = dict(controls=controls, floats=battery.floats_record(target * (d + dv), whole), family=params["family"],
                 checkpoints=len(method), target=target, note=s.note, unit=unit_of(params, s))
    return make_record(CLAIM, params, measured=m, bound=min(controls.values()), holds=m < min(controls.values()),
                       bound_kind="shape", check=CHECK, source=SOURCE, **extra)


def run_decode(resolved, *, profile: str, ratio: float, seed: int, out, workers=None, progress: bool = True,
               sys_path=()) -> dict:
    """Run (or resume) the decode trials; returns {"setup", "headline", "calls"} or {"skipped": why}. ``sys_path``:
    directories the worker processes put first on their module path (:func:`kvbounds.run.run_trials`)."""
    from kvbounds.battery import power_vs_controls, stream_unit, unit_words
    from kvbounds.verdict import summary_words
    from kvbounds.core import ResultStore
    from kvbounds.run import Trial, run_trials
    if resolved.make_press is None:
        return {"skipped": "the decode-time check runs presses; a compressor with the method contract compresses a "
                           "whole prefix (the package's streaming algorithms are checked by BKV.decode / SG.decode)"}
    ps = decode_trials(resolved.spec, profile, ratio, seed, resolved.interval)
    trials = [Trial(CLAIM, p, seed, "numpy", __name__) for p in ps]
    try:
        run_trial(dict(ps[0]), 0)             # the first stream here: a press that cannot decode fails before any record
    except InputError as e:
        return {"skipped": f"not run at decode time: {e}"}
    run_trials(trials, out=out, workers=workers, progress=progress, run=dict(profile=profile, backend="numpy",
                                                                              seed=seed), writer="evaluate",
               sys_path=sys_path)
    keys = {t.key for t in trials}
    contents = ResultStore(out).read()
    records = [r for r in contents.records if r.key in keys]
    errors = [e.error for e in contents.errors if e.key in keys]
    power = power_vs_controls(records, setting=lambda r: r.extra["family"], metric="relative attention error",
                              unit=unit_words, unit_of=stream_unit, named_metric="practitioner")
    calls = [dict(c, held_fraction=c["fraction"], fraction=ps[0]["fraction"]) for c in power.calls]
    s = SETUP[profile]
    setup = (f"prompt {s['prompt']} tokens compressed to {100 * (1 - ratio):.0f}% of them, then {s['new']} tokens "
             f"appended and the cache recompressed every {ps[0]['interval']} (kvpress's DecodingPress on a stream); "
             f"held-out queries after each compression; {s['streams']} streams per family")
    return {"setup": setup, "headline": summary_words(calls) or "not tested", "calls": calls, "errors": errors,
            "decoding_press": resolved.decoding}

"""Fuzz entries of the battery (kvbounds.battery): the controls at a float budget, their memory count and their
estimates, run() with a method, the sketch battery and the float bookkeeping."""
from __future__ import annotations

import numpy as np

from fuzz_harness import RNG, Entry, compare_attention, make_array

from kvbounds import battery as bt
from kvbounds.algorithms.frequent_directions import FrequentDirections


def _kvq(rng, cls):
    n, d, dv = int(rng.integers(1, 12)), int(rng.integers(1, 5)), int(rng.integers(1, 4))
    return dict(K=make_array(rng, (n, d), cls), V=make_array(rng, (n, dv), cls), q=make_array(rng, (d,), cls))


def _controls_call(K, V, q, floats, rng, sink, window, scale):
    cs = bt.controls(K, V, floats, rng, sink=sink, window=window, ablation=bt.streaming_llm)
    held = bt.run(bt.uniform, K, V, floats, rng, sink=sink, window=window)
    out = {}
    for name, c in cs.items():
        (m, u), lz = bt.numerator(c, q, scale), bt.log_partition(c, q, scale)
        # an empty cache (zeros, or a budget below one token) has the sums 0: m = log 0 = -inf, documented
        empty = c.keys.shape[-2] == 0
        if empty and not (m == -np.inf and lz == -np.inf and not np.any(u)):
            m = np.nan
        out[name] = (bt.cache_floats(c), bt.attention(c, q, scale), 0.0 if empty else m, u, 0.0 if empty else lz,
                     c.keys, c.values)
    return out, {name: bt.cache_floats(c) for name, c in held.items()}, bt.tokens_for(floats, K.shape[1], V.shape[1])


def _check_controls(out, K, V, q, floats, rng, sink, window, scale):
    cs, held, tokens = out
    if set(cs) != set(bt.CONTROLS):
        return f"controls {sorted(cs)}"
    if np.any(cs["zeros"][1] != 0) or cs["zeros"][0] != 0:
        return "zeros is not the empty cache"
    n, d, dv = K.shape[0], K.shape[1], V.shape[1]
    for name, (f, *_rest) in cs.items():
        if name != "mean" and f > max(floats, 0):
            return f"{name} holds {f} floats for a budget of {floats}"
    if held["streaming_llm"] > held["method"]:
        return f"run: streaming_llm holds {held['streaming_llm']} > the method's {held['method']}"
    if not np.allclose(cs["mean"][1], np.asarray(V, np.float64).mean(0), rtol=1e-6, atol=1e-300):
        return "the mean's attention is not the mean of the values"
    keys, values = cs["streaming_llm"][5:]
    if tokens != floats // (d + dv) or keys.shape[0] != min(tokens, n):
        return f"streaming_llm keeps {keys.shape[0]} tokens for {tokens}"
    if keys.shape[0] == 0:
        return None
    return compare_attention(cs["streaming_llm"][1], q, np.asarray(keys), np.asarray(values),
                             d ** -0.5 if scale is None else scale)


def _rows(rng, cls):
    return dict(A=make_array(rng, (int(rng.integers(1, 12)), int(rng.integers(1, 5))), cls))


def _sketch_call(A, floats, rng):
    s = bt.sketch_controls(A, floats, rng, ablation=lambda A, f, r: A[:1])      # checks A first
    fd = FrequentDirections(A.shape[1], 2).update(A)
    return (s, bt.method_floats(fd), bt.compression_problem(floats, bt.stream_floats(A.shape[0], A.shape[1])),
            bt.floats_record(floats, A.size, {"zeros": 0}), bt.ablation_of("uniform"))


def _check_sketch(out, A, floats, rng):
    s, fd_floats, why, rec, abl = out
    n, d = A.shape
    if fd_floats != 4 * d + 1 or abl is not None:
        return f"FD floats {fd_floats}, ablation of uniform {abl}"
    if (why == "") != (floats < n * d) or rec["method"] != floats:
        return f"compression_problem {why!r} / floats_record {rec}"
    if s["streaming_llm"].shape[0] != min(floats // d, n) or s["zeros"].shape != (0, d):
        return f"sketch shapes {({k: v.shape for k, v in s.items()})}"
    return None


ENTRIES = [
    Entry("controls+run+zeros+mean+streaming_llm+uniform+cache_floats+attention+numerator+log_partition+tokens_for",
          _kvq, dict(floats=50, rng=RNG, sink=1, window=1, scale=0.5), _controls_call, _check_controls,
          torch_ok=False),
    Entry("sketch_controls+method_floats+compression_problem+floats_record+stream_floats+ablation_of", _rows,
          dict(floats=20, rng=RNG), _sketch_call, _check_sketch, torch_ok=False),
]

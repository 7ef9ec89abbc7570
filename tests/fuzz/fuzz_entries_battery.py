"""Fuzz entries of the battery (kvbounds.battery): the controls at a float budget, their memory count and their
estimates, run() with a method, the sketch battery and the float bookkeeping."""
from __future__ import annotations

import numpy as np

from fuzz_harness import RNG, Entry, compare_attention, make_array

from kvbounds.battery import _ablations as ab
from kvbounds.battery import _controls as bt
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


# -- the ablations' helpers and the index selections -------------------------------------------------------------
def _split_call(K, V, den_floats, num_floats, rng, sink, window):
    c = ab.split_uniform(K, V, den_floats, num_floats, rng, sink=sink, window=window)
    n = K.shape[0]
    tokens = min(3, n)
    return (bt.cache_floats(c), c.keys.shape[0], bt.streaming_llm_indices(n, tokens, sink),
            bt.uniform_indices(n, tokens, rng, sink, window)[0], ab.random_basis(K.shape[1], 1, rng),
            ab.random_basis_sketch(K, 1, rng), ab.random_projection_sketch(K, 2, rng), ab.sketch_basis(K[None], 1, rng))


def _check_split(out, K, V, den_floats, num_floats, rng, sink, window):
    floats, m, sl, un, U, S, P, B = out
    n, d = K.shape
    if len(sl) != min(3, n) or len(un) != min(3, n) or len(set(un.tolist())) != len(un):
        return f"indices {sl}, {un}"
    if not np.allclose(U @ U.T, np.eye(1)) or S.shape != (1, d):
        return f"random basis {U}, sketch {S.shape}"
    if P.shape != (2, d) or not np.all(np.isfinite(P)) or B.shape != (1, 1, d):
        return f"random projection {P.shape}, sketch basis {B.shape}"
    return None


# -- the one rule for "better" (kvbounds.verdict) and its words (kvbounds.verdict) ----------------------------
def _pair_arrays(rng, cls):
    n = int(rng.integers(10, 16))
    return dict(method=np.abs(make_array(rng, (n,), cls)) + 1e-3, control=np.abs(make_array(rng, (n,), cls)) + 1e-3)


def _rule_call(method, control, tests, alpha):
    from kvbounds.verdict import _calls as pc
    from kvbounds.verdict import _call_words as pw
    m, c = np.asarray(method, np.float64), np.asarray(control, np.float64)
    floor = pc.smallest_p(len(m), tests)                     # the family's size is checked here first
    units = pc.per_unit([(i % max(len(m) // 2, 1), float(v)) for i, v in enumerate(m)])
    comps = [pc.Comparison("f", "streaming_llm", m, c, 0.2)] + [pc.Comparison("g", "zeros", c, m)] * (tests - 1)
    calls = pc.paired_calls(comps, alpha=alpha, metric="practitioner")
    d = [x.as_dict() for x in calls]
    diff = pc.paired_calls([pc.Comparison("f", "uniform", m, c)], scale="difference", lower_is_better=False,
                           threshold=0.0, alpha=alpha)[0].as_dict()
    x = pc.effects(m, c)
    return (d[0], diff, pw.call_words(d[0]), pw.summary_words(d), pw.versus_doing_nothing(d), pw.numbers(d[0]),
            pw.head_words(d[0]), pw.metric_prefix(d), pw.holm_family_words(d, alpha), pw.fmt(d[0]["effect"]),
            pc.signed_rank(x), pc.hodges_lehmann(x), floor, pc.detectable(x, tests, alpha),
            pc.label("zeros"), pc.control_order("zeros"), pc.metric_words("theorem"), units, pc.Call.__name__,
            pc.rule_for("passkey: answer log-likelihood (nats)"), len(pw.headline_calls(d)))


def _check_rule(out, method, control, tests, alpha):
    d, diff = out[0], out[1]
    for c in (d, diff):
        if c["call"] not in ("better", "leaning better", "tied", "leaning worse", "worse", "not attainable"):
            return f"call {c['call']}"
        lo, hi = c["ci"]
        if not lo <= c["effect"] <= hi:
            return f"effect {c['effect']} outside [{lo}, {hi}]"
        if not 0 <= c["p_raw"] <= c["p"] <= 1:
            return f"p {c['p_raw']} -> {c['p']}"
    return None


def _rule_nonfinite_ok(out, **kw) -> bool:
    """Documented non-finite fields only: a fraction not given (NaN), no detectable effect at this n (NaN), an
    interval too wide for the units (+-inf; a ratio's ends 0 and inf); never a NaN effect or p."""
    for c in out[:2]:
        if any(not np.isfinite(c[k]) for k in ("p", "p_raw", "smallest_p")) or np.isnan(c["effect"]):
            return False
    return True


# -- the battery along a stream (proofs_checks.power_streams) ---------------------------------------------------------
def _stream_battery_call(K, V, q, floats, scale):
    from kvbounds.streams import _power as ps
    bat = ps.StreamBattery(np.random.default_rng(0))
    bat.caches(K, V, floats)                                 # the battery's checks of K, V and floats come first
    bt.attention(bt.mean(K, V), q, scale)                    # and of q (the check computes its exact value next)
    from kvbounds.algorithms.validation import InputError
    if np.ndim(q) != 1:
        raise InputError("one query (d,) per checkpoint")      # a check's own shape; the battery broadcasts more
    scale = K.shape[1] ** -0.5 if scale is None else scale
    with np.errstate(over="ignore", invalid="ignore"):
        x = np.asarray(K, np.float64) @ np.asarray(q, np.float64) * scale
    if not np.all(np.isfinite(x)):
        raise InputError("the logits overflow")
    w = np.exp(x - x.max())
    exact = w @ np.asarray(V, np.float64) / w.sum()
    bat.attention(q, K, V, floats, scale, exact, 1.0)
    bat.numerator(q, K, V, floats, scale, float(x.max()), w @ np.asarray(V, np.float64), 1.0)
    bat.partition(q, K, floats, scale, float(x.max() + np.log(w.sum())))
    rec = ps.battery_record("X.claim", {}, "src", 0.5, bat.values(), method_floats=floats,
                            stream_floats=ps.streams_per_family("quick") * 0 + K.size + V.size)
    return bat.values(), rec.extra["floats"], rec.extra.get("not_tested", "")


ENTRIES += [
    Entry("split_uniform+streaming_llm_indices+uniform_indices+random_basis+random_basis_sketch"
          "+random_projection_sketch+sketch_basis", _kvq,
          dict(den_floats=30, num_floats=40, rng=RNG, sink=1, window=1), lambda K, V, q, **kw: _split_call(K, V, **kw),
          lambda out, K, V, q, **kw: _check_split(out, K, V, **kw), torch_ok=False),
    Entry("paired_calls+Comparison+Call+per_unit+effects+signed_rank+hodges_lehmann+smallest_p+detectable+call_words+"
          "summary_words+head_words+metric_prefix+holm_family_words+metric_words", _pair_arrays, dict(tests=4, alpha=0.05),
          _rule_call, _check_rule, torch_ok=False, nonfinite_ok=_rule_nonfinite_ok),
    Entry("StreamBattery+battery_record+streams_per_family", _kvq, dict(floats=50, scale=0.5),
          _stream_battery_call, torch_ok=False,      # an error that overflows is +inf (the worst), never NaN
          nonfinite_ok=lambda out, **kw: not any(np.isnan(v) for v in out[0].values())),
]

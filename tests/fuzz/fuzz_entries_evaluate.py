"""Fuzz entries of ``kvbounds evaluate`` and ``kvbounds.testing``: the KV stream families, the assertions' error, the
press adapter on a bare stream (KnormPress against its own definition), the budget-to-ratio arithmetic, the SPEC
parser, the relative error and the canonical order of a cache, the end-to-end harness's needs_inputs."""
from __future__ import annotations

import math

import numpy as np

from fuzz_harness import RNG, Entry, make_array

from kvbounds.algorithms.compressed_kv import CompressedKV
from kvbounds.e2e._methods import needs_inputs
from kvbounds.evaluation._spec import check_ratio, resolve
from kvbounds.battery import relative_error
from kvbounds.evaluation import _streams as ES
from kvbounds.evaluation._streams import in_canonical_order
from kvbounds.evaluation._stream_press import kept_tokens, press_compressor, ratio_for
from kvbounds.testing import attention_error, make_stream
from kvbounds.streams import FAMILIES

# Public callables of these modules that no entry here calls, each with its reason (tests/fuzz/test_fuzz.py records the
# calls of every entry; evaluate, its argument checks, assert_beats with compare_on_streams, assert_attention_error
# and kv_streams with families_here are called by tests/fuzz/fuzz_entries_harm.py): functions of a whole evaluation (a
# SPEC, a profile and an output directory: seconds to minutes; tests/evaluation/test_evaluate.py, tests/evaluation/test_evaluate_faces.py):
# summary, calls_of, regime, default_out, write_outputs, render_card, report_style, tone_of, run_e2e, e2e_trials,
# run_decode, decode_trials, trials, families, fractions, stream_seed, stream_of, run_trial, add_parser, run,
# print_result, and stream_words (the words of a stream whose trial raised); data holders and exceptions: KVStream,
# Resolved, StreamLayer, PressError, SpecError, EvaluationError; probes without arrays: is_press, is_decoding_press,
# real_available, run_press (reached through press_compressor below); the pytest plugin's hooks and fixtures
# (tests/testing/test_testing_api.py runs them in suites of their own): pytest_addoption, pytest_configure,
# pytest_collection_modifyitems, pytest_terminal_summary, profile_of, kvbounds_profile, kvbounds_stream,
# kvbounds_real_trace; resolve_object (an object instead of a SPEC string: reached through resolve's entry).
NOT_ENTRY_POINTS = {
    "summary", "calls_of", "regime", "default_out", "write_outputs", "render_card", "report_style", "tone_of",
    "run_e2e", "e2e_trials", "run_decode", "decode_trials", "trials", "families", "fractions", "stream_seed",
    "stream_of", "run_trial", "add_parser", "run", "print_result", "stream_words", "KVStream", "Resolved",
    "StreamLayer", "PressError", "SpecError", "EvaluationError", "is_press", "is_decoding_press", "real_available",
    "run_press", "pytest_addoption", "pytest_configure", "pytest_collection_modifyitems", "pytest_terminal_summary",
    "profile_of", "kvbounds_profile", "kvbounds_stream", "kvbounds_real_trace", "resolve_object",
}


def _check_stream(out, family, n, d, seed):
    if out.n != n or out.family != family or out.Q.shape != out.K.shape or out.V.shape[0] != n:
        return f"shapes {out.Q.shape}, {out.K.shape}, {out.V.shape} for n = {n}"
    if not all(np.all(np.isfinite(x)) for x in (out.Q, out.K, out.V)):
        return "non-finite stream"
    again = make_stream(family, n, d, seed)
    return None if np.array_equal(again.K, out.K) else "not reproducible"


def _stream_entry(family):
    d = 4 if family != "rope" else 4
    return Entry(f"make_stream[{family}]", lambda r, c: {}, dict(family=family, n=12, d=d, seed=3),
                 lambda family, n, d, seed: make_stream(family, n, d, seed), _check_stream)


def _err_arrays(rng, cls):
    return dict(estimate=make_array(rng, (4,), cls), query=make_array(rng, (4,), cls))


def _err_call(estimate, query, scale):
    s = make_stream("clustered", 10, 4, seed=1)
    return attention_error(estimate, s, query, scale=scale)


def _check_err(out, estimate, query, scale):
    err, value, zeros = out
    s = make_stream("clustered", 10, 4, seed=1)
    q = np.asarray(query, np.float64)
    x = s.K @ q / 2.0
    w = np.exp(x - x.max())
    exact = w @ s.V / w.sum()
    want = np.linalg.norm(np.asarray(estimate, np.float64) - exact)
    if np.isfinite(want) and not math.isclose(err, want, rel_tol=1e-9, abs_tol=1e-12):
        return f"error {err} != {want}"
    return None if math.isclose(zeros, np.linalg.norm(exact), rel_tol=1e-9, abs_tol=1e-300) else "zeros' error"


def _rel_arrays(rng, cls):
    m, dv = int(rng.integers(1, 5)), int(rng.integers(1, 4))
    return dict(est=make_array(rng, (m, dv), cls), exact=make_array(rng, (m, dv), cls))


def _check_rel(out, est, exact):
    if not np.all(np.isfinite(np.asarray(est, float))):
        return None if out == math.inf else f"{out} for a non-finite estimate (inf: undefined, the worst)"
    num = np.linalg.norm(np.asarray(est, float) - np.asarray(exact, float), axis=-1)
    den = np.linalg.norm(np.asarray(exact, float), axis=-1)
    if np.any((den == 0) & (num > 0)):
        return None if out == math.inf else f"{out} for an exact output of norm 0"
    ref = float(np.mean(np.divide(num, den, out=np.zeros_like(num), where=den > 0)))
    return None if math.isclose(out, ref, rel_tol=1e-9, abs_tol=1e-300) else f"{out} != {ref}"


def _cache_arrays(rng, cls):
    H, m, d = int(rng.integers(1, 3)), int(rng.integers(1, 6)), int(rng.integers(1, 4))
    return dict(keys=make_array(rng, (H, m, d), cls), values=make_array(rng, (H, m, d), cls))


def _canon_call(keys, values):
    z = np.zeros(np.shape(keys)[:-1])
    c = CompressedKV(keys, values, z, z.copy())
    return in_canonical_order(c).keys, in_canonical_order(c).values


def _check_canon(out, keys, values):
    k, v = out
    a, b = np.asarray(keys, float), np.asarray(values, float)
    for h in range(a.shape[0]):
        got = sorted(map(tuple, np.concatenate([k[h], v[h]], 1).tolist()))
        want = sorted(map(tuple, np.concatenate([a[h], b[h]], 1).tolist()))
        if got != want:
            return "not a permutation of the cache's tokens"
    return None


def _press_arrays(rng, cls):
    _knorm()             # kvpress imported here, outside the call's time limit (seconds on a first import)
    n, d = int(rng.integers(2, 10)), int(rng.integers(1, 5))
    return dict(K=make_array(rng, (1, n, d), cls), V=make_array(rng, (1, n, d), cls), Q=make_array(rng, (1, n, d), cls))


_KNORM = []


def _knorm():
    if not _KNORM:
        from kvpress import KnormPress
        _KNORM.append(press_compressor(lambda r: KnormPress(compression_ratio=r), name="KnormPress"))
    return _KNORM[0]


def _knorm_call(K, V, Q, floats, rng):
    return _knorm()(K, V, floats, rng, Q=Q)


def _check_knorm(out, K, V, Q, floats, rng):
    """KnormPress keeps the tokens of smallest key norm (its score is minus the norm), kept_tokens of them."""
    K, V = np.asarray(K, np.float64), np.asarray(V, np.float64)
    n, d = K.shape[-2], K.shape[-1]
    kept = kept_tokens(floats, d, d, n)
    if out.keys.shape[-2] != kept:
        return f"kept {out.keys.shape[-2]} tokens for {kept}"
    norms = np.linalg.norm(K[0], axis=-1)
    got = np.sort(np.linalg.norm(np.asarray(out.keys[0], np.float64), axis=-1))
    want = np.sort(norms)[:kept]
    return None if np.allclose(got, want, rtol=1e-5, atol=1e-30) else "not the smallest key norms"


def _check_kept(out, floats, d, dv, n):
    kept, ratio = out
    if not 1 <= kept <= n or kept > max(floats // (d + dv), 1):
        return f"kept {kept}"
    return None if int(n * (1 - ratio)) == kept else f"ratio {ratio} keeps {int(n * (1 - ratio))}, not {kept}"


ENTRIES = [_stream_entry(f) for f in FAMILIES if not f.startswith("real")] + [
    Entry("attention_error", _err_arrays, dict(scale="softmax_V_F"), _err_call, _check_err,
          nonfinite_ok=lambda out, **kw: not np.all(np.isfinite(np.asarray(kw["estimate"], float)))),
    Entry("relative_error", _rel_arrays, {}, lambda est, exact: relative_error(np.asarray(est), np.asarray(exact)),
          _check_rel, nonfinite_ok=lambda out, **kw: True, torch_ok=False),
    Entry("in_canonical_order", _cache_arrays, {}, _canon_call, _check_canon, torch_ok=False),
    Entry("unit_of", lambda r, c: {}, dict(family="concentrated", rep=3),      # a stream's unit of replication
          lambda family, rep: ES.unit_of(dict(family=family, rep=rep), make_stream(family, 12, 4, seed=rep)),
          lambda out, family, rep: None if out == f"draw {family} #{rep}" else f"unit {out!r}"),
    Entry("press_compressor[KnormPress]+run_press", _press_arrays, dict(floats=8, rng=RNG), _knorm_call, _check_knorm,
          torch_ok=False),
    Entry("kept_tokens+ratio_for", lambda r, c: {}, dict(floats=300, d=4, dv=4, n=64),
          lambda floats, d, dv, n: (kept_tokens(floats, d, dv, n), ratio_for(kept_tokens(floats, d, dv, n), n)),
          _check_kept),
    Entry("check_ratio", lambda r, c: {}, dict(ratio=0.5), check_ratio),
    Entry("resolve", lambda r, c: {}, dict(spec="kvpress:KnormPress", ratio=0.5),
          lambda spec, ratio: resolve(spec, ratio).kind),
    Entry("needs_inputs", lambda r, c: {}, dict(method="kvpress:knorm"), needs_inputs),
]

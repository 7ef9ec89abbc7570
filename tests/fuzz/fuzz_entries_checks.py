"""Fuzz entries of the checks' shared helpers: the trivial controls and the power rule (kvbounds.battery._power_rule),
the
power-stream families (proofs_checks.power_streams) and the decode-time measurements and records
(proofs_checks.decode_stream, proofs_checks.decode_verdict). Inputs that a check builds from arrays (errors,
certificates, metrics) come from the fuzzed arrays, so a NaN, an overflow or a wrong type reaches the helper."""
from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy as np

from fuzz_harness import RNG, Entry, make_array

from kvbounds.battery import _power_rule as ctl
from kvbounds.proofs_checks import decode_stream as ds
from kvbounds.proofs_checks import decode_verdict as dv
from kvbounds.streams import _power as ps
from kvbounds.core import Record


def _errors(rng, cls):
    return dict(errors=np.abs(make_array(rng, (int(rng.integers(1, 6)),), cls)))


def _worst_call(errors, name):
    w = ctl.WorstError()
    for e in _as_values(errors):
        w.add(name, e)
    return w.values(), [ctl.check_error(e, "error") for e in w.values().values()]


def _check_worst(out, errors, name):
    want = float(np.max(np.asarray(errors, np.float64))) if np.size(errors) else None
    got = out[0].get(name)
    return None if want is None or got == want else f"worst {got} != max {want}"


def _add_all_call(exact, est, scale):
    w = ctl.WorstError()
    w.add_all({"uniform": est}, exact, scale)
    return w.values()


def _check_add_all(out, exact, est, scale):
    want = float(np.linalg.norm(np.asarray(est, np.float64) - np.asarray(exact, np.float64))) / scale
    return None if math.isclose(out["uniform"], want, rel_tol=1e-6, abs_tol=1e-300) else f"{out} vs {want}"


def _power_arrays(rng, cls):
    n = int(rng.integers(8, 14))
    return dict(method=np.abs(make_array(rng, (n,), cls)), zeros=np.abs(make_array(rng, (n,), cls)),
                mean_values=np.abs(make_array(rng, (n,), cls)))


def _as_values(x):
    """The fuzzed array as the per-stream Python values a check stores (a list stays as it is, a scalar is one)."""
    if isinstance(x, np.ndarray):
        return x.ravel().tolist()
    return list(x.ravel().tolist()) if hasattr(x, "ravel") else list(x) if hasattr(x, "__iter__") else [x]


def _at(values, i):
    """The i-th stream's value, None (could not run) past the end of a shorter array."""
    return values[i] if i < len(values) else None


def _power_call(method, zeros, mean_values, alpha):
    """Records as a check stores them (the metric in extra["m"], read by ``value``), then the power rule, its table
    as cells and lines, and the report's first table and glance counts."""
    m, z, mv = _as_values(method), _as_values(zeros), _as_values(mean_values)
    recs = [Record("X.claim", dict(family="a" if i % 3 else "b", rep=i, sweep="power"), 0, "numpy", 0.0, 1.0, True,
                   bound_kind="shape", check=ps.POWER_CHECK, extra=dict(m=m[i], controls=dict(zeros=_at(z, i),
                                                                                                mean_values=_at(mv, i))))
            for i in range(len(m))]
    p = ctl.power_vs_controls(recs, setting=lambda r: r.params["family"], value=lambda r: r.extra["m"], alpha=alpha)
    from kvbounds.report._power import first_table, power_glance
    from kvbounds.verdict import headline_calls
    v = SimpleNamespace(power_table=p.table(), power_calls=p.calls)
    table = (first_table({"X.claim": v}), power_glance({"X.claim": v}))
    # the same values as a check stores both metrics: the measurement (theorem's) and extra["practitioner"]
    both = [dataclasses.replace(r, measured=r.extra["m"] if isinstance(r.extra["m"], (int, float)) else 0.0,
                                extra=dict(r.extra, unit=f"draw {i // 2}", practitioner=dict(
                                    method=r.extra["m"], controls=r.extra["controls"])))
            for i, r in enumerate(recs)]
    b = ctl.power_on_both_metrics(both, setting=lambda r: r.params["family"], metric="m", alpha=alpha)
    views = [ctl.practitioner_view(r) for r in both]
    return (p.power, p.detail, ctl.power_table_cells(p.table(), alpha), ctl.power_table_lines(p.table()), str(table),
            b.power, len(headline_calls(b.calls)), [ctl.stream_unit(r) for r in both], ctl.unit_words("real x"),
            len(views))


def _check_power(out, method, zeros, mean_values, alpha):
    nan = any(np.isnan(np.asarray(x, dtype=np.float64)).any() for x in (method, zeros, mean_values)
              if np.asarray(x).dtype.kind in "f")
    if nan and "undefined (NaN)" not in out[1]:
        return "a NaN metric left out without saying so"
    return None if out[0] in ("shown", "low", "n/a") else f"power {out[0]!r}"


def _check_stream(out, n, d, scale, clusters, rng):
    Q, K, r = out
    lg = K @ Q.T * scale
    if not np.allclose(lg.max(axis=0), ps.GAP, rtol=1e-6):
        return f"the heavy logit is not GAP: {lg.max(axis=0)[:4]}"
    return None


def _stream_call(family, n, d, seed, values, dv_):
    s = ps.stream(dict(family=family, n=n, d=d), seed, scale_of_d=lambda d: 1 / math.sqrt(d), values=values,
                  dv=dv_, held_out=4)                     # a PowerStream: the context and the held-out queries
    return s.Q, s.K, s.V, s.r, s.later, s.unit, ps.window_for(n + 4)


def _held_out_arrays(rng, cls):
    n, d, dv = int(rng.integers(2, 12)), int(rng.integers(1, 5)), int(rng.integers(1, 4))
    return dict(K=make_array(rng, (n, d), cls), V=make_array(rng, (n, dv), cls),
                later=make_array(rng, (int(rng.integers(1, 5)), d), cls))


def _held_out_call(K, V, later, floats, kind, scale):
    """held_out_errors with the uniform control's own cache as the method (its estimate in each representation)."""
    from kvbounds.battery import _controls as battery
    K, V = np.asarray(K), np.asarray(V)
    c = battery.uniform(K, V, floats, np.random.default_rng(0))
    est = {"attention": lambda qs: battery.attention(c, qs, scale), "numerator": lambda qs: battery.numerator(c, qs, scale),
           "partition": lambda qs: battery.log_partition(c, qs, scale)}.get(kind, lambda qs: None)
    return ps.held_out_errors(kind, est, K, V, later, floats, np.random.default_rng(1), scale=scale)


def _check_held_out(out, K, V, later, floats, kind, scale):
    values = [out["method"], *out["controls"].values()]
    if any(math.isnan(v) or v < 0 for v in values):
        return f"a NaN or negative error: {out}"
    return None if set(out["controls"]) == {"zeros", "mean", "streaming_llm", "uniform"} else f"{out['controls']}"


def _power_record_call(controls, measured, claim):
    c = {f"c{i}": v for i, v in enumerate(_as_values(controls))}
    return ps.power_record(claim, {}, "src", measured, c), ps.missing_record(claim, {}, "src", "a reason")


def _record_nonfinite_ok(out, **kw):
    """A missing record (NaN measurement, the reason in extra["missing"]) and a power record with no control (NaN
    bound, said in extra["no_control"]) are the documented NaNs."""
    rec, missing = out
    return bool(math.isnan(missing.measured) and missing.extra["missing"] and not math.isnan(rec.measured)
                and (not math.isnan(rec.bound) or "no_control" in rec.extra))   # inf: every control undefined


def _units_arrays(rng, cls):
    k = int(rng.integers(1, 6))
    return dict(err=np.abs(make_array(rng, (k,), cls)), unit=np.abs(make_array(rng, (k,), cls)))


def _units_call(err, unit, units):
    e, u = _as_values(err), _as_values(unit)
    return [ds.head_eps(dict(err=a, units={units: b}), units) for a, b in zip(e, u)] + \
        [ds.in_units(a, b) for a, b in zip(e, u)]


def _check_units(out, err, unit, units):
    e, u = np.asarray(err, np.float64).ravel(), np.asarray(unit, np.float64).ravel()
    want = [0.0 if a == 0 else math.inf if b == 0 else a / b for a, b in zip(e, u)]
    return None if list(out[:len(want)]) == want else f"{out[:len(want)]} vs {want}"


def _cert_arrays(rng, cls):
    k = int(rng.integers(1, 6))
    return dict(err=np.abs(make_array(rng, (k,), cls)), cert=np.abs(make_array(rng, (k,), cls)),
                vmax=np.abs(make_array(rng, (k,), cls)))


def _cert_call(err, cert, vmax):
    e, c, v = _as_values(err), _as_values(cert), _as_values(vmax)
    return ds.certificate_stats([dict(heads=[dict(err=a, cert=b, vmax=_at(v, i)) for i, (a, b) in
                                             enumerate(zip(e, c))])])


def _cert_nonfinite_ok(out, err, cert, vmax):
    """The looseness is NaN when no head with a defined (non-NaN) certificate has a positive error (nothing to
    divide), inf with an infinite certificate."""
    defined = [(float(a), float(b)) for a, b in zip(_as_values(err), _as_values(cert))
               if not (math.isnan(float(a)) or math.isnan(float(b)))]
    return math.isnan(out["looseness"]) and not any(a > 0 for a, _ in defined) or math.isinf(out["looseness"])


def _decode_arrays(rng, cls):
    H = int(rng.integers(1, 4))
    return dict(err=np.abs(make_array(rng, (H,), cls)), unit=np.abs(make_array(rng, (H,), cls)) + 1e-3,
                cert=np.abs(make_array(rng, (H,), cls)), controls=np.abs(make_array(rng, (H, 2), cls)))


def _decode_call(err, unit, cert, controls, units, log_scale):
    e, u, c = _as_values(err), _as_values(unit), _as_values(cert)
    cl = np.asarray(controls).reshape(len(e), -1).tolist() if isinstance(controls, np.ndarray) and \
        np.asarray(controls).size == 2 * len(e) else [[controls, controls]] * len(e)
    heads = [dict(err=e[h], units={units: _at(u, h)}, cert=_at(c, h), r=1.0, kmax=1.0, vmax=1.0, qnorm=1.0,
                  controls=dict(zeros=cl[h][0], mean_values=cl[h][-1])) for h in range(len(e))]
    rows = [dict(n=n, layer=layer, stored=16, d=4, kv_heads=1, heads=heads) for n in (64, 96) for layer in (0, 1)]
    import copy
    rows = ds.merge_ablation(rows, copy.deepcopy(rows), units)      # the ablation run's rows: here the same errors
    for row in rows:                      # each head's ||Attn||: the practitioner's metric (extra_layer_base)
        for h in row["heads"]:
            h["exact_norm"] = 1.0
    recs = dv.build_records("BKV.decode", "src", ds.trial_params("smoke"), rows, units, lambda row, h: log_scale,
                            unit="generation 0")
    v = dv.summarize("BKV.decode", recs, scale_text="s", certificate_kind="c")
    return [(r.measured, r.bound) for r in recs], v.summary, dv.decode_rows(recs), \
        [dv.generation_unit(r) for r in recs], [dv.extra_layer_base(dict(rel=[0.1], rel_ctl={"zeros": [1.0]}))]


def _decode_nonfinite_ok(out, **kw):
    """Documented non-finite values: an error of +inf (a positive error at a zero unit) and the leaderboard's
    interval of a method whose cells are all inf or all equal (n/a)."""
    pairs, _, board, *_ = out
    return all(not math.isnan(m) for m, _ in pairs) and all(
        not math.isnan(b) or math.isinf(m) for m, b in pairs)


ENTRIES = [
    Entry("WorstError.add+check_error", _errors, dict(name="zeros"), _worst_call, _check_worst, torch_ok=False,
          nonfinite_ok=lambda out, **kw: not any(math.isnan(v) for v in out[0].values())),
    Entry("WorstError.add_all", lambda r, c: dict(exact=make_array(r, (3,), c), est=make_array(r, (3,), c)),
          dict(scale=1.0), _add_all_call, _check_add_all, torch_ok=False,
          nonfinite_ok=lambda out, **kw: not any(math.isnan(v) for v in out.values())),     # inf: undefined
    Entry("power_vs_controls+power_table_cells+power_table_lines+first_table+power_glance", _power_arrays,
          dict(alpha=0.05), _power_call, _check_power, torch_ok=False),
    Entry("not_applicable", lambda r, c: {}, dict(reason="an exact identity"), ctl.not_applicable),
    Entry("concentrated_stream", lambda r, c: {}, dict(n=40, d=6, scale=0.4, clusters=4, rng=RNG),
          ps.concentrated_stream, _check_stream),
    Entry("stream[concentrated]", lambda r, c: {}, dict(family="concentrated", n=40, d=6, seed=0, values="gaussian",
                                                        dv_=None), _stream_call),
    Entry("stream[synthetic benign]", lambda r, c: {}, dict(family="synthetic benign", n=30, d=4, seed=1,
                                                            values="spread", dv_=3), _stream_call),
    Entry("held_out_errors", _held_out_arrays, dict(floats=12, kind="attention", scale=0.5), _held_out_call,
          _check_held_out, torch_ok=False,
          nonfinite_ok=lambda out, **kw: not any(math.isnan(v) for v in [out["method"], *out["controls"].values()])),
    Entry("power_trials+real_params", lambda r, c: {}, dict(profile="smoke", family="real MiniLM"),
          lambda profile, family: (ps.power_trials(profile, {"n": 64}), ps.real_params(family, profile))),
    Entry("power_record+missing_record", _errors, dict(measured=0.5, claim="X.claim"),
          lambda errors, measured, claim: _power_record_call(errors, measured, claim),
          nonfinite_ok=_record_nonfinite_ok, torch_ok=False),
    Entry("trial_params+trials", lambda r, c: {}, dict(profile="smoke"),
          lambda profile: (ds.trial_params(profile), ds.trials(profile))),
    Entry("head_eps+in_units", _units_arrays, dict(units="F"), _units_call, _check_units, torch_ok=False,
          nonfinite_ok=lambda out, **kw: not any(math.isnan(x) for x in out)),
    Entry("certificate_stats+check_rows", _cert_arrays, {}, _cert_call, torch_ok=False,
          nonfinite_ok=_cert_nonfinite_ok),
    Entry("build_records+summarize+decode_rows+merge_ablation", _decode_arrays, dict(units="F", log_scale=0.5), _decode_call,
          torch_ok=False, nonfinite_ok=_decode_nonfinite_ok),
]

"""Records and verdicts of the decode-time claims BKV.decode and SG.decode, from the measurements of
:mod:`proofs_checks.decode_stream`.

Per (checkpoint n, layer) a ``shape`` record: measured = the worst head's error in the theorem's units, bound = the
theorem's error scale at the press's memory (a shape: the O~ hides constants and polylogs, so the verdict is
``holds-fitted`` with the fitted constant max measured/shape, labelled fitted); its extras keep the a-priori scale's
logarithm, the press's live certificate beside the measured error (``certificate``: a separate field, never the
bound) and each trivial estimator's error in the same units. Per layer a power record: the theorem's metric (the
worst checkpoint of the method and of each control of the battery) and the practitioner's (the mean relative attention
error of the generated tokens' queries, ``extra["practitioner"]``), each called by the one rule
(:func:`kvbounds.battery.power_on_both_metrics`) at the unit of replication, a generation from a distinct prompt:
the layers of one generation share the prompt and the generated text, so they are one unit (their median).
"""
from __future__ import annotations

import math

import numpy as np

from kvbounds.battery import power_on_both_metrics
from kvbounds.verdict import growth
from kvbounds.verdict import FigureSpec, Finding, decide, decide_rate, decide_vacuity, fitted_constant
from kvbounds.verdict import not_every_norm

from .common import make_record
from kvbounds.algorithms.validation import InputError, check_choice

from .decode_stream import FAMILIES, FAMILY, certificate_stats, check_rows, head_eps, in_units
from kvbounds.streams import POWER_CHECK, battery_record, missing_record, power_record

SHAPE = "decode error vs the theorem's scale"
LOG_CAP = 700.0          # e^700 ~ 1e304: larger scales are stored as inf (log kept in extra["log_scale"])


def build_records(claim: str, source: str, params: dict, rows, units: str, log_scale, *, norm=None, norm_free=None,
                  **extra) -> list:
    """``log_scale(row, worst_head)`` -> log of the theorem's error scale for that (checkpoint, layer); ``norm(head)``
    -> the norm the theorem bounds by r (default the head's ``r``, the largest key or query norm), kept as the
    record's ``r``; ``norm_free(row)`` -> the part of the scale no norm lowers, kept as ``extra["norm_free"]``
    (:mod:`kvbounds.verdict._vacuity`: what makes a bound vacuous at any norm). A generation
    with no checkpoint measured (too short for the press to compress) gives one record that says so
    (``extra["missing"]``, reported as not run). Errors in units: :func:`decode_stream.in_units` (a NaN error, unit
    or log-scale is an InputError naming it, never a silent maximum)."""
    check_choice(units, "units", ("F", "op"))
    if not isinstance(claim, str) or not isinstance(source, str) or not isinstance(params, dict):
        raise InputError("claim and source must be strings and params a dict")
    rows = check_rows(rows, units)
    for i, row in enumerate(rows):
        if not all(k in row for k in ("n", "layer", "stored")) or not all(
                isinstance(h.get("controls"), dict) and h["controls"].keys() == rows[i]["heads"][0]["controls"].keys()
                and "r" in h for h in row["heads"]):
            raise InputError(f"rows[{i}] must have n, layer, stored and heads with r and the same controls")
    if rows and not callable(log_scale):
        raise InputError("log_scale must be a function (row, worst head) -> log of the theorem's scale")
    if not rows:
        fam = FAMILIES.get(params.get("model"), FAMILY)
        return [missing_record(claim, dict(params, family=fam, sweep="power"), source,
                               "no checkpoint measured: the generation ended before the press compressed (prompt "
                               f"{params.get('prompt')} + {params.get('new')} new tokens, target {params.get('target')})",
                               **extra)]
    norm = norm or (lambda h: h["r"])
    unit_extra = {"unit": extra.pop("unit")} if "unit" in extra else {}
    out, per_layer = [], {}
    for row in rows:
        hs = row["heads"]
        eps = [head_eps(h, units) for h in hs]
        worst = hs[int(np.argmax(eps))]
        ls = log_scale(row, worst)
        if isinstance(ls, (bool, np.bool_)) or not isinstance(ls, (int, float, np.integer, np.floating)) or math.isnan(ls):
            raise InputError(f"the log of the theorem's scale must be a real number (not NaN) at n = {row['n']}, "
                             f"layer {row['layer']}, got {ls!r}")
        ls = float(ls)
        ctl = {name: max(in_units(h["controls"][name], h["units"][units], f"the error of control {name!r}")
                         for h in hs) for name in hs[0]["controls"]}
        cs = certificate_stats([row])
        out.append(make_record(
            claim, dict(params, n=row["n"], layer=row["layer"], sweep="n"), measured=max(eps),
            bound=math.exp(ls) if ls < LOG_CAP else math.inf, holds=True, bound_kind="shape", check=SHAPE,
            source=source, log_scale=ls, stored=row["stored"], head_dim=row.get("d"), kv_heads=row.get("kv_heads"), r=max(norm(h) for h in hs), controls_eps=ctl,
            certificate=[h["cert"] for h in hs], error=[h["err"] for h in hs], vmax=max(h["vmax"] for h in hs),
            cert_covered=cs["covered"], cert_heads=cs["heads"], cert_vacuous=cs["vacuous"],
            estimate=[h.get("estimate", math.nan) for h in hs],
            est_covered=sum(h["err"] <= h.get("estimate", math.nan) * (1 + 1e-6) for h in hs),
            cert_undefined=cs["undefined"], **({"norm_free": norm_free(row)} if norm_free else {}), **extra))
        best = per_layer.setdefault(row["layer"], dict(eps=0.0, ctl={}, stored=row["stored"], n=-1, rel=[],
                                                        rel_ctl={}))
        best["eps"] = max(best["eps"], max(eps))
        for k, v in ctl.items():
            best["ctl"][k] = max(best["ctl"].get(k, 0.0), v)
        for h in hs:              # the practitioner's metric: each generated token's query, relative to ||Attn||
            if "exact_norm" in h:
                best["rel"].append(_relative(h["err"], h["exact_norm"]))
                for k, v in h["controls"].items():
                    best["rel_ctl"].setdefault(k, []).append(_relative(v, h["exact_norm"]))
        if row["n"] > best["n"]:          # the memory of the last checkpoint (the press's floats against the history's)
            best.update(n=row["n"], stored=row["stored"], floats=row.get("floats"), stream=row.get("stream_floats"),
                        controls_floats=row.get("controls_floats", {}))
    for layer, b in sorted(per_layer.items()):
        p = dict(params, layer=layer, family=FAMILIES.get(params.get("model"), FAMILY), sweep="power")
        if b["rel"]:
            extra_layer = dict(extra_layer_base(b))
        else:
            extra_layer = {}
        if b.get("floats") is not None and b.get("stream"):
            out.append(battery_record(claim, p, source, b["eps"], b["ctl"], method_floats=b["floats"],
                                      stream_floats=b["stream"], controls_floats=b["controls_floats"],
                                      stored=b["stored"], **extra_layer, **unit_extra))
        else:
            out.append(power_record(claim, p, source, b["eps"], b["ctl"], stored=b["stored"], **extra_layer,
                                    **unit_extra))
    return out


def _relative(err: float, norm: float) -> float:
    """||est - exact|| / ||exact||: 0 for an exact zero output, inf for an error against a zero output."""
    return err / norm if norm > 0 else (0.0 if err == 0 else math.inf)


def extra_layer_base(b: dict) -> dict:
    """A layer's practitioner's metric (``extra["practitioner"]``): the mean over its checkpoints and heads of the
    relative attention error of the generated token's query against the compressed history, the method's and each
    control's (the queries that follow the compressed context, as a user of the cache sees them)."""
    return dict(practitioner=dict(metric="mean relative attention error of the generated tokens' queries",
                                  kind="attention", queries=len(b["rel"]), method=float(np.mean(b["rel"])),
                                  controls={k: float(np.mean(v)) for k, v in sorted(b["rel_ctl"].items())}))


def generation_unit(r) -> str:
    """A decode power record's unit: its generation (``extra["unit"]``; older records: the trial's seed)."""
    return r.extra.get("unit") or f"generation (seed {r.seed})"


def _model_name(records) -> str:
    models = sorted({str(r.params.get("model", "smollm2")) for r in records})
    return ", ".join({"smollm2": "SmolLM2", "tiny": "a tiny random Llama (smoke)"}.get(m, m) for m in models)


def summarize(claim: str, records, *, scale_text: str, certificate_kind: str):
    n_all = len(records)
    pw = [r for r in records if r.check == POWER_CHECK]
    # the unit: a generation from a distinct prompt (its layers are one unit, their median); quick has one
    trivial = power_on_both_metrics(pw, setting=lambda r: r.params["family"], metric="eps_hat",
                                    unit="generations from distinct prompts", unit_of=generation_unit)
    rs = [r for r in records if r.check == SHAPE]
    parts, findings = [], []
    if rs:
        eps = np.array([r.measured for r in rs])
        parts.append(f"eps_hat (worst head per layer and checkpoint) median {np.median(eps):.3g}, max {eps.max():.3g} "
                     f"over {len(rs)} (checkpoint, layer) cells, n = {min(r.params['n'] for r in rs)}.."
                     f"{max(r.params['n'] for r in rs)} at {max(r.extra['stored'] for r in rs)} tokens held")
        logs = np.array([r.extra["log_scale"] for r in rs])
        parts.append(f"the theorem's scale ({scale_text}) is e^{np.median(logs):.0f} (median; e^{logs.min():.0f}.."
                     f"e^{logs.max():.0f}) on the keys of {_model_name(rs)}")
        vac = decide_vacuity(rs)
        if vac is not None and vac.any_norm:
            findings.append(Finding(claim, "the a-priori scale is vacuous at any norm",
                                    f"{vac.any_norm}: doing nothing (zeros) meets the bound on every input of these "
                                    f"sizes, whatever the keys, queries and values (here in {vac.zeros_meets}/"
                                    f"{vac.cells} cells; median log of the scale {np.median(logs):.0f}), so no fitted "
                                    "constant or rate of it is a result; the controls and the certificate are what "
                                    "tell the method apart", {}, kind="finding"))
        elif vac is not None:
            findings.append(Finding(claim, "the a-priori scale is vacuous on a real model's keys",
                                    f"median log of the scale {np.median(logs):.0f} (the norm bound r up to "
                                    f"{max(r.extra['r'] for r in rs):.3g}): doing nothing (zeros) meets it in "
                                    f"{vac.zeros_meets}/{vac.cells} cells, so the statement is vacuous here and no "
                                    "fitted constant of it is a result; the controls and the certificate are what "
                                    f"tell the method apart{not_every_norm(rs)}", {}, kind="finding"))
        heads = sum(r.extra["cert_heads"] for r in rs)
        cov = sum(r.extra["cert_covered"] for r in rs)
        vac = sum(r.extra["cert_vacuous"] for r in rs)
        # a NaN certificate or error (counted in cert_undefined) stays out of the median, said below
        loose = [c / e for r in rs for c, e in zip(r.extra["certificate"], r.extra["error"])
                 if e > 0 and not (math.isnan(c) or math.isnan(e))]
        med = f"{np.median(loose):.3g}" if loose else "n/a"
        undef = sum(r.extra.get("cert_undefined", 0) for r in rs)
        parts.append(f"live certificate ({certificate_kind}): covers the measured error in {cov}/{heads} "
                     f"(checkpoint, layer, head) cells, median certificate/error {med}, vacuous "
                     f"(no smaller than ||o_hat|| + max||v||, the bar the values alone give) in {vac}/{heads}"
                     + (f"; undefined (NaN) in {undef}/{heads}, left out" if undef else ""))
        est = [(e, x) for r in rs for e, x in zip(r.extra.get("error", []), r.extra.get("estimate", []))
               if e > 0 and math.isfinite(x)]
        if est and certificate_kind.startswith("a bound"):
            parts.append(f"the press's error-bar estimate (3 standard errors from its kept tokens; not a bound): "
                         f"covers {sum(e <= x * (1 + 1e-6) for e, x in est)}/{len(est)} cells, median "
                         f"estimate/error {np.median([x / e for e, x in est]):.3g}")
        if vac == heads:
            findings.append(Finding(claim, "the live certificate is vacuous on a real model",
                                    f"in all {heads} cells the certificate is no smaller than ||o_hat|| + max||v|| (the "
                                    f"bar the values alone give; median certificate/error {med}): it holds but says "
                                    f"nothing here", {}, kind="finding"))
        if cov < heads:
            findings.append(Finding(claim, "the live certificate misses the measured error in some cells",
                                    f"{heads - cov}/{heads} cells ({certificate_kind})", {}, kind="finding"))
    finite = [r for r in rs if math.isfinite(r.bound) and r.bound > 0]
    if len(finite) < len(rs):
        parts.append(f"{len(rs) - len(finite)}/{len(rs)} cells have a scale beyond e^{LOG_CAP:.0f} (stored as inf, "
                     "left out of the fitted constant and the growth)")
    gs = growth(finite, "n") if finite else []
    g = gs[0] if gs else None
    vac = decide_vacuity(rs)
    if g is not None:
        parts.append(g.text() + (" (no rate verdict: the scale is vacuous, so its growth says nothing of the "
                                 "statement)" if vac is not None else
                                 " (the scale grows with the largest key norm seen, so the ratio may fall steeply)"))
    rate = (decide_rate(g, stated_exponent=0.0, label="error / scale not growing in n at fixed memory")
            if g and vac is None else ("n/a", None))
    fitted = fitted_constant(finite,
                             f"max eps_hat / ({scale_text}) (fitted; the O~'s constant and polylogs)")
    if fitted is not None and vac is not None:
        zc = f", zeros' {vac.zeros_constant:.3g}" if vac.zeros_constant is not None else ""
        parts.append(f"max error / scale {fitted.value:.3g}{zc}: not a fitted constant to report, the scale is "
                     f"vacuous (zeros meets it in {vac.zeros_meets}/{vac.cells} cells)")
    elif fitted is not None:
        parts.append(f"fitted constant C = {fitted.value:.3g} (labelled fitted)")
    for c in trivial.cells:
        if c.best:
            parts.append(f"error / best trivial control ({c.best}) {c.ratio:.3g} on the {c.metric or 'theorem'}'s "
                         f"metric over {c.units} generation(s) ({c.streams} layers; the layers of one generation are "
                         "one unit)")
    parts.append(trivial.detail)
    figs = [FigureSpec("eps_hat vs n while SmolLM2 generates (the theorem's scale: in the legend)", x="n", check=SHAPE,
                       hue="layer", y="measured", show_bound=False, sweep="n")]
    measured = [r for r in records if not r.extra.get("missing")]     # a generation too short: not run
    v = decide(claim, measured, summary="; ".join(parts), figures=figs, findings=findings, rate=rate, fitted=fitted,
               trivial=trivial)
    v.n_records = n_all
    return v


# ------------------------------------------------------------------ leaderboard rows (issue 23)
CONTROL_NAMES = {"zeros": "control: zeros", "mean": "control: mean of values",
                 "streaming_llm": "control: StreamingLLM (the press's sink and the most recent tokens)",
                 "uniform": "control: uniform sample (the press's sink and window exact)",
                 "ablation": "control: the press's ablation"}
PRESS_NAMES = {"BKV.decode": "streaming BalanceKV", "SG.decode": "streaming SubGen"}
UNITS = {"BKV.decode": "||softmax|| ||V||_F", "SG.decode": "||softmax|| ||V||_op"}


# KV heads x head dim of the models the records predate these fields for (SmolLM2-135M: 3 KV heads of 64)
_KV_SHAPE = {"smollm2": (3, 64)}


def _floats_per_layer_token(record) -> int:
    """KV heads x head dim of one layer: the floats of one token's key (or value) in one layer."""
    h, d = record.extra.get("kv_heads"), record.extra.get("head_dim")
    if h is None or d is None:
        h, d = _KV_SHAPE.get(str(record.params.get("model")), (1, 1))
    return int(h) * int(d)


def decode_rows(records) -> list[dict]:
    """Leaderboard rows of the decode-time claims: per claim one table on the practitioner's metric (the mean relative
    attention error of the generated tokens' queries against the compressed history, lower is better), the streaming
    press against each trivial estimator at the memory the press held; one value per unit, a generation from a
    distinct prompt (the mean over its layers), the row's value their mean with a t interval over the generations
    (``units``: generation -> value, for the one rule's paired calls)."""
    from kvbounds.e2e import row as _row, t_interval as _t_interval, tied as _tied
    out = []
    for claim, press in PRESS_NAMES.items():
        pw = [r for r in records if r.claim == claim and r.check == POWER_CHECK
              and isinstance(r.extra.get("practitioner"), dict)]
        rs = [r for r in records if r.claim == claim and r.check == SHAPE]
        if not pw or not rs:
            continue
        budget = float(np.median([r.extra["stored"] / r.params["n"] for r in rs]))
        stored = int(np.median([r.extra["stored"] for r in rs]))
        floats = stored * 2 * len({r.params["layer"] for r in rs}) * _floats_per_layer_token(rs[0])
        metric = f"decode: relative attention error of the generated tokens' queries, {_model_name(rs)} generating"
        by_unit = lambda f: {u: float(np.mean(v)) for u, v in _grouped(pw, f).items()}
        series = {press: by_unit(lambda r: r.extra["practitioner"]["method"])}
        for c, name in CONTROL_NAMES.items():
            got = by_unit(lambda r, c=c: r.extra["practitioner"]["controls"].get(c))
            if got:
                series[name] = got
        rows = []
        for method, units in series.items():
            x = np.array(list(units.values()))
            row = _row(method, claim, budget, floats, metric, float(x.mean()), _t_interval(x), len(x),
                       note=f"{stored} tokens per layer held (median), {len(x)} generation(s) from distinct prompts "
                            f"(the unit; {len(pw)} layer records)", units=units)
            row["family"] = "ours" if method == press else "baselines"
            rows.append(row)
        rows.sort(key=lambda r: (r["value"], r["method"]))            # lower error is better
        _tied(rows)
        out += rows
    return out


def _grouped(records, value) -> dict:
    """{generation: [value of each of its layer records]} (None values left out)."""
    out: dict = {}
    for r in records:
        v = value(r)
        if v is not None and not math.isnan(float(v)):
            out.setdefault(generation_unit(r), []).append(float(v))
    return out

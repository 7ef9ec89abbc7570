"""SG.clusterability: keys are more clusterable than values; RoPE models' keys more than absolute-position
models' (002 Sec. 3.1, Fig. 1; 003 Sec. 3.1, Table 1, Fig. 1). Empirical.

The measure (:func:`kvbounds.algorithms.kcenter.clusterability`, usable on any (n, d) array, real traces included):
the greedy k-center covering radius r(j) for j = 1..16, summarised by r(16) / r(1), and the number of
delta-clusters m'(n) SubGen's clustering opens (delta = r(1) / 4) along the stream, summarised by the log-log
slope of m' in n. Decision rules, fixed before any run:
  * ``radius keys vs values``  keys are more clusterable when r_K(16)/r_K(1) <= 0.9 r_V(16)/r_V(1);
  * ``cluster growth keys``    the key stream is sublinearly clusterable when the slope of m'(n) is <= 0.5.

On synthetic traces these rules only validate the measure: ``clustered`` keys (make_trace "clustered")
must pass, and isotropic keys (the ``gaussian`` trace, negative controls) must fail both. The claim is about
LLM caches, so without real-trace records (params ``source="real"``, produced by :func:`real_trace_records`
from the real-traces issue) the verdict is inconclusive.
"""
from __future__ import annotations

import numpy as np

from kvbounds.algorithms.kcenter import clusterability
from kvbounds.verdict import FAILS, INCONCLUSIVE, FigureSpec, Finding, Verdict, controls_rejected, \
    standard_verdict
from kvbounds.traces.real import available, trace_from_spec
from kvbounds.traces.synthetic import make_trace

from .common import make_record, pick

CLAIM = "SG.clusterability"
SOURCE = "003 Sec. 3.1, Fig. 1, Table 1; 002 Sec. 3.1, Fig. 1"
RADIUS_MARGIN = 0.9
SLOPE_MAX = 0.5
K_CENTERS = 16
POSITIONAL = {"smollm2": "rope", "minilm": "absolute"}
REAL_LAYERS = {"smollm2": (0, 5, 15, 29), "minilm": (0, 3, 5)}
REAL_HEADS = {"smollm2": (0, 3), "minilm": (0, 1)}   # SmolLM2 query heads 0-2 share KV head 0 (GQA): 0 and 3 differ


def measure_records(K: np.ndarray, V: np.ndarray, params: dict, *, control: bool = False) -> list:
    """The two records of the decision rules for one key stream K and value stream V (numpy (n, d))."""
    mk, mv = clusterability(K, k=K_CENTERS), clusterability(V, k=K_CENTERS)
    ratio = mk["normalized_radius"] / mv["normalized_radius"] if mv["normalized_radius"] > 0 else np.inf
    extra = dict(keys=mk, values=mv)
    return [make_record(CLAIM, params, measured=ratio, bound=RADIUS_MARGIN, check="radius keys vs values",
                        bound_kind="fitted", control=control, source=SOURCE,
                        key_radius=mk["normalized_radius"], value_radius=mv["normalized_radius"], **extra),
            make_record(CLAIM, params, measured=mk["count_slope"], bound=SLOPE_MAX, check="cluster growth keys",
                        bound_kind="fitted", control=control, source="002 Thm 1 / Cor. 1 (m = n^(1-Omega(1)))",
                        key_counts=mk["cluster_counts"], value_counts=mv["cluster_counts"],
                        checkpoints=mk["checkpoints"])]


def real_trace_records(K: np.ndarray, V: np.ndarray, *, model: str, layer: int, head: int,
                       positional: str) -> list:
    """Records for a real (model, layer, head) cache: positional is "rope", "alibi" or "absolute"."""
    params = dict(source="real", model=model, layer=int(layer), head=int(head), positional=positional,
                  n=int(K.shape[0]), d=int(K.shape[1]))
    return measure_records(np.asarray(K, float), np.asarray(V, float), params)


def trials(profile: str) -> list[dict]:
    n = pick(profile, smoke=256, quick=2048, full=8192)
    seeds = pick(profile, smoke=(0,), quick=(0, 1, 2), full=(0, 1, 2, 3, 4, 5))
    out = [dict(source="synthetic", trace="clustered", n=n, d=32, m=16, spread=0.05, rep=i) for i in seeds]
    out += [dict(source="synthetic", trace="gaussian", n=n, d=32, rep=i) for i in seeds]
    if profile != "smoke":   # real caches (the claim's subject): a few layers and two KV heads of each model
        n_real = pick(profile, smoke=0, quick=512, full=2048)
        out += [dict(source="real", spec=f"{m}:L{layer}:H{h}:{n_real}", model=m, layer=layer, head=h,
                     positional=POSITIONAL[m], n=n_real)
                for m, layers in REAL_LAYERS.items() for layer in layers for h in REAL_HEADS[m]]
    return out


def run_trial(params: dict, seed: int, backend: str):
    if params["source"] == "real":
        why = available(params["model"])
        if why:   # no model package here: say so, and contribute no evidence
            return [make_record(CLAIM, params, measured=float("nan"), bound=RADIUS_MARGIN, holds=True,
                                check="real trace unavailable", bound_kind="fitted", source=SOURCE, unavailable=why)]
        tr = trace_from_spec(params["spec"])
        return measure_records(tr.K, tr.V, params)
    kw = dict(m=params["m"], spread=params["spread"]) if params["trace"] == "clustered" else {}
    tr = make_trace(params["trace"], n=params["n"], d=params["d"], seed=seed, **kw)
    return measure_records(tr.K, tr.V, params, control=params["trace"] == "gaussian")


def summarize(records) -> Verdict:
    figs = [FigureSpec("r_K(16)/r_K(1) over r_V(16)/r_V(1) (keys more clusterable below 0.9)", x="n", hue="trace",
                       check="radius keys vs values", logy=False),
            FigureSpec("slope of delta-clusters m'(n) in n (sublinear below 0.5)", x="n", hue="trace",
                       check="cluster growth keys", logy=False)]
    if not records:
        return Verdict(CLAIM, "not run", "no records", figures=figs)
    synth = [r for r in records if r.params.get("source") != "real"]
    real = [r for r in records if r.params.get("source") == "real" and "unavailable" not in r.extra]
    missing = sorted({r.params["model"] for r in records if "unavailable" in r.extra})
    parts = [f"real traces unavailable for {', '.join(missing)} (model package missing): SYNTHETIC ONLY for them"] \
        if missing else []
    rej, n_ctl = controls_rejected(synth)
    ok = [r for r in synth if not r.control]
    if synth:
        kr = [r.extra["key_radius"] for r in ok if r.check == "radius keys vs values"]
        vr = [r.extra["value_radius"] for r in ok if r.check == "radius keys vs values"]
        sl = [r.measured for r in ok if r.check == "cluster growth keys"]
        cr = [r.measured for r in synth if r.control and r.check == "radius keys vs values"]
        cs = [r.measured for r in synth if r.control and r.check == "cluster growth keys"]
        parts.append(f"synthetic: clustered keys r(16)/r(1) = {np.median(kr):.3g} vs values {np.median(vr):.3g}, "
                     f"m'(n) slope {np.median(sl):.2f}; isotropic controls: radius ratio {np.median(cr):.3g}, slope "
                     f"{np.median(cs):.2f}; rules pass on {sum(r.holds for r in ok)}/{len(ok)} clustered records, "
                     f"controls rejected {rej}/{n_ctl}")
    findings = []
    if real:
        v = standard_verdict(CLAIM, real, figures=figs)
        status = v.status
        findings = v.findings
        by = {}
        for r in real:
            if r.check == "radius keys vs values":
                by.setdefault(r.params["positional"], []).append(r.extra["key_radius"])
        parts.append(f"real traces: {v.summary}; median key r(16)/r(1) by positional encoding: "
                     + ", ".join(f"{k} {np.median(x):.3g}" for k, x in sorted(by.items())))
        if "rope" in by and any(k in by for k in ("absolute", "alibi")):
            other = [x for k in ("absolute", "alibi") for x in by.get(k, [])]
            if np.median(by["rope"]) > np.median(other):
                status = FAILS
                findings.append(Finding(CLAIM, "RoPE keys are not more clusterable than absolute-position keys",
                                        f"median r(16)/r(1): rope {np.median(by['rope']):.3g} vs others "
                                        f"{np.median(other):.3g}", {}))
    else:
        status = INCONCLUSIVE
        parts.append("the claim concerns LLM KV caches: no real-trace records yet (real_trace_records), so the "
                     "synthetic runs only validate the measure")
    if n_ctl and rej < n_ctl:
        status = INCONCLUSIVE
        findings.append(Finding(CLAIM, "the clusterability rules do not reject isotropic keys",
                                "the measure cannot tell clustered from isotropic streams", {}, kind="erratum"))
    if any(not r.holds for r in ok):
        findings.append(Finding(CLAIM, "the rules fail on synthetic clustered keys",
                                "the measure misjudges a stream built to be clustered",
                                min((r for r in ok if not r.holds), key=lambda r: r.params["n"]).params, kind="erratum"))
        status = INCONCLUSIVE if status != FAILS else status
    return Verdict(CLAIM, status, "; ".join(parts), findings=findings, figures=figs, n_records=len(records))

"""NORM.bounded: query/key/value norms concentrate around constants and do not grow with sequence length.

BalanceKV-NeurIPS Table 3 (and ClusterGen Table 1) report the mean and 95% CI of ||q||, ||k - mean(k)|| and ||v|| for prompts of
growing length; BalanceKV's bounds are stated for ||q||, ||k|| <= r, so r must not grow with n. Here, on real
traces (``kvbounds.traces.real``: SmolLM2 with RoPE, MiniLM with absolute positions), per layer, pooled over heads,
for the prefixes [0, n) of one extraction with n = 512 .. n_max (a causal model's prefix is exactly the
shorter run; MiniLM's 512-position segments are independent, so its prefixes of whole segments are too):
mean, the 95% confidence half-width of the mean (Table 3's column), and the central 95% interval
(2.5%..97.5% quantiles) of the norms (:func:`kvbounds.theory.empirical.norm_interval`) of
  * ``q``           queries (post-RoPE; RoPE is a rotation, so pre- and post-RoPE norms are equal),
  * ``k``           keys (post-RoPE),
  * ``k_centered``  keys minus their mean over the prefix (as BalanceKV-NeurIPS Table 3: attention is invariant to it),
  * ``v``           values.

Records (one per model, layer, kind, n; ``bound_kind="fitted"``): measured = the 97.5% quantile of the norms
at n; bound = that quantile at the smallest n times (n / n_min)^GROWTH_TOL, the no-growth envelope the
package's growth rule allows (:data:`kvbounds.verdict.GROWTH_TOL`); holds = measured <= bound. The verdict
also fits the log-log slope of the quantile and of the mean against n per series.
Negative control (``control``): the keys of the first layer scaled by sqrt(1 + i/256) (norms growing like
sqrt(position)) must break the envelope. Without the model package the trace is synthetic and the verdict says so.

Verdict (shared rules of kvbounds.verdict, kind "empirical"): one Reproduction per model; ``reproduced`` when
every (layer, kind) series stays inside the no-growth envelope, ``not-reproduced`` when some series grows.
The setup names the model, layers and lengths and how they differ from the paper's (BalanceKV-NeurIPS Table 3: an 8B model,
TriviaQA prompts of 2281..21274 tokens). A synthetic fallback reproduces nothing (``n/a``).
"""
from __future__ import annotations

import numpy as np

from kvbounds.battery import not_applicable
from kvbounds.verdict import (GROWTH_TOL, NOT_RUN, Control, FigureSpec, Finding, Reproduction, Verdict, decide,
                              finalize, fitted_constant, loglog_slope)
from kvbounds.theory.empirical import norm_interval
from kvbounds.traces.real import MODEL_INFO, layer_heads, parse_spec, real_or_synthetic_spec

from .common import fallback_notes, make_record, pick

__all__ = ["CLAIM", "SOURCE", "KINDS", "MODEL_NAMES", "PAPER_SETUP", "trials", "run_trial", "summarize"]

CLAIM = "NORM.bounded"
SOURCE = "BalanceKV-NeurIPS Table 3; ClusterGen Table 1"
KINDS = ("q", "k", "k_centered", "v")
MODEL_NAMES = {"smollm2": "SmolLM2-135M", "minilm": "all-MiniLM-L6-v2"}
PAPER_SETUP = "BalanceKV-NeurIPS Table 3: Llama-3.1-8B-Instruct-class model, TriviaQA prompts of 2281..21274 tokens"


def trials(profile: str) -> list[dict]:
    plans = pick(profile,
                 smoke=[("minilm", 512, [128, 256, 512], [0, 5])],
                 quick=[("smollm2", 2048, [512, 1024, 2048], [0, 4, 9, 14, 19, 24, 29]),
                        ("minilm", 2048, [512, 1024, 2048], list(range(6)))],
                 full=[("smollm2", 8192, [512, 1024, 2048, 4096, 8192], list(range(30))),
                       ("minilm", 8192, [512, 1024, 2048, 4096, 8192], list(range(6)))])
    out = []
    for model, n, lengths, layers in plans:
        for i, l in enumerate(layers):
            spec, why = real_or_synthetic_spec(f"{model}:L{l}:{n}", kind="gaussian")
            out.append(dict(trace=spec, model=model, layer=l, lengths=lengths, with_control=i == 0, fallback=why or ""))
    return out


def _series(X: np.ndarray, lengths, centered: bool = False) -> list[dict]:
    """norm_interval of the (head, token) vectors of X (H, n, d) over each prefix [0, L)."""
    out = []
    for L in lengths:
        P = X[:, :L]
        if centered:
            P = P - P.mean(axis=1, keepdims=True)
        norms = np.linalg.norm(P, axis=-1)                       # (H, L)
        st = norm_interval(norms.reshape(-1))
        st["per_head_mean"] = norms.mean(axis=1).tolist()
        out.append(st)
    return out


def run_trial(params: dict, seed: int, backend: str):
    Q, K, V, meta = layer_heads(params["trace"])
    p = parse_spec(params["trace"])
    if p["model"] != "synthetic":          # K/V come repeated per query head (GQA): keep the distinct KV heads
        rep = MODEL_INFO[p["model"]]["n_heads"] // MODEL_INFO[p["model"]]["n_kv_heads"]
        K, V = K[::rep], V[::rep]
    lengths = [L for L in params["lengths"] if L <= K.shape[1]]
    data = {"q": _series(Q, lengths), "k": _series(K, lengths), "k_centered": _series(K, lengths, centered=True),
            "v": _series(V, lengths)}
    series = [(f"{params['model']} {kind}", data[kind], False) for kind in KINDS]
    if params.get("with_control"):
        grow = np.sqrt(1.0 + np.arange(K.shape[1]) / 256.0)[None, :, None]
        series.append((f"{params['model']} control: keys x sqrt(1 + i/256)", _series(K * grow, lengths), True))
    recs = []
    for check, st, control in series:
        hi = [s["hi"] for s in st]
        slope_hi = loglog_slope(lengths, hi, n_boot=0)[0] if len(lengths) > 1 else 0.0
        slope_mean = loglog_slope(lengths, [s["mean"] for s in st], n_boot=0)[0] if len(lengths) > 1 else 0.0
        for L, s in zip(lengths, st):
            envelope = hi[0] * (L / lengths[0]) ** GROWTH_TOL
            recs.append(make_record(CLAIM, dict(params, n=L), measured=s["hi"], bound=envelope, bound_kind="fitted",
                                    check=check, control=control, trials=s["n"],
                                    source=SOURCE + f" (no-growth envelope: q97.5(n_min) (n/n_min)^{GROWTH_TOL})",
                                    slope_hi=slope_hi, slope_mean=slope_mean, pre_or_post_rope=meta["pre_or_post_rope"],
                                    fallback=params.get("fallback", ""), model=meta["model"],
                                    **{k: v for k, v in s.items() if k != "n"}))
    return recs


def _setup(model: str, rs) -> str:
    layers = sorted({r.params["layer"] for r in rs})
    ns = sorted({r.params["n"] for r in rs})
    name = "synthetic trace (real model unavailable)" if any(r.extra.get("fallback") for r in rs) else \
        MODEL_NAMES.get(model, model)
    return f"{name} ({len(layers)} layers in {layers[0]}..{layers[-1]}, n = {ns[0]}..{ns[-1]})"


def summarize(records) -> Verdict:
    models = sorted({r.params.get("model") for r in records if not r.control})
    figs = [FigureSpec(f"{m}: {kind} norm, 97.5% quantile vs n (hue: layer)", x="n", check=f"{m} {kind}", hue="layer",
                       show_bound=False) for m in models for kind in ("k", "k_centered", "q", "v")]
    if not records:
        return finalize(Verdict(CLAIM, NOT_RUN, "no records", figures=figs, statement="not-run"))
    main = [r for r in records if not r.control]
    ctl = [r for r in records if r.control]
    parts, findings, reps = [], [], []
    parts += fallback_notes(records)
    bad = [r for r in main if not r.holds]
    parts.append(f"{len(main) - len(bad)}/{len(main)} (layer, kind, n) within the no-growth envelope "
                 f"(n^{GROWTH_TOL} above the smallest n)")
    for m in models:
        mrs = [r for r in main if r.params.get("model") == m]
        for kind in KINDS:
            rs = [r for r in mrs if r.check == f"{m} {kind}"]
            if not rs:
                continue
            nmax = max(r.params["n"] for r in rs)
            top = [r for r in rs if r.params["n"] == nmax]
            slopes = [r.extra["slope_hi"] for r in top]
            parts.append(f"{m} {kind}: mean {min(r.extra['mean'] for r in top):.3g}..{max(r.extra['mean'] for r in top):.3g} "
                         f"(95% interval up to [{min(r.extra['lo'] for r in top):.3g}, {max(r.extra['hi'] for r in top):.3g}]) "
                         f"at n = {nmax} across layers; q97.5 slope vs n {min(slopes):+.3f}..{max(slopes):+.3f}")
        mbad = [r for r in mrs if not r.holds]
        synthetic = any(r.extra.get("fallback") for r in mrs)
        status = "n/a" if synthetic else "not-reproduced" if mbad else "reproduced"
        reps.append(Reproduction("q/k/v norms", status, _setup(m, mrs),
                                 f"{len(mrs) - len(mbad)}/{len(mrs)} (layer, kind, n) inside the envelope; paper: "
                                 f"{PAPER_SETUP}; here a smaller model and shorter sequences"))
    if bad:
        r = max(bad, key=lambda r: r.extra["slope_hi"])
        findings.append(Finding(CLAIM, f"norms grow with sequence length in {len({(b.check, b.params['layer']) for b in bad})} "
                                       f"(layer, kind) series",
                                f"{r.check}, layer {r.params['layer']}: 97.5% quantile {r.measured:.4g} at n = {r.params['n']} "
                                f"above the envelope {r.bound:.4g}; slope {r.extra['slope_hi']:+.3f} > {GROWTH_TOL}",
                                min(bad, key=lambda b: b.params["n"]).params, kind="finding"))
    controls = []
    if ctl:
        series = sorted({(r.check, r.params["trace"]) for r in ctl})
        for s in series:
            rejected = any(not r.holds for r in ctl if (r.check, r.params["trace"]) == s)
            controls.append(Control(f"{s[0]} ({s[1]})", rejected))
        parts.append(f"negative control (keys x sqrt(1 + i/256)) rejected {sum(c.rejected for c in controls)}/{len(series)}")
    parts.append(not_applicable("a property of the model's q/k/v norms, measured on the data; no estimate is made, so "
                                "no do-nothing estimator can meet it; its power is the growing-norm control's"))
    keys = [r for r in main if r.check.endswith(" k")]
    fitted = fitted_constant(keys, "largest key-norm 97.5% quantile (the r of BalanceKV-NeurIPS's bounds)", value=lambda r: r.extra["hi"])
    if fitted is not None:
        parts.append(f"largest key norm 97.5% quantile (the r of BalanceKV-NeurIPS's bounds) {fitted.value:.3g}")
    return decide(CLAIM, records, summary="; ".join(parts), figures=figs, findings=findings, controls=controls,
                  reproductions=reps, kind="empirical", fitted=fitted)

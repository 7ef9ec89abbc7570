"""BKV.vs-uniform, part two: how much of the released BalanceKV's win over its ablation is its walk, and how much
its estimator, on independent text windows.

The released code (ksheth96/BalanceKV) changes two things at once against random halving: a nearly greedy walk
(gamma = 4) and an estimator whose numerator weights w do not sum to the middle's tokens (the denominator uses
2^T; :mod:`kvbounds.algorithms.balance_kv_released`). Its ablation (gamma = 0: fair coins, the same cut and
estimator) tells the two apart only with the estimator held fixed, so this part runs the 2 x 2 of walk {the released
walk at temp 1, fair coins} x estimator {released, consistent (log w in both sums)} on the same cuts: per seed one
selection of the walk and one of the coins from the same uniforms, each scored with both estimators.

Unit: an independent text window, :data:`SETUP`'s ``windows`` non-overlapping windows of ``length`` tokens of one
long SmolLM2 trace (``text_tokens`` tokens of the default text, a documentation corpus whose topics change every
few hundred tokens; its layers ``layers`` only are extracted). Within a window the first ``sink`` tokens and the
last ``window`` are exact, the middle is compressed by 2^-T (blocks of ``block_size``), and the metric is the
practitioner's: the mean relative attention error over the last ``window`` queries (held out: they follow the
compressed middle and attend to it causally), averaged over query heads, the layers and ``seeds`` seeds (never
counted as units). One record per (window, T): ``measured`` the released walk's error, ``bound`` its ablation's,
``extra["arms"]`` each arm's, ``extra["weight_sum"]`` each selection's middle weights summed over the middle's
token count (the released estimator's numerator mass; 1 is consistent).

The calls (:func:`share_calls`): four paired comparisons per T over the windows, the package's rule for "better"
(:mod:`kvbounds.battery`: signed-rank tests on log-ratios, two-sided, Holm over every comparison and T named in
the text, the median ratio with its 95% interval):
  * the walk against coins, released estimator (the battery's ablation: the released variant's "win");
  * the walk against coins, consistent estimator (the walk's own share);
  * the released estimator against the consistent one, at the walk and at the coins (the estimator's share).
"""
from __future__ import annotations

import numpy as np

from kvbounds.traces.real import layer_heads

from .bkv_variants import causal_split, exact_last, head_errors, select
from .common import make_record, pick

__all__ = ["CHECK", "SWEEP", "SOURCE", "ARMS", "COMPARISONS", "SETUP", "WALK", "text_spec", "trials", "window_errors",
           "run_trial", "share_calls", "share_text", "share_table"]

CHECK = "walk vs estimator"
SWEEP = "windows"
SOURCE = ("released BalanceKV (ksheth96/BalanceKV) against its ablation, walk and estimator apart (BalanceKV-NeurIPS "
          "Sec. 4.1 setting)")
ARMS = ("walk, released estimator", "coin, released estimator", "walk, consistent estimator",
        "coin, consistent estimator")
# (arm, against, what the comparison isolates)
COMPARISONS = (("walk, released estimator", "coin, released estimator", "the walk against coins, released estimator "
                "(the ablation)"),
               ("walk, consistent estimator", "coin, consistent estimator", "the walk against coins, consistent "
                "estimator (the walk's own share)"),
               ("walk, released estimator", "walk, consistent estimator", "the released estimator against the "
                "consistent one, at the walk"),
               ("coin, released estimator", "coin, consistent estimator", "the released estimator against the "
                "consistent one, at the coins"))
SETUP = {
    "smoke": dict(model="synthetic", windows=3, length=192, layers=(1,), Ts=(1, 2), seeds=2, block_size=32, sink=16,
                  window=16),
    "quick": dict(model="smollm2", windows=20, length=384, layers=(1, 5), Ts=(1, 2, 3), seeds=4, block_size=64,
                  sink=32, window=32),
    "full": dict(model="smollm2", windows=21, length=384, layers=(1, 5, 15), Ts=(1, 2, 3), seeds=10, block_size=64,
                 sink=32, window=32),
}
WALK = "released-t1"          # the released variant: run_longbench.py's temp 1 (bkv_variants.VARIANTS)


def text_spec(model: str, layer: int, tokens: int) -> str:
    """The trace the windows are cut from: ``smollm2:L<layer>:<tokens>``, or a synthetic trace of that length."""
    return f"synthetic:gaussian:{tokens}:16:{layer}" if model == "synthetic" else f"{model}:L{layer}:{tokens}"


def trials(profile: str) -> list[dict]:
    """One trial per text window (its layers, T levels and seeds inside it); the real model's fallback is the
    synthetic trace of the same length (params name it)."""
    s = dict(pick(profile, smoke=SETUP["smoke"], quick=SETUP["quick"], full=SETUP["full"]))
    model, why = s.pop("model"), "the smoke profile cuts its windows from a synthetic trace"
    if model != "synthetic":
        from kvbounds.traces.real import available
        why = available(model) or ""
        model = "synthetic" if why else model
    tokens = s["windows"] * s["length"]
    return [dict(sweep=SWEEP, model=model, text_tokens=tokens, trace=text_spec(model, s["layers"][0], tokens),
                 fallback=why, index=i, **{k: (list(v) if isinstance(v, tuple) else v) for k, v in s.items()})
            for i in range(s["windows"])]


def _window(params: dict, layer: int):
    """(Q, K, V, meta) of one window of one layer: tokens [index length, (index + 1) length) of the long trace,
    whose chosen layers are extracted together on first use (one forward pass, not all 30 layers)."""
    spec = text_spec(params["model"], layer, params["text_tokens"])
    if params["model"] != "synthetic":
        from kvbounds.traces.real import extract
        extract(params["model"], params["text_tokens"], layers=list(params["layers"]))
    Q, K, V, meta = layer_heads(spec)
    sl = slice(params["index"] * params["length"], (params["index"] + 1) * params["length"])
    return Q[:, sl], K[:, sl], V[:, sl], meta


def _weight_sum(idx, lwn, sink: int, end: int) -> float:
    """The kept middle tokens' numerator weights summed, over the middle's token count (mean over KV heads)."""
    mid = (idx >= sink) & (idx < end)
    return float(np.mean(np.where(mid, np.exp(np.where(mid, lwn, 0.0)), 0.0).sum(-1) / (end - sink)))


def window_errors(Q, K, V, *, T: int, sink: int, window: int, block_size: int, seeds, group: int = 1,
                  causal: bool = True) -> tuple[dict, dict]:
    """({arm: mean relative error over seeds, query heads and the last ``window`` queries}, {"walk" / "coin":
    mean weight sum}) of one layer of one window. Per seed the walk and the coins draw the same uniforms (common
    random numbers); each selection is scored with both estimators (the same cut)."""
    exact, qpos = exact_last(Q, K, V, window, causal)
    Qw, n = Q[:, qpos], K.shape[1]
    errs = {a: [] for a in ARMS}
    wsum = {"walk": [], "coin": []}
    for s in seeds:
        for walk, over in (("walk", {}), ("coin", dict(gamma=0.0))):
            idx, lwn, lwd = select(WALK, K[::group], V[::group], T=T, sink=sink, window=window,
                                   block_size=block_size, rng=np.random.default_rng([int(s), 7]), group=group, **over)
            wsum[walk].append(_weight_sum(idx[::group], lwn[::group], sink, n - window))
            for est, den in (("released", lwd), ("consistent", lwn)):
                z = causal_split(Qw, qpos, K, V, idx, lwn, den)
                errs[f"{walk}, {est} estimator"].append(float(head_errors(z, exact).mean()))
    return {a: float(np.mean(v)) for a, v in errs.items()}, {k: float(np.mean(v)) for k, v in wsum.items()}


def run_trial(params: dict, seed: int, backend: str):
    """One text window: per T a record of every arm's error, averaged over the layers and seeds."""
    seeds = [int(s.generate_state(1)[0]) for s in np.random.SeedSequence(seed).spawn(params["seeds"])]
    per_layer: dict = {}
    for layer in params["layers"]:
        Q, K, V, meta = _window(params, layer)
        group = int(meta["n_heads"] // meta["n_kv_heads"]) if meta.get("n_kv_heads") else 1
        per_layer[layer] = {T: window_errors(Q, K, V, T=T, sink=params["sink"], window=params["window"],
                                             block_size=params["block_size"], seeds=seeds, group=group,
                                             causal=meta["causal"]) for T in params["Ts"]}
    recs = []
    for T in params["Ts"]:
        arms = {a: float(np.mean([per_layer[l][T][0][a] for l in params["layers"]])) for a in ARMS}
        wsum = {k: float(np.mean([per_layer[l][T][1][k] for l in params["layers"]])) for k in ("walk", "coin")}
        p = dict(params, T=T)
        recs.append(make_record(
            "BKV.vs-uniform", p, measured=arms[ARMS[0]], bound=arms[ARMS[1]], bound_kind="exact", check=CHECK,
            source=SOURCE + " (bound = the ablation's error: fair coins, the same cut and estimator)",
            arms=arms, weight_sum=wsum, unit=f"text window {params['index']} (tokens "
            f"{params['index'] * params['length']}..{(params['index'] + 1) * params['length'] - 1})",
            per_layer={str(l): per_layer[l][T][0] for l in params["layers"]}, seeds_per_unit=len(seeds),
            metric="mean relative attention error over the held-out later queries", model=params["model"]))
    return recs


# ------------------------------------------------------------------ the calls and their words
def share_calls(records) -> list[dict]:
    """Per (comparison, T), the call over the text windows (:mod:`kvbounds.battery`), Holm over all of them:
    dicts of :class:`kvbounds.battery._power_calls.Call` with ``comparison`` (what it isolates), ``arm`` and ``against``."""
    from kvbounds.battery import decide_call, two_sided_p
    from kvbounds.verdict import holm_adjust
    rs = [r for r in records if r.check == CHECK]
    cells = []
    for T in sorted({r.params["T"] for r in rs}):
        by = sorted((r for r in rs if r.params["T"] == T), key=lambda r: r.params["index"])
        for arm, against, what in COMPARISONS:
            a = [r.extra["arms"][arm] for r in by]
            b = [r.extra["arms"][against] for r in by]
            p, direction = two_sided_p(a, b)
            cells.append((T, arm, against, what, a, b, p, direction))
    adjusted = holm_adjust([c[6] for c in cells])
    out = []
    for (T, arm, against, what, a, b, _, direction), p in zip(cells, adjusted):
        c = decide_call(f"T = {T}", against, 2.0 ** -T, a, b, p, direction, len(cells),
                        unit="independent text windows").as_dict()
        out.append(dict(c, comparison=what, arm=arm, against=against, T=T))
    return out


def _numbers(c: dict) -> str:
    from kvbounds.battery import fmt
    if c["call"] == "not tested":
        return c.get("reason") or "not tested"
    lo, hi = c["ci"]
    return f"{fmt(c['ratio_median'])} [{fmt(lo)}, {fmt(hi)}], {c['wins']}/{c['n']} windows lower"


def share_text(records) -> str:
    """The decomposition in words: per comparison its call and median ratio (arm / against) at each T, and the
    weight sums of the released estimator; "" without records of this part."""
    rs = [r for r in records if r.check == CHECK]
    if not rs:
        return ""
    calls = share_calls(rs)
    n_units = len({r.params["index"] for r in rs})
    seeds = rs[0].extra.get("seeds_per_unit")
    parts = []
    for _, _, what in COMPARISONS:
        cs = [c for c in calls if c["comparison"] == what]
        if all(c["call"] == "not tested" for c in cs):
            parts.append(f"{what}: not tested ({cs[0].get('reason') or 'not tested'})")
        else:
            parts.append(f"{what}: " + "; ".join(f"{c['family']}: {c['call']} ({_numbers(c)})" for c in cs))
    ws = {k: [r.extra["weight_sum"][k] for r in rs] for k in ("walk", "coin")}
    weights = (f"the released estimator's middle weights sum to {min(ws['walk']):.3g}-{max(ws['walk']):.3g} of the "
               f"middle's tokens with the walk and {min(ws['coin']):.3g}-{max(ws['coin']):.3g} with coins")
    layers = sorted({l for r in rs for l in r.params.get("layers", [])})
    return (f"the released walk's win, walk and estimator apart ({n_units} independent text windows of "
            f"{rs[0].params['length']} tokens, the unit; {seeds} seeds and layers {layers} averaged within each; "
            f"ratio = first / second, mean relative error over the {rs[0].params['window']} held-out later queries; "
            f"'better': the first's error lower; Holm over the {len(calls)} tests): " + " | ".join(parts) + f"; {weights}")


def share_table(records) -> list[dict]:
    """Rows for the report: per T and arm the median over windows of the arm's error, and the calls."""
    rs = [r for r in records if r.check == CHECK]
    rows = []
    for T in sorted({r.params["T"] for r in rs}):
        by = [r for r in rs if r.params["T"] == T]
        rows += [dict(T=T, arm=a, median_error=float(np.median([r.extra["arms"][a] for r in by])), windows=len(by))
                 for a in ARMS]
    return rows


"""BKV.vs-uniform, part two: how much of the released BalanceKV's win over its ablation is its walk, and how much
its estimator, on independent text windows.

The released code (ksheth96/BalanceKV) changes two things at once against random halving: a nearly greedy walk
(gamma = 4) and an estimator whose numerator weights w do not sum to the middle's tokens (the denominator uses
2^T; :mod:`kvbounds.algorithms.balance_kv_released`). Its ablation (gamma = 0: fair coins, the same cut and
estimator) tells the two apart only with the estimator held fixed, so this part runs the 2 x 2 of walk {the released
walk at temp 1, fair coins} x estimator {released, consistent (log w in both sums)} on the same cuts: per seed one
selection of the walk and one of the coins from the same uniforms, each scored with both estimators.

Unit: an independent text window, the first ``length`` tokens of one distinct text of the corpus
(:mod:`kvbounds.traces.corpus`: unit i reads text i of those long enough, :func:`kvbounds.streams.real_texts`;
each record names its text), :data:`SETUP`'s ``units`` texts, read from the real-trace cache at the extraction
window that holds them (the layers ``layers`` extracted together with the power streams'). Within a window the
first ``sink`` tokens and the last ``window`` are exact, the middle is compressed by 2^-T (blocks of
``block_size``), and the metric is the practitioner's: the mean relative attention error over the last ``window``
queries (held out: they follow the compressed middle and attend to it causally), averaged over query heads, the
layers and ``seeds`` seeds (never counted as units: layers and seeds of one text are one unit). One record per
(text, T): ``measured`` the released walk's error, ``bound`` its ablation's, ``extra["arms"]`` each arm's,
``extra["weight_sum"]`` each selection's middle weights summed over the middle's token count (the released
estimator's numerator mass; 1 is consistent). The smoke profile cuts non-overlapping windows of one synthetic
trace of i.i.d. Gaussian keys (independent draws).

The calls (:func:`share_calls`): four paired comparisons per T over the windows, the one rule for "better"
(:func:`kvbounds.verdict.paired_calls`: signed-rank tests on log-ratios, two-sided, Holm over every comparison and
T named in the text, the effect with its 95% interval):
  * the walk against coins, released estimator (the battery's ablation: the released variant's "win");
  * the walk against coins, consistent estimator (the walk's own share);
  * the released estimator against the consistent one, at the walk and at the coins (the estimator's share).
"""
from __future__ import annotations

import numpy as np

from kvbounds.traces.real import layer_heads

from .bkv_variants import causal_split, exact_last, head_errors, select
from .common import make_record, pick

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
# quick: 20 texts of 384 tokens, layers 2 and 14 (cached with the power streams' quick layers), 4 seeds; full: the
# same 20 texts, layers 2, 14 and 27, 10 seeds
SETUP = {
    "smoke": dict(model="synthetic", units=3, length=192, layers=(1,), Ts=(1, 2), seeds=2, block_size=32, sink=16,
                  window=16),
    "quick": dict(model="smollm2", units=20, length=384, layers=(2, 14), Ts=(1, 2, 3), seeds=4, block_size=64,
                  sink=32, window=32),
    "full": dict(model="smollm2", units=20, length=384, layers=(2, 14, 27), Ts=(1, 2, 3), seeds=10, block_size=64,
                 sink=32, window=32),
}
WALK = "released-t1"          # the released variant: run_longbench.py's temp 1 (bkv_variants.VARIANTS)


def text_spec(model: str, layer: int, tokens: int) -> str:
    """The synthetic trace the smoke profile's windows are cut from (``tokens`` long)."""
    return f"synthetic:gaussian:{tokens}:16:{layer}"


def trials(profile: str) -> list[dict]:
    """One trial per unit (its layers, T levels and seeds inside it): a distinct corpus text for the real model;
    without the model, windows of the synthetic trace of the same length (params name why)."""
    s = dict(pick(profile, smoke=SETUP["smoke"], quick=SETUP["quick"], full=SETUP["full"]))
    model, why = s.pop("model"), "the smoke profile cuts its windows from a synthetic trace"
    if model != "synthetic":
        from kvbounds.traces.real import available
        why = available(model) or ""
        model = "synthetic" if why else model
    s = {k: (list(v) if isinstance(v, tuple) else v) for k, v in s.items()}
    if model == "synthetic":
        tokens = s["units"] * s["length"]
        return [dict(sweep=SWEEP, model=model, text_tokens=tokens, trace=text_spec(model, s["layers"][0], tokens),
                     fallback=why, index=i, **s) for i in range(s["units"])]
    from kvbounds.streams import REAL_LAYERS, real_texts
    names = real_texts("real SmolLM2", s["length"])[:s["units"]]
    extract = sorted(set(s["layers"]) | set(REAL_LAYERS["real SmolLM2"]["full" if profile == "full" else "quick"]))
    return [dict(sweep=SWEEP, model=model, text=name, extract=extract, fallback="", index=i, **s)
            for i, name in enumerate(names)]


def _window(params: dict, layer: int):
    """(Q, K, V, meta) of one unit of one layer: the first ``length`` tokens of the unit's corpus text (its layers
    extracted together on first use: one forward pass), or of the unit's window of the synthetic trace."""
    n = params["length"]
    if params["model"] != "synthetic":
        from kvbounds.streams import window_for
        from kvbounds.traces.corpus import layer_heads as text_heads
        Q, K, V, meta = text_heads(params["model"], layer, window_for(n), params["text"], params["extract"])
        return Q[:, :n], K[:, :n], V[:, :n], meta
    Q, K, V, meta = layer_heads(text_spec(params["model"], layer, params["text_tokens"]))
    sl = slice(params["index"] * n, (params["index"] + 1) * n)
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
            arms=arms, weight_sum=wsum, unit=_unit(params),
            per_layer={str(l): per_layer[l][T][0] for l in params["layers"]}, seeds_per_unit=len(seeds),
            metric="mean relative attention error over the held-out later queries", model=params["model"]))
    return recs


def _unit(params: dict) -> str:
    """The unit in words: the corpus text (its first ``length`` tokens), or the synthetic trace's window."""
    n = params["length"]
    if params.get("text"):
        return f"text {params['text']} (its first {n} tokens)"
    return f"synthetic window {params['index']} (tokens {params['index'] * n}..{(params['index'] + 1) * n - 1})"


# ------------------------------------------------------------------ the calls and their words
def share_calls(records) -> list[dict]:
    """Per (comparison, T), the one rule's call over the text windows (:func:`kvbounds.verdict.paired_calls`,
    Holm over all of them, on the practitioner's metric): dicts of :class:`kvbounds.verdict.Call` with
    ``comparison`` (what it isolates), ``arm`` and ``against``."""
    from kvbounds.verdict import Comparison, paired_calls
    rs = [r for r in records if r.check == CHECK]
    cells, comps = [], []
    for T in sorted({r.params["T"] for r in rs}):
        by = sorted((r for r in rs if r.params["T"] == T), key=lambda r: r.params["index"])
        for arm, against, what in COMPARISONS:
            cells.append((T, arm, against, what))
            comps.append(Comparison(f"T = {T}", against, [r.extra["arms"][arm] for r in by],
                                    [r.extra["arms"][against] for r in by], 2.0 ** -T))
    calls = paired_calls(comps, unit="independent text windows", metric="practitioner")
    return [dict(c.as_dict(), comparison=what, arm=arm, against=against, T=T)
            for (T, arm, against, what), c in zip(cells, calls)]


def _numbers(c: dict) -> str:
    from kvbounds.verdict import fmt
    if c["call"] == "not tested":
        return c.get("reason") or "not tested"
    lo, hi = c["ci"]
    return f"{fmt(c['effect'])} [{fmt(lo)}, {fmt(hi)}], {c['wins']}/{c['n']} windows lower"


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
    n = rs[0].params["length"]
    what = (f"distinct texts, the first {n} tokens of each" if rs[0].params.get("text") else
            f"windows of {n} tokens of a synthetic trace")
    return (f"the released walk's win, walk and estimator apart ({n_units} independent units: {what}; "
            f"{seeds} seeds and layers {layers} averaged within each; "
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


"""BKV.ablation: BalanceKV's error falls and its runtime rises as the batch (block) size grows (BalanceKV-NeurIPS Fig. 3);
and which ingredients of the authors' released recipe carry its gain over uniform sampling.

BalanceKV-NeurIPS = arXiv:2502.07861 v2, Sec. 4.1, Fig. 3, App. B.1. The single-layer experiment of
:mod:`kvbounds.proofs_checks.bkv_vs_uniform` (first ``sink`` and last ``window`` tokens exact, the middle
compressed by 2^-T; one selection per KV head shared by its query heads) on real SmolLM2 layers (the paper:
Llama-3.1-8B layers 1 and 15), for batch sizes b in {64, 128, 256}, 10 seeds of the compression randomness
per cell, for two variants (:mod:`kvbounds.proofs_checks.bkv_variants`): ``balance`` (the pseudocode of App. B)
and ``released-t0.1`` (the authors' released walk as the Fig. 3 notebook calls it).

Records of a batch-size trial (one layer, one T, all b inside), per variant:
  * ``error <variant>``    measured = mean error at b, bound = mean error at the next smaller b (b_min: itself);
                           holds = measured <= bound; the walk diagnostic of the first seed; the step's call is
                           the one rule's over the texts (:func:`bkv_variants.step_calls`: seeds and layers of one
                           text are one unit);
  * ``runtime <variant>``  measured = median seconds of one selection (all KV heads) at b, bound = the same at
                           the next smaller b; holds = measured >= bound (extra["direction"] says so).
Records of the ingredient trial (``ingredients=True``; one layer, one T, the largest b): ``ingredient <name>``:
starting from the released recipe (temp 0.1, gamma 4, centring, kernel constant 0.025, weights carried into the
kernel, released estimator) one ingredient is changed; measured = its mean error, bound = the recipe's;
extra: uniform sampling's error and the share of the recipe's gain over uniform that the change loses
((err - recipe) / (uniform - recipe)). An ingredient "carries the gain"
when changing it is worse than the recipe by the one rule (at the unit, a text; seeds are not units) and loses
at least half of the gain.
"""
from __future__ import annotations

import numpy as np

from kvbounds.algorithms.query_discrepancy import held_out_queries
from kvbounds.verdict import NOT_RUN, FigureSpec, Finding, Verdict
from kvbounds.theory.empirical import mean_and_spread
from kvbounds.traces.real import layer_heads, real_or_synthetic_spec

from .bkv_variants import (COIN_WORDS, INGREDIENTS, LABELS, SHORT, WORDS, combine, finish, reproduction, run_variants,
                           step_calls, text_of, variant_name, version_findings, walk_summary)
from .common import fallback_notes, make_record, pick
from . import walk_cause

CLAIM = "BKV.ablation"
SOURCE = "BalanceKV-NeurIPS Sec. 4.1, Fig. 3, App. B.1"
SWEEP_VARIANTS = ("balance", "released-t0.1")


def trials(profile: str) -> list[dict]:
    model = pick(profile, smoke="minilm", quick="smollm2", full="smollm2")
    n = pick(profile, smoke=512, quick=2048, full=4096)
    layers = pick(profile, smoke=[1], quick=[1, 15], full=[1, 15])
    sink = pick(profile, smoke=32, quick=128, full=256)
    Ts = pick(profile, smoke=[1], quick=[1, 3], full=[1, 2, 3])
    sizes = pick(profile, smoke=[32, 64], quick=[64, 128, 256], full=[64, 128, 256])
    seeds = pick(profile, smoke=3, quick=10, full=10)
    ing = pick(profile, smoke=[(1, 1)], quick=[(1, 2)], full=[(1, 1), (1, 3), (15, 2)])   # (layer, T)
    out = []
    for l in layers:
        spec, why = real_or_synthetic_spec(f"{model}:L{l}:{n}", kind="gaussian")
        out += [dict(trace=spec, T=T, sink=sink, window=sink, block_sizes=sizes, seeds=seeds, fallback=why or "")
                for T in Ts]
    for l, T in ing:
        spec, why = real_or_synthetic_spec(f"{model}:L{l}:{n}", kind="gaussian")
        out.append(dict(trace=spec, T=T, sink=sink, window=sink, block_size=max(sizes), seeds=seeds,
                        fallback=why or "", ingredients=True))
    return out


def _group(meta) -> int:
    return int(meta["n_heads"] // meta["n_kv_heads"]) if meta.get("n_kv_heads") else 1


def _seeds(seed: int, k: int) -> list[int]:
    return [int(s.generate_state(1)[0]) for s in np.random.SeedSequence(seed).spawn(k)]


def _common(K, meta, params, group):
    return dict(n=int(K.shape[1]), heads=int(K.shape[0]), group=group, model=meta["model"],
                fallback=params.get("fallback", ""), layer=meta.get("layer", -1))


def run_trial(params: dict, seed: int, backend: str):
    Q, K, V, meta = layer_heads(params["trace"])
    group = _group(meta)
    seeds = _seeds(seed, params["seeds"])
    if params.get("ingredients"):
        return _ingredient_trial(Q, K, V, meta, params, seeds, group)
    rows, causes = [], {}
    for b in params["block_sizes"]:
        res = run_variants(Q, K, V, T=params["T"], sink=params["sink"], window=params["window"], block_size=b,
                           seeds=seeds, group=group, causal=meta["causal"], methods=SWEEP_VARIANTS)
        rows.append((b, res))
        causes[b] = walk_cause.blockwise_cause(params["trace"], K[::group], V[::group], block_size=b,
                                               sink=params["sink"], window=params["window"], kernels=SWEEP_VARIANTS,
                                               Q=held_out_queries(Q, group, params["window"]))
    recs = []
    common = _common(K, meta, params, group)
    for m in SWEEP_VARIANTS:
        for i, (b, res) in enumerate(rows):
            pb, pres = rows[max(i - 1, 0)]
            err, perr = res["errors"][m].mean(axis=1), pres["errors"][m].mean(axis=1)
            tm, ptm = np.asarray(res["times"][m]), np.asarray(pres["times"][m])
            p = dict(params, block_size=b)
            recs.append(make_record(CLAIM, p, measured=err.mean(), bound=perr.mean(), holds=bool(err.mean() <= perr.mean()),
                                    bound_kind="exact", check=f"error {m}", trials=len(err),
                                    source=SOURCE + " (bound = error at the next smaller b)", method=m,
                                    variant=LABELS[m], stats=mean_and_spread(err), previous_block=pb,
                                    **walk_summary(res["diagnostics"].get(m, [])), **common,
                                    walk_cause=causes[b][walk_cause.VARIANT_KERNELS[m][0]]))
            recs.append(make_record(CLAIM, p, measured=float(np.median(tm)), bound=float(np.median(ptm)),
                                    holds=bool(np.median(tm) >= np.median(ptm)), bound_kind="exact",
                                    check=f"runtime {m}", source=SOURCE + " (bound = runtime at the next smaller b)",
                                    trials=len(tm), method=m, direction="holds when measured >= bound (runtime rises)",
                                    times=tm.tolist(), previous_block=pb, **common))
    return recs


def _ingredient_trial(Q, K, V, meta, params, seeds, group):
    over = {name: dict(ch) for name, ch in INGREDIENTS.items()}
    res = run_variants(Q, K, V, T=params["T"], sink=params["sink"], window=params["window"],
                       block_size=params["block_size"], seeds=seeds, group=group, causal=meta["causal"],
                       methods=("uniform",), overrides=over)
    errs = {m: e.mean(axis=1) for m, e in res["errors"].items()}
    base, unif = errs["recipe"], errs["uniform"]
    gain = unif.mean() - base.mean()
    common = _common(K, meta, params, group)
    cause = walk_cause.blockwise_cause(params["trace"], K[::group], V[::group], block_size=params["block_size"],
                                       sink=params["sink"], window=params["window"],
                                       kernels=("released-t0.1", "released-t1"),
                                       Q=held_out_queries(Q, group, params["window"]))
    recs = []
    for name in INGREDIENTS:
        e = errs[name]
        kernel, side, rule = INGREDIENT_WALKS.get(name, (None, None, None))
        recs.append(make_record(CLAIM, params, measured=e.mean(), bound=base.mean(), holds=bool(e.mean() <= base.mean()),
                                bound_kind="exact", check=f"ingredient {name}", trials=len(e),
                                source="released recipe (ksheth96/BalanceKV) with one ingredient changed; bound = the "
                                       "recipe's error", ingredient=name, change=INGREDIENTS[name],
                                stats=mean_and_spread(e), uniform=mean_and_spread(unif), recipe=mean_and_spread(base),
                                gain=float(gain), gain_lost=float((e.mean() - base.mean()) / gain) if gain else None,
                                ratio_to_uniform=float(e.mean() / unif.mean()),
                                **walk_summary(res["diagnostics"].get(name, [])), **common,
                                **(dict(walk_cause=cause[kernel], walk_side=side, walk_rule=rule) if kernel else {})))
    return recs


# the walk an ingredient's change runs, as measured on the first-level blocks (walk_cause.blockwise_cause): (kernel,
# keys raw or centred, sign rule of walk_diagnostics); the other changes keep the recipe's kernel and rule
INGREDIENT_WALKS = {"recipe": ("released-t0.1", "centred", "released"),
                    "walk constant of the theory (p = 1/2 - x/(2 c R^2))": ("released-t0.1", "centred", "theorem"),
                    "no centring": ("released-t0.1", "raw", "released"),
                    "temp 1": ("released-t1", "centred", "released"),
                    "gamma 0 (random signs, same cut)": ("released-t0.1", "centred", "random")}


def ingredient_walk_text(records) -> str:
    """Per measured ingredient (the first cell): the discrepancy its walk keeps of random signs' and greedy's."""
    out = []
    for r in sorted((r for r in records if r.extra.get("walk_rule")), key=lambda r: (
            r.params["trace"], r.params["T"], list(INGREDIENT_WALKS).index(r.extra["ingredient"]))):
        s = r.extra["walk_cause"][r.extra["walk_side"]]
        rule, name = r.extra["walk_rule"], r.extra["ingredient"]
        same = s.get(f"{rule}_equal_random", {}).get("median") if rule != "random" else 1.0
        query = s.get(f"{rule}_query_num", {}).get("mean")
        seen = (f"; held-out queries see {query:.2f} (greedy {s['greedy_query_num']['mean']:.2f})"
                if query is not None and "mean" in s.get("greedy_query_num", {}) else "")
        out.append(f"{name.split(' (')[0]}: keeps {s[f'{rule}_disc_ratio']['median']:.2f} of the Gram yardstick "
                   f"(greedy {s['greedy_disc_ratio']['median']:.2f}{seen}"
                   + (f", {100 * same:.0f}% of signs equal random signs)" if same is not None else ")"))
        if len(out) == len(INGREDIENT_WALKS):       # one cell is enough: the walks do not depend on T
            break
    if not out:
        return ""
    return ("the ingredients' walks on the first-level blocks (discrepancy kept of random signs': the Gram yardstick "
            "in the median block, the numerator held-out queries see in the mean block): "
            + "; ".join(out))


def ingredient_table(records) -> list[dict]:
    """Per ingredient and cell: error, ratio to uniform, share of the gain lost, and the one rule's call of the
    changed recipe against the recipe at the unit, a text (:func:`step_calls`, Holm over the ingredients; the
    same call on every row of one ingredient), for reports."""
    ing = [r for r in records if r.check.startswith("ingredient ") and r.extra["ingredient"] != "recipe"]
    names = sorted({r.extra["ingredient"] for r in ing})
    calls = dict(zip(names, step_calls([(name, "recipe", [r for r in ing if r.extra["ingredient"] == name])
                                        for name in names]))) if names else {}
    out = []
    for r in sorted((r for r in records if r.check.startswith("ingredient ")),
                    key=lambda r: (r.params["trace"], r.params["T"], list(INGREDIENTS).index(r.extra["ingredient"])
                                   if r.extra["ingredient"] in INGREDIENTS else 99)):
        out.append(dict(trace=r.params["trace"], T=r.params["T"], ingredient=r.extra["ingredient"],
                        error=r.measured, sd=r.extra["stats"]["std"], recipe=r.bound,
                        uniform=r.extra["uniform"]["mean"], ratio_to_uniform=r.extra["ratio_to_uniform"],
                        gain_lost=r.extra["gain_lost"], call=calls.get(r.extra["ingredient"], {}).get("call", ""),
                        significantly_worse=calls.get(r.extra["ingredient"], {}).get("call") == "worse",
                        walk_is_coin=bool(r.extra.get("walk_is_coin"))))
    return out


def _carries(rows) -> dict:
    per: dict = {}
    for row in rows:
        if row["ingredient"] == "recipe":
            continue
        per.setdefault(row["ingredient"], []).append(row)
    return {k: (sum(r["significantly_worse"] and (r["gain_lost"] or 0) >= 0.5 for r in v), len(v),
                float(np.median([r["gain_lost"] for r in v if r["gain_lost"] is not None] or [np.nan])))
            for k, v in per.items()}


def trivial_text(records) -> str:
    """The comparison with doing nothing that these records allow: zeros has relative error 1 by
    definition; uniform sampling at equal memory is in the ingredient records; the mean of the values and the recent
    window are measured on the same experiment by BKV.vs-uniform (:mod:`kvbounds.proofs_checks.bkv_trivial`)."""
    out = []
    for m in SWEEP_VARIANTS:
        err = [r.measured for r in records if r.check == f"error {m}"]
        if err:
            out.append(f"{m} relative error {min(err):.3g}..{max(err):.3g} (zeros: 1)")
    ing = [r for r in records if r.check == "ingredient recipe"] or [r for r in records if r.check.startswith("ingredient ")]
    if ing:
        rec = [r.extra["recipe"]["mean"] / r.extra["uniform"]["mean"] for r in ing if r.check == "ingredient recipe"] or \
              [r.bound / r.extra["uniform"]["mean"] for r in ing]
        out.append(f"released recipe / uniform sampling at equal memory {min(rec):.3g}..{max(rec):.3g}")
    return ("against doing nothing: " + "; ".join(out) + "; the mean of the values and the recent window at equal "
            "memory are not run here: BKV.vs-uniform's power table compares the same variants with them on the "
            "same experiment")


def summarize(records) -> Verdict:
    figs = [FigureSpec("relative error vs batch size (hue: variant)", x="block_size", hue="check",
                       show_bound=False),
            FigureSpec("selection time (s) vs batch size (hue: variant)", x="block_size", hue="check",
                       show_bound=False)]
    if not records:
        return Verdict(CLAIM, NOT_RUN, "no records", figures=figs)
    parts, findings = list(fallback_notes(records)), list(version_findings(CLAIM))
    models = sorted({r.extra.get("model", "?") for r in records})
    setup = (f"{'/'.join(models)} layers {sorted({r.extra.get('layer', -1) for r in records})}, "
             f"n = {'/'.join(map(str, sorted({r.extra.get('n', 0) for r in records})))} "
             "(paper: Llama-3.1-8B layers 1 and 15)")
    reps, texts = [], []
    for m in SWEEP_VARIANTS:
        err = [r for r in records if r.check == f"error {m}" and r.extra["previous_block"] != r.params["block_size"]]
        run = {(r.params["trace"], r.params["T"], r.params["block_size"]): r for r in records
               if r.check == f"runtime {m}"}
        if not err:
            continue
        steps = sorted({(r.params["T"], r.extra["previous_block"], r.params["block_size"]) for r in err})
        calls = step_calls([(f"T = {T}, b {pb} -> {b}", f"b = {pb}", [r for r in err if (r.params["T"],
                            r.extra["previous_block"], r.params["block_size"]) == (T, pb, b)]) for T, pb, b in steps])
        gates = [all(run[(r.params["trace"], T, b)].holds for r in err if (r.params["T"], r.params["block_size"]) ==
                     (T, b)) for T, pb, b in steps]
        rep = reproduction(m, calls, setup, gates)
        reps.append(rep)
        rt = [r for r in run.values() if r.extra["previous_block"] != r.params["block_size"]]
        coin = all(r.extra.get("walk_is_coin") for r in err) and m != "balance"
        texts.append(f"{WORDS[rep.status]} for the {variant_name(m)}" + (f" ({COIN_WORDS})" if coin else "")
                     + f": error lower (the one rule) with longer runtime in "
                       f"{sum(c['call'] == 'better' and g for c, g in zip(calls, gates))}/{len(calls)} doubling steps"
                     + (f" ({rep.bound_note})" if rep.bound_note else ""))
        parts.append(f"{m}: error falls in {sum(r.holds for r in err)}/{len(err)} (text, layer, step) cells (each "
                     f"the mean over its seeds); per step over {len({text_of(r) for r in err})} text(s), the unit: "
                     + "; ".join(f"{c['family']}: {c['call']}" for c in calls)
                     + f"; runtime rises in {sum(r.holds for r in rt)}/{len(rt)}")
    cause_parts, cause_finding = walk_cause.blockwise_text(records, SWEEP_VARIANTS, SHORT,
                                                           lambda r: f"layer {r.extra.get('layer', '?')}")
    parts += cause_parts
    findings += [cause_finding] if cause_finding else []
    if ingredient_walk_text(records):
        parts.append(ingredient_walk_text(records))
    rows = ingredient_table(records)
    if rows:
        carry = _carries(rows)
        yes = [k for k, (c, n, _) in carry.items() if c > n / 2]
        parts.append("ingredient ablation (share of the released recipe's gain over uniform lost when changed, median "
                     "over cells): " + ", ".join(f"{k} {g:+.2f}" for k, (_, _, g) in carry.items()))
        parts.append("ingredients that carry the gain: " + (", ".join(yes) if yes else "none significantly"))
    parts.append(trivial_text(records))
    text = "; ".join(texts)
    v = Verdict(CLAIM, "", "; ".join([text] + parts), findings=findings, figures=figs, n_records=len(records),
                reproductions=reps, reproduction=combine(reps))
    return finish(v, text)

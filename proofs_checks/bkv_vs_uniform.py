"""BKV.vs-uniform: at equal memory, BalanceKV's relative attention error is lower than uniform sampling's.

The single-layer experiment of BalanceKV-NeurIPS (arXiv:2502.07861 v2) Sec. 4.1 / Fig. 1 / App. B.1 on real SmolLM2 traces
(``kvbounds.traces.real``): for one layer the cache keeps the first ``sink`` and the last ``window`` tokens
exactly and compresses the middle [sink, n - window) by 2^-T (T = 1..4); for the last ``window`` queries j the
estimate z_j uses the kept tokens <= j (causal) and the error is ||z_j - Attn_j|| / ||Attn_j||, averaged over
queries and query heads; ``seeds`` seeds of the compression randomness give mean +- sd (the trace itself is
deterministic). One selection per KV head, shared by the query heads of its group (GQA, as the released code).

Variants side by side (:mod:`kvbounds.proofs_checks.bkv_variants`): ``balance`` = the pseudocode (App. B's
blockwise Alg. 2), ``released-t1`` / ``released-t0.1`` = the authors' released walk at temp 1 (run_longbench.py)
and 0.1 (the notebook behind Fig. 1), ``consistent-t0.1`` = the released walk with the consistent estimator, and
``uniform`` = independent uniform sampling at equal memory. Also (informational) every other selector of
:mod:`kvbounds.algorithms.token_selection` (StreamingLLM, H2O, k-center) at the same budget, and kernel thinning
(:mod:`kvbounds.algorithms.kernel_thinning`, goodpoints; one selection per KV head, first seed only) when the
``kt`` extra is installed: the discrepancy-based halving with the sharpest known guarantees, beside BalanceKV's.

Records (one trial = one layer and one T): ``error <variant>`` with measured = mean error over seeds, bound =
uniform sampling's mean error (``bound_kind="exact"``: an inequality between two measurements), the ratio,
one-sided Mann-Whitney p-values both ways over seeds, the per-KV-head errors and, for every BalanceKV variant,
the walk diagnostic of the first seed (mean |p - 1/2| per level, share of clipped p, c or gamma, R^2) with the
note "the walk is indistinguishable from random signs here; BalanceKV = stratified uniform sampling" when the
walk is a fair coin. Negative control ``error balance-unweighted``: the pseudocode's selection with its 2^T
weights dropped. Each variant's reproduction follows :func:`kvbounds.verdict.reproduction_status` over its
(layer, T) cells. The paper's sizes (sink = window = 256, n = 4096 here) are in the ``full`` profile.
When the SmolLM2 package is missing, the trace is synthetic (params name it) and the verdict says so.
"""
from __future__ import annotations

import math
import time

import numpy as np

from kvbounds.algorithms.query_discrepancy import held_out_queries
from kvbounds.verdict import NOT_RUN, FigureSpec, Finding, Verdict
from kvbounds.theory.empirical import mean_and_spread
from kvbounds.traces.real import layer_heads, real_or_synthetic_spec

from .bkv_variants import (ABLATION_OVERRIDES, ABLATIONS, COIN_NOTE, COIN_WORDS, LABELS, SHORT, WORDS, combine,
                           exact_last, finish, per_kv_head, run_variants, variant_name, version_findings,
                           walk_summary)
from .bkv_trivial import CAVEAT, mean_values_error, trivial_power
from .common import dispatch, fallback_notes, make_record, pick
from . import bkv_walk_share as walk_share, walk_cause

CLAIM = "BKV.vs-uniform"
SOURCE = "BalanceKV-NeurIPS Sec. 4.1, Fig. 1, App. B.1"
CONTROL = "balance-unweighted"
METHODS = ("balance", "released-t1", "released-t0.1", "consistent-t0.1", "uniform")
BKV_VARIANTS = METHODS[:-1]


def _spec(model: str, layer: int, n: int) -> tuple[str, str | None]:
    return real_or_synthetic_spec(f"{model}:L{layer}:{n}", kind="gaussian")


# The unit of replication is a text: quick and full read UNITS distinct texts of the corpus
# (kvbounds.traces.corpus, the windows the power streams read), layers of one text one unit. Quick: 20 texts of 544
# tokens, layer 2, T = 2 (a quarter of the middle kept), 4 seeds (~2 CPU s per text); full: 20 texts of 1056
# tokens, layers 2, 8, 14, every T, 4 seeds. The paper's single long trace (4096 tokens at 256/256) costs ~50 CPU s
# per (layer, T) cell: 20 texts of it are past the full profile's budget. Smoke: the cached default text (one unit).
UNITS = {"quick": 20, "full": 20}


def trials(profile: str) -> list[dict]:
    if profile == "smoke":
        spec, why = _spec("minilm", 1, 512)
        return [dict(trace=spec, T=T, sink=32, window=32, block_size=64, seeds=3, fallback=why or "")
                for T in (1, 3)] + walk_share.trials(profile)
    from kvbounds.traces.real import available
    from kvbounds.streams import REAL_LAYERS, real_texts
    n = pick(profile, smoke=544, quick=544, full=1056)
    layers = pick(profile, smoke=[2], quick=[2], full=[2, 8, 14])
    sink = pick(profile, smoke=32, quick=32, full=64)
    Ts = pick(profile, smoke=[2], quick=[2], full=[1, 2, 3, 4])
    if available("smollm2"):        # without the model: the synthetic fallback's one trace (the verdict says so)
        spec, why = _spec("smollm2", layers[0], n)
        return [dict(trace=spec, T=T, sink=sink, window=sink, block_size=sink, seeds=4, fallback=why or "")
                for T in Ts] + walk_share.trials(profile)
    names = real_texts("real SmolLM2", n)[:UNITS["full" if profile in ("full", "gpu") else "quick"]]
    extract = tuple(sorted(set(layers) | set(REAL_LAYERS["real SmolLM2"]["full" if profile == "full" else "quick"])))
    return [dict(trace=f"smollm2:L{l}:{n}", text=name, layers=list(extract), T=T, sink=sink, window=sink,
                 block_size=sink, seeds=4, fallback="") for name in names for l in layers for T in Ts] + \
        walk_share.trials(profile)


# ------------------------------------------------------------------------------- the experiment

def causal_estimate(Qw, qpos, K, V, idx, logw):
    """z_j for queries Qw (H, w, d) at positions qpos (w,) from the kept tokens idx (H, m) (log-weights logw)
    restricted to idx <= j: softmax(<q, k_i>/sqrt d + log w_i) over them, times v_i. float64 (torch CPU
    kernels for speed; numpy in, numpy out)."""
    import torch
    H, _, d = K.shape
    idx = torch.as_tensor(np.ascontiguousarray(idx), dtype=torch.int64)
    lw = torch.as_tensor(np.array(np.broadcast_to(np.asarray(logw, dtype=np.float64), tuple(idx.shape))))
    Kt, Vt = torch.as_tensor(K), torch.as_tensor(V)
    Ks = torch.gather(Kt, 1, idx[..., None].expand(-1, -1, d))
    Vs = torch.gather(Vt, 1, idx[..., None].expand(-1, -1, Vt.shape[-1]))
    lg = torch.bmm(torch.as_tensor(Qw), Ks.transpose(1, 2)) / math.sqrt(d) + lw[:, None, :]
    lg = lg.masked_fill(idx[:, None, :] > torch.as_tensor(qpos)[None, :, None], -math.inf)
    return torch.bmm(torch.softmax(lg, dim=-1), Vs).numpy()


def _rel(z, exact) -> float:
    """Mean over heads and queries of ||z_j - Attn_j|| / ||Attn_j|| (BalanceKV-NeurIPS App. B.1)."""
    return float(np.mean(np.linalg.norm(z - exact, axis=-1) / np.linalg.norm(exact, axis=-1)))


def other_selectors(sink: int, window: int) -> dict:
    """Every token-selection method of kvbounds.algorithms.token_selection importable now (besides uniform/balance)."""
    try:
        from kvbounds.algorithms import token_selection as ts
    except Exception:   # noqa: BLE001 - the module is optional: absent or broken means "no other methods"
        return {}
    kw = {"streaming_llm": dict(sink=sink), "h2o": dict(), "kcenter": dict(window=window)}
    out = {}
    for name in getattr(ts, "SELECTORS", {}):
        if name in ("uniform", "balancekv"):
            continue
        try:
            out[name] = ts.make_selector(name, **kw.get(name, {}))
        except Exception:   # noqa: BLE001 - a selector that cannot be built with these settings is skipped
            continue
    return out


def kv_head_selectors(sink: int, window: int) -> dict:
    """Selectors run once per KV head (their selection shared by the group): kernel thinning, if goodpoints is here."""
    from kvbounds.algorithms.kernel_thinning import KernelThinning, goodpoints_missing
    return {} if goodpoints_missing() else {"kernel_thinning": KernelThinning(sink=sink, window=window)}


def run_experiment(Q, K, V, *, T: int, sink: int, window: int, block_size: int, seeds, causal: bool = True,
                   group: int = 1, methods=METHODS + (CONTROL,), others: dict | None = None,
                   kv_others: dict | None = None, ablations: bool = True) -> dict:
    """Per method, the mean relative error per seed (``errors``) and per seed and query head (``head_errors``);
    selections per KV head (K[::group]) shared by the group; the walk diagnostics of the first seed. ``others``
    select per query head, ``kv_others`` per KV head; both once, with the first seed. ``ablations``: also each
    BalanceKV variant's ablation (random signs, the same cut: bkv_variants.ABLATIONS)."""
    abl = (("balance-coin",) if ablations and "balance" in methods else ())
    res = run_variants(Q, K, V, T=T, sink=sink, window=window, block_size=block_size, seeds=seeds, group=group,
                       causal=causal, methods=tuple(m for m in methods if m != CONTROL) + abl,
                       control="balance" if CONTROL in methods else None,
                       overrides=ABLATION_OVERRIDES if ablations else None)
    errs = {m: [float(x) for x in e.mean(axis=1)] for m, e in res["errors"].items()}
    exact, qpos = exact_last(Q, K, V, window, causal)
    errs["mean_values"] = [mean_values_error(V, exact, qpos, causal)]
    for name, sel in [(n, (s, False)) for n, s in (others or {}).items()] + \
            [(n, (s, True)) for n, s in (kv_others or {}).items()]:
        sel, per_kv = sel
        try:
            t0 = time.perf_counter()
            if per_kv:
                idx, lw = sel.select(K[::group], V[::group], budget=res["budget"], rng=np.random.default_rng(seeds[0]))
                idx, lw = np.repeat(np.asarray(idx), group, axis=0), np.repeat(np.asarray(lw), group, axis=0)
                res["times"][name] = [time.perf_counter() - t0]
            else:
                idx, lw = sel.select(K, V, budget=res["budget"], rng=np.random.default_rng(seeds[0]), Q=Q)
            errs[name] = [_rel(causal_estimate(Q[:, qpos], qpos, K, V, np.asarray(idx), np.asarray(lw)), exact)]
        except Exception as e:   # noqa: BLE001 - an optional baseline failing is reported, not fatal
            errs[name] = []
            errs[f"{name} (failed)"] = [str(e)[:200]]
    return {"errors": errs, "head_errors": res["errors"], "balance_times": res["times"].get("balance", []),
            "times": res["times"], "diagnostics": res["diagnostics"], "budget": res["budget"]}


def cell_trial(params: dict, seed: int, backend: str):
    """One (text, layer, T) cell of the single-layer experiment: every method's error over seeds."""
    if params.get("text"):         # a window of one distinct text of the corpus (the unit of replication)
        from kvbounds.traces.corpus import layer_heads as text_layer_heads
        spec = params["trace"].split(":")
        Q, K, V, meta = text_layer_heads(spec[0], int(spec[1][1:]), int(spec[2]), params["text"],
                                         params.get("layers", ()))
    else:
        Q, K, V, meta = layer_heads(params["trace"])
    group = int(meta.get("n_heads", 1) // meta.get("n_kv_heads", 1)) if meta.get("n_kv_heads") else 1
    T, sink, window = params["T"], params["sink"], params["window"]
    seeds = [int(s.generate_state(1)[0]) for s in np.random.SeedSequence(seed).spawn(params["seeds"])]
    res = run_experiment(Q, K, V, T=T, sink=sink, window=window, block_size=params["block_size"], seeds=seeds,
                         causal=meta["causal"], group=group, others=other_selectors(sink, window),
                         kv_others=kv_head_selectors(sink, window))
    errs, heads = res["errors"], res["head_errors"]
    cause = walk_cause.blockwise_cause(params["trace"], K[::group], V[::group], block_size=params["block_size"],
                                       sink=sink, window=window, kernels=("balance", "released-t1", "released-t0.1"),
                                       Q=held_out_queries(Q, group, window))
    unif = np.asarray(errs["uniform"])
    common = dict(budget=res["budget"], n=int(K.shape[1]), heads=int(K.shape[0]), kv_heads=int(K.shape[0]) // group,
                  group=group, model=meta["model"], fallback=params.get("fallback", ""), uniform=mean_and_spread(unif),
                  layer=meta.get("layer", -1), unit=f"text {params['text']}" if params.get("text") else
                  f"text {meta.get('text_hash', params['trace'])[:12]}",
                  uniform_per_kv_head=per_kv_head(heads["uniform"], group) if "uniform" in heads else None)
    recs = []
    for name, vals in errs.items():
        if name.endswith("(failed)") or not vals:
            continue
        v = np.asarray(vals, dtype=float)
        extra = dict(method=name, variant=LABELS.get(name, name), stats=mean_and_spread(v), per_seed=v.tolist(),
                     ratio=float(v.mean() / unif.mean()),
                     seeds_per_trial=len(seeds), **common)
        if name in heads:
            pk = per_kv_head(heads[name], group)
            extra.update(per_kv_head=pk, ratio_per_kv_head=[a / b for a, b in zip(pk, common["uniform_per_kv_head"])])
        if name in res["diagnostics"]:
            extra.update(walk_summary(res["diagnostics"][name]))
        if name in walk_cause.VARIANT_KERNELS:       # what this variant's walk has to balance (raw and centred)
            extra["walk_cause"] = cause[walk_cause.VARIANT_KERNELS[name][0]]
        if name in res["times"]:
            extra["select_seconds"] = float(np.median(res["times"][name]))
        recs.append(make_record(CLAIM, params, measured=v.mean(), bound=unif.mean(),
                                holds=True if name == "uniform" else bool(v.mean() < unif.mean()),
                                bound_kind="exact", check=f"error {name}", control=name == CONTROL,
                                source=SOURCE + " (bound = uniform sampling's error at equal memory)",
                                trials=len(v), **extra))
    fails = {k[:-9]: v[0] for k, v in errs.items() if k.endswith("(failed)")}
    if fails:
        recs[0].extra["failed_methods"] = fails
    return recs


run_trial = dispatch("sweep", {walk_share.SWEEP: walk_share.run_trial}, default=cell_trial)


def setup_text(records) -> str:
    models = sorted({r.extra.get("model", "?") for r in records})
    layers = sorted({r.extra.get("layer", -1) for r in records})
    ns = sorted({r.extra.get("n", 0) for r in records})
    sinks = sorted({r.params.get("sink") for r in records})
    units = len({r.extra.get("unit") for r in records if r.extra.get("unit")})
    return (f"{'/'.join(models)} layers {layers}, n = {'/'.join(map(str, ns))}, sink = window = "
            f"{'/'.join(map(str, sinks))}, {units} distinct text(s) (the unit) (paper: Llama-3.1-8B / Ministral-8B on "
            f"TriviaQA, layers 1, 2, 5)")


def variant_cells(records, method: str) -> list[dict]:
    return [dict(record=r, n=r.extra.get("seeds_per_trial")) for r in records if r.check == f"error {method}"]


def per_variant_text(reps, records, calls_by_variant: dict) -> str:
    """'not reproduced for the pseudocode walk at the theorem's c (= random halving): tied with uniform (1.01 [...],
    11/20 wins); reproduced for the released walk (authors' code: ...): better than uniform (...); ...' (the variants'
    words from the method registry; each call the one rule's against uniform at the unit, a text)."""
    from kvbounds.verdict import call_words
    out = []
    for rep in reps:
        cells = variant_cells(records, rep.variant)
        coin = cells and all(c["record"].extra.get("walk_is_coin") for c in cells) and rep.variant != "balance"
        calls = "; ".join(call_words(c) for c in calls_by_variant.get(rep.variant, []))
        out.append(f"{WORDS[rep.status]} for the {variant_name(rep.variant)}" + (f" ({COIN_WORDS})" if coin else "")
                   + (f": {calls}" if calls else ""))
    return "; ".join(out)


def reproductions_at_the_unit(trivial, variants: dict, setup: str) -> tuple[list, dict]:
    """(one Reproduction per variant, {variant: its calls against uniform}): the one rule's calls of the variant
    against uniform sampling at the unit, a text (:func:`kvbounds.proofs_checks.bkv_trivial.trivial_power`), one per
    memory setting T; reproduced / partial / reversed by :func:`kvbounds.verdict.reproduction_status` over those
    settings; a miss is not-shown (underpowered) when a setting's call is not attainable with its units."""
    from kvbounds.verdict import Reproduction, reproduction_status
    reps, by = [], {}
    for m, label in variants.items():
        calls = [c for c in (trivial.calls if trivial else []) if c["control"] == "uniform"
                 and c["family"].split(" | ")[1:2] == [label] and c["call"] != "not tested"]
        if not calls:
            continue
        by[m] = calls
        b, w = sum(c["call"] == "better" for c in calls), sum(c["call"] == "worse" for c in calls)
        short = [c for c in calls if c["call"] == "not attainable"]
        status = reproduction_status(b, w, len(calls), kind="test", powered=not short)
        units = sorted({c["n"] for c in calls})
        reps.append(Reproduction(m, status, setup, f"{LABELS.get(m, m)}: better than uniform in {b}/{len(calls)} "
                                 f"memory settings, worse in {w} (the one rule at the unit, a text: "
                                 f"{'/'.join(map(str, units))} texts)",
                                 bound_note=(f"underpowered: not attainable with {short[0]['n']} unit(s) "
                                             f"(smallest p = {short[0]['smallest_p']:.2g})" if short else "")))
    return reps, by


def kernel_thinning_text(kt, records) -> str:
    """Kernel thinning's error against uniform sampling's and the released walk's (t = 1), cell by cell."""
    rel = {(r.params["trace"], r.params["T"]): r.measured for r in records if r.check == "error released-t1"}
    to_rel = [r.measured / rel[(r.params["trace"], r.params["T"])] for r in kt if (r.params["trace"], r.params["T"]) in rel]
    text = (f"kernel thinning (goodpoints, one seed): below uniform in {sum(r.holds for r in kt)}/{len(kt)} cells, "
            f"ratio to uniform {min(r.ratio for r in kt):.3g}..{max(r.ratio for r in kt):.3g}")
    return text + (f", to the released walk (t = 1) {min(to_rel):.3g}..{max(to_rel):.3g}" if to_rel else "")


def summarize(records) -> Verdict:
    cells = "cells"          # no cell record names a sweep: the windows' records (walk_share.SWEEP) stay out
    figs = [FigureSpec("relative error vs compression level T (each method; bound = uniform)", x="T", hue="check",
                       logx=False, sweep=cells),
            FigureSpec("error / uniform's error vs T, per BalanceKV variant", x="T", hue="check", y="ratio",
                       show_bound=False, logx=False, sweep=cells),
            FigureSpec("BalanceKV (pseudocode) relative error vs T, per layer", x="T", check="error balance",
                       hue="trace", logx=False, sweep=cells)]
    if not records:
        return Verdict(CLAIM, NOT_RUN, "no records", figures=figs)
    share = [r for r in records if r.check == walk_share.CHECK]
    records = [r for r in records if r.check != walk_share.CHECK]
    findings, parts = list(version_findings(CLAIM)), []
    parts += fallback_notes(records)
    setup = setup_text(records)
    labels = {m: SHORT[m].replace("the ", "", 1) for m in BKV_VARIANTS}
    trivial = trivial_power(CLAIM, records, labels, ABLATIONS)
    reps, calls_by_variant = reproductions_at_the_unit(trivial, labels, setup)
    for m in BKV_VARIANTS:
        cells = variant_cells(records, m)
        if not cells:
            continue
        ratios = [c["record"].ratio for c in cells]
        parts.append(f"{m}: below uniform in {sum(c['record'].holds for c in cells)}/{len(cells)} (text, layer, T) "
                     f"cells (each the mean over its seeds); ratio to uniform {min(ratios):.3g}..{max(ratios):.3g} "
                     f"(median {np.median(ratios):.3g})")
    for m in BKV_VARIANTS:
        cells = variant_cells(records, m)
        if len(cells) and all(c["record"].extra["stats"]["std"] == 0 and c["record"].trials > 1 for c in cells):
            parts.append(f"{m} is deterministic here (every p clipped to 0 or 1: the same selection for every seed)")
    coin = [r for r in records if r.check == "error balance" and r.extra.get("walk_is_coin")]
    if coin:
        parts.append(f"pseudocode walk: max mean |p - 1/2| = {max(r.extra['walk_max_abs_p_dev'] for r in coin):.2g} "
                     f"in {len(coin)} cells: {COIN_NOTE}")
    for m in sorted({r.extra.get("method") for r in records} - set(METHODS) - {CONTROL, None}):
        rs = {(r.params["trace"], r.params["T"]): r.measured for r in records if r.extra.get("method") == m}
        best = [r for r in records if r.check == "error released-t0.1"]
        wins = sum(1 for r in best if (r.params["trace"], r.params["T"]) in rs and r.measured < rs[(r.params["trace"], r.params["T"])])
        parts.append(f"released-t0.1 below {m} in {wins}/{len(rs)}")
    cause_parts, cause_finding = walk_cause.blockwise_text(records, BKV_VARIANTS, SHORT,
                                                           lambda r: f"layer {r.extra.get('layer', '?')}")
    parts += cause_parts
    findings += [cause_finding] if cause_finding else []
    share_words = walk_share.share_text(share)
    if share_words:
        parts.append(share_words)
        findings.append(Finding(CLAIM, "the released walk's win over its ablation: the walk's share and the "
                                "estimator's, on independent text windows", share_words, {}, kind="finding"))
    kt = [r for r in records if r.check == "error kernel_thinning"]
    parts.append(kernel_thinning_text(kt, records) if kt else
                 "kernel thinning: not recorded (goodpoints not installed: pip install 'kvbounds[kt]')")
    ctl = [r for r in records if r.control]
    power = "n/a"
    if ctl:
        rej = sum(not r.holds for r in ctl)
        parts.append(f"negative control (2^T weights dropped) rejected {rej}/{len(ctl)}")
        power = "shown" if rej == len(ctl) else "low"
        if rej < len(ctl):
            c = next(r for r in ctl if r.holds)
            findings.append(Finding(CLAIM, "negative control not rejected",
                                    "BalanceKV without its 2^T weights was below uniform sampling: the comparison "
                                    "cannot tell a broken estimator apart here", c.params, kind="erratum"))
    parts.append(f"against doing nothing ({CAVEAT}): " + trivial.detail if trivial else
                 "trivial controls (zeros, mean of values, recent window): not recorded (records from before issue 20)")
    if trivial and trivial.power != "n/a":
        power = "low" if "low" in (power, trivial.power) else "shown"
    text = per_variant_text(reps, records, calls_by_variant)
    main = [r for r in records if r.check == "error balance"]
    ratios = [r.measured / r.bound for r in main]
    v = Verdict(CLAIM, "", text + "; " + "; ".join(parts), findings=findings, figures=figs,
                n_records=len(records) + len(share),
                constant=float(max(ratios)) if ratios else None,
                constant_spread=(float(min(ratios)), float(np.median(ratios))) if ratios else None,
                constant_kind="fitted", reproductions=reps, reproduction=combine(reps), power=power,
                power_detail=f"negative control rejected {sum(not r.holds for r in ctl)}/{len(ctl)}" if ctl else "")
    if trivial:
        v.power_note, v.power_table, v.power_calls = trivial.note, trivial.table(), trivial.calls
    return finish(v, text)

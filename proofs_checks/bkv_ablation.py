"""BKV.ablation: BalanceKV's error falls and its runtime rises as the batch (block) size grows (001 Fig. 3).

The single-layer experiment of :mod:`kvbounds.proofs_checks.bkv_vs_uniform` (001 App. B.1: first ``sink`` and last
``window`` tokens exact, the middle compressed by 2^-T with blockwise BalanceKV) on real SmolLM2 layers
(the paper: Llama-3.1-8B layers 1 and 15), for batch sizes b in {64, 128, 256} and 2^-T in {1/2, 1/4, 1/8},
10 seeds of the compression randomness per cell. Measured per (layer, T, b): the mean relative error over
the last ``window`` queries and heads, and the median wall time of one ``compress_cache`` call (all heads
of the layer at once, numpy backend).

Records (one trial = one layer and one T, all b inside):
  * ``error``    measured = mean error at b, bound = mean error at the next smaller b (b = 64: itself);
                 holds = measured <= bound  (the claim: error falls as b grows).
  * ``runtime``  measured = median seconds at b, bound = median seconds at the next smaller b;
                 holds = measured >= bound  (the claim: runtime rises as b grows; extra["direction"] says so).
``bound_kind="exact"``: an inequality between two measurements, no formula. The verdict reports both
trends, the size of the error change and whether it exceeds the seed-to-seed spread.
"""
from __future__ import annotations

import numpy as np

from kvbounds.verdict import FAILS, HOLDS, NOT_RUN, FigureSpec, Finding, Verdict
from kvbounds.theory.empirical import mean_and_spread
from kvbounds.gpu.backend import single_blas_thread
from kvbounds.traces.real import layer_heads, real_or_synthetic_spec

from .bkv_vs_uniform import run_experiment
from .common import fallback_notes, make_record, pick

CLAIM = "BKV.ablation"
SOURCE = "001 Sec. 4.1, Fig. 3, App. B.1"


def trials(profile: str) -> list[dict]:
    model = pick(profile, smoke="minilm", quick="smollm2", full="smollm2")
    n = pick(profile, smoke=512, quick=2048, full=4096)
    layers = pick(profile, smoke=[1], quick=[1, 15], full=[1, 15])
    sink = pick(profile, smoke=32, quick=128, full=256)
    Ts = pick(profile, smoke=[1], quick=[1, 3], full=[1, 2, 3])
    sizes = pick(profile, smoke=[32, 64], quick=[64, 128, 256], full=[64, 128, 256])
    seeds = pick(profile, smoke=3, quick=10, full=10)
    out = []
    for l in layers:
        spec, why = real_or_synthetic_spec(f"{model}:L{l}:{n}", kind="gaussian")
        out += [dict(trace=spec, T=T, sink=sink, window=sink, block_sizes=sizes, seeds=seeds, fallback=why or "")
                for T in Ts]
    return out


@single_blas_thread()
def run_trial(params: dict, seed: int, backend: str):
    Q, K, V, meta = layer_heads(params["trace"])
    seeds = [int(s.generate_state(1)[0]) for s in np.random.SeedSequence(seed).spawn(params["seeds"])]
    rows = []
    for b in params["block_sizes"]:
        res = run_experiment(Q, K, V, T=params["T"], sink=params["sink"], window=params["window"], block_size=b,
                             seeds=seeds, causal=meta["causal"], methods=("balance",))
        rows.append((b, np.asarray(res["errors"]["balance"]), np.asarray(res["balance_times"])))
    recs = []
    common = dict(n=int(K.shape[1]), heads=int(K.shape[0]), model=meta["model"], fallback=params.get("fallback", ""),
                  layer=meta.get("layer", -1))
    for i, (b, err, tm) in enumerate(rows):
        pb, perr, ptm = rows[max(i - 1, 0)]
        p = dict(params, block_size=b)
        recs.append(make_record(CLAIM, p, measured=err.mean(), bound=perr.mean(), holds=bool(err.mean() <= perr.mean()),
                                bound_kind="exact", check="error", source=SOURCE + " (bound = error at the next smaller b)",
                                trials=len(err), stats=mean_and_spread(err), previous_block=pb, **common))
        recs.append(make_record(CLAIM, p, measured=float(np.median(tm)), bound=float(np.median(ptm)),
                                holds=bool(np.median(tm) >= np.median(ptm)), bound_kind="exact", check="runtime",
                                source=SOURCE + " (bound = runtime at the next smaller b)", trials=len(tm),
                                direction="holds when measured >= bound (runtime rises)", times=tm.tolist(),
                                previous_block=pb, **common))
    return recs


def summarize(records) -> Verdict:
    figs = [FigureSpec("BalanceKV relative error vs batch size (hue T)", x="block_size", check="error", hue="T",
                       show_bound=False),
            FigureSpec("BalanceKV compression time (s) vs batch size (hue T)", x="block_size", check="runtime", hue="T",
                       show_bound=False)]
    if not records:
        return Verdict(CLAIM, NOT_RUN, "no records", figures=figs)
    parts, findings = [], []
    parts += fallback_notes(records)
    status = HOLDS
    for check, word in (("error", "falls"), ("runtime", "rises")):
        rs = [r for r in records if r.check == check]
        cells: dict = {}
        for r in rs:
            cells.setdefault((r.params["trace"], r.params["T"]), []).append(r)
        steps = [r for r in rs if r.extra["previous_block"] != r.params["block_size"]]
        ok = [r for r in steps if r.holds]
        ends = []
        for key, cr in cells.items():
            cr = sorted(cr, key=lambda r: r.params["block_size"])
            ends.append(cr[-1].measured / cr[0].measured)
        parts.append(f"{check} {word} with batch size in {len(ok)}/{len(steps)} doubling steps; "
                     f"{check}(b_max)/{check}(b_min) = {min(ends):.3g}..{max(ends):.3g}")
        if check == "error":
            noise = [abs(r.measured - r.bound) / max(r.extra["stats"]["std"], 1e-300) for r in steps]
            if noise:
                parts.append(f"error change per doubling / seed std: median {np.median(noise):.2g}")
        if len(ok) < len(steps):
            status = FAILS
            bad = [r for r in steps if not r.holds]
            r = min(bad, key=lambda r: (r.params["block_size"], r.params["T"]))
            findings.append(Finding(CLAIM, f"{check} does not {word.rstrip('s')} with batch size in {len(bad)}/{len(steps)} steps",
                                    f"{r.params['trace']}, T = {r.params['T']}: b {r.extra['previous_block']} -> "
                                    f"{r.params['block_size']}: {check} {r.bound:.4g} -> {r.measured:.4g}"
                                    + (f" (a change of {abs(r.measured - r.bound) / max(r.extra['stats']['std'], 1e-300):.2g} "
                                       f"seed standard deviations)" if check == "error" else ""), r.params))
    return Verdict(CLAIM, status, "; ".join(parts), findings=findings, figures=figs, n_records=len(records))

"""Compression next to the prefill in the end-to-end harness (issue 26; claims BKV.e2e, SG.e2e). A script.

SmolLM2-135M on the CPU (:func:`kvbounds.e2e._model.load_smollm2`), the first n tokens of the harness's text (the
``ppl`` task's window 0), n = 512 and 2048 (--quick: 512). Per n, timed in interleaved repetitions
(_harness.paired: one warm-up each, the order rotating every repetition, medians of >= 5 repetitions):

* ``prefill``: :func:`kvbounds.e2e._harness.prefill`, the exact prefill of the window (every layer's K, V and the
  attention inputs kvpress reads): the baseline;
* ``prefill collecting H2O's scores``: the same prefill with ``received=True`` (the attention each key receives,
  collected while it runs, :func:`kvbounds.e2e._h2o.received_attention`);
* ``<method>``: :func:`kvbounds.e2e._methods.compress_all` on that prefill, every layer (30), host path (what
  the checks' records time), at the budget where blockwise BalanceKV keeps n_mid / 4 (T = 2, the harness's larger
  budget), sink = window = 32; kvbounds's methods and kvpress's scorers alike. H2O compresses the prefill that
  collected its scores (its top-k only); ``h2o+scores`` adds the prefill's extra time for them (paired medians).

Each row's ratio is the median of the paired per-repetition ratios compress / prefill. Target (issue 26): every
kvbounds method <= 0.05 at n = 512 and 2048. Clock: the process's CPU time (all threads; what the harness's
``compress_s`` and ``prefill_s`` measure, robust to other load on the machine), wall time alongside. Thread counts
fixed (threadpoolctl and torch): 1 and 2 (--threads).

Usage: python benchmarks/bench_e2e_compression.py [--quick] [--reps R] [--threads 1,2] [--out PATH]
Writes JSON to benchmarks/results/bench_e2e_compression.json (--quick: bench_e2e_compression_quick.json).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for p in (str(ROOT), str(ROOT / "benchmarks")):
    if p not in sys.path:
        sys.path.insert(0, p)

from _harness import fmt_ratio, load, meta, output_path, paired, target, threads, write  # noqa: E402

TARGET = 0.05
SCORES = "prefill collecting H2O's scores"
SINK = WINDOW = 32
LEVELS = 2
# Where the time goes when a method misses the target (profiled at 1 thread, n = 512 and 2048; issue 26). Printed and
# written beside a target that is NOT met.
SHORTFALL = {
    "kcenter": "the exact greedy k-center traversal: k sequential farthest-point steps (k = 144 of 480 keys at "
               "n = 512, 530 of 2016 at 2048), each a float32 GEMV over every point of every layer and head (46 MB "
               "at 2048): 1.1-1.3 s, nearly all of its time, at n = 2048 and ~0.07 s of 0.09-0.13 s at 512 (1 "
               "thread). Skipping the points a new centre cannot take does not pay on SmolLM2's keys (64-d, flat "
               "spectrum: a head's top 16 principal directions hold ~66% of its variance): Elkan's test "
               "||c - c_a|| >= 2 sqrt(m_i) leaves 41-93% of the points candidates while 0.2-7% move; a bound "
               "projected on the top 32 directions leaves 1-11% but its own pass reads half the GEMV's bytes "
               "(exact, measured 2.7-3.5 s against 0.9-1.25 s dense at n = 2048; issue 26). Its share of the prefill "
               "grows with n: k is a fixed fraction of n, so the traversal is k n d ~ n^2 d / 4 per head, quadratic "
               "like attention, but as k sequential matrix-vector products (memory-bound) where the prefill's "
               "attention is matrix-matrix",
    "kcenter_sized": "as kcenter: one traversal per layer, shared by the equal-memory rounds (kcenter.FarthestFirst; "
                     "k ~ 140 of 480 keys at n = 512), about half to two thirds of its time at 512 and nearly all "
                     "of it at 2048; the rest one KCenter cache per layer (selection, checks, memory_floats)",
    "subgen": "at n = 512 about half its time is the k-center traversal of the 90 heads' middles (k = 110 of 448 keys, "
              "~0.07-0.09 s), the rest ~3 counted rounds per layer (~0.5 ms each: the l2 draws of 3 heads) and the "
              "kept cache's build (~1.5 ms per layer); issue 26 removed the draws' checks of p, the rounds' "
              "recomputed value norms and a second check of the inputs (0.11 -> 0.08 of the prefill on a loaded "
              "machine, the same caches). At n = 2048 the traversal (k = 490 of 1984 keys, ~1.1 s of ~1.4 s) as "
              "kcenter's",
    "subspace": "two float64 64 x 64 eigendecompositions per head: 180 LAPACK syevd calls (numpy's eigh on the stacked "
                "heads; torch.linalg.eigh costs the same), ~0.07 s at 1 thread on a quiet machine, plus the float64 "
                "Grams and projections (~0.04 s) and the float64 copies of the middle (~0.013 s) at n = 512: ~0.12 s "
                "of LAPACK/BLAS, ~0.047 of the prefill, is the floor. The rest (concatenations, float32 temporaries, "
                "30 layers' re-validation, ~0.03 s) was removed (issue 26, same caches bit for bit); a per-matrix "
                "scipy dsyevd (another LAPACK build) measured 0.7x the eigh time but changes the last bits",
    "kernel_thinning": "goodpoints' kt.thin_K needs each head's n_mid x n_mid float64 kernel matrix (448^2 at n = 512, "
                       "1984^2 at n = 2048; 90 heads): its own split and swap (Cython) cost ~0.07 s at n = 512 "
                       "(~3% of the prefill by themselves); our side builds the matrices: two syrk Grams (~0.07 s) "
                       "and the float64 exp of the upper triangle (~10^5 per head at ~10 ns each: numpy has no SIMD "
                       "float64 exp on this CPU), ~0.25-0.35 s in all. Issue 26 halved the exponentials (exact "
                       "symmetry) and reused one scratch pair (page faults): ~0.8x the matrix time, same matrices bit "
                       "for bit. float32 would be ~6x cheaper but changes the matrix goodpoints thins",
    "balancekv": "at the line (0.042-0.052 over runs on a loaded machine): the stacked walk's sequential steps per "
                 "level and the Gram panels of every layer's blocks (issue 26's earlier stacking; unchanged here)",
    "balancekv_released": "the released walk's float32 b x b kernel per block (990 blocks at n = 512): two gemm Grams "
                          "per level (~0.045 s at 1 thread; numpy's symmetric syrk would halve them but changes the "
                          "last bits, so the walk would no longer be the one it computed), their exp and products "
                          "(~0.03 s), the b = 64 sequential steps per level over every layer's blocks (~0.02 s) and "
                          "the gathers (~0.02 s). Issue 26 removed the rest (transposed copies, temporaries, a "
                          "level-1 gather, K and V checked three times, 30 per-layer gathers): ~0.8x, bit for bit; "
                          "a layer whose kernel overflows float32 (n >= ~1024) is redone in float64",
    "h2o": "H2O's scores (the attention each key receives from the prompt's queries) are collected during the "
           "prefill (harness.prefill(received=True)): its compression is the top-k and the gather only",
    "h2o+scores": "the scores cost one more causal attention pass per layer: the n x n / 2 logits of 9 query heads, "
                  "their softmax and column sums. Issue 26: a KV group's queries interleaved token by token, so a "
                  "block of 48 tokens is one contiguous product with the keys (no per-block copy of the keys), "
                  "~0.75-0.8x the previous pass (paired, 1 thread, n = 512 and 2048; scores within 2e-6, H2O's "
                  "indices identical; inside the real prefill, loaded machine: 0.137 -> 0.107 of the prefill at n = 512, "
                  "0.375 -> 0.258 at n = 2048). SDPA does not return its logits, so they are computed again, and the "
                  "pass is quadratic in n while the prefill's projections are linear: its share grows with n. Next "
                  "step: the "
                  "CPU flash kernel's log-sum-exp (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu, the "
                  "same output as SDPA's, checked) would leave a product, an exp and the column sums per block",
}


def bench(lm, n: int, reps: int, clock: str) -> dict:
    from kvbounds.e2e import _harness as harness
    from kvbounds.e2e import _tasks as tasks
    from kvbounds.e2e import _methods as M
    task = tasks.ppl_task(lm, n, 2, 0)
    budget = M.balance_budgets(n, WINDOW, levels=(LEVELS,))[0]
    missing = M.kvpress_available()
    methods = list(M.OURS) + ([] if missing else [f"kvpress:{p}" for p in ("knorm", "snapkv", "expected_attention",
                                                                             "streaming_llm")])
    state = {}

    def prefill():
        state["p"] = harness.prefill(lm, task.context, capture_inputs=True)

    def prefill_scores():          # the same prefill collecting the attention each key receives (H2O's scores)
        state["ps"] = harness.prefill(lm, task.context, capture_inputs=True, received=True)

    def compress(i, m):
        key = "ps" if m in M.NEEDS_SCORES else "p"
        return lambda: M.compress_all(m, lm, state[key], budget, np.random.default_rng([0, i]), sink=SINK,
                                      window=WINDOW, where="host")
    prefill()
    prefill_scores()
    fns = {"prefill": prefill, SCORES: prefill_scores}
    fns.update({m: compress(i, m) for i, m in enumerate(methods)})
    main = paired(fns, baseline="prefill", reps=reps, clock=clock)
    w = lambda m, f: main[m].get(f"wall_{f}", main[m][f])        # clock="wall": the main figures are wall
    rows = [dict(method=m, source=M.source(m), seconds=main[m]["time"]["median"], ratio=main[m]["ratio"],
                 wall_seconds=w(m, "time")["median"], wall_ratio=w(m, "ratio")) for m in methods]
    extra = main[SCORES]["ratio"]["median"] - 1.0
    for row in rows:               # H2O with the prefill's extra time for its scores counted as its own
        if row["method"] in M.NEEDS_SCORES:
            rows.append(dict(row, method=f"{row['method']}+scores", ratio=dict(median=row["ratio"]["median"] + extra),
                             wall_ratio=dict(median=w(row["method"], "ratio")["median"]
                                             + w(SCORES, "ratio")["median"] - 1.0),
                             note="compress + (prefill collecting the scores - prefill), over the prefill"))
            break
    return dict(n=n, budget=budget, levels=LEVELS, sink=SINK, window=WINDOW, reps=reps, clock=clock,
                interleaving="paired: one warm-up each, order rotating every repetition; CPU and wall time of "
                             "the same calls",
                baseline="prefill (exact, every layer, kvpress's inputs captured)",
                prefill_s=main["prefill"]["time"]["median"], prefill_wall_s=w("prefill", "time")["median"],
                prefill_scores_s=main[SCORES]["time"]["median"], prefill_scores_ratio=main[SCORES]["ratio"],
                rows=rows, kvpress=missing or "kvpress installed", load=main["load"])


def report(r: dict, nthreads: int) -> list:
    print(f"n = {r['n']}, {nthreads} thread(s), budget {r['budget']:.3f} (BalanceKV T = {r['levels']}), "
          f"{r['reps']} interleaved reps; baseline prefill {r['prefill_s']:.3f} s CPU ({r['prefill_wall_s']:.3f} s "
          f"wall); load {r['load']}")
    print(f"  prefill collecting H2O's scores: {r['prefill_scores_s']:.3f} s CPU, "
          f"{fmt_ratio(r['prefill_scores_ratio'])} x the prefill")
    print(f"  {'method':<28} {'CPU s':>8} {'/prefill [q25-q75]':>24} {'wall s':>8} {'wall /prefill':>24}")
    for row in r["rows"]:
        if "note" in row:
            print(f"  {row['method']:<28} {'':>8} {row['ratio']['median']:>24.3f} {'':>8} "
                  f"{row['wall_ratio']['median']:>24.3f}  ({row['note']})")
            continue
        print(f"  {row['method']:<28} {row['seconds']:8.4f} {fmt_ratio(row['ratio']):>24} {row['wall_seconds']:8.4f} "
              f"{fmt_ratio(row['wall_ratio']):>24}")
    out = []
    for row in r["rows"]:
        if row["source"] != "kvbounds":
            continue
        met = row["ratio"]["median"] <= TARGET
        out.append(target(f"{row['method']} compress / prefill, n = {r['n']}, {nthreads} thread(s)",
                          row["ratio"]["median"], "<=", TARGET, row["ratio"] if "q25" in row["ratio"] else None,
                          note="" if met else SHORTFALL.get(row["method"], "")))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="n = 512 only")
    ap.add_argument("--n", default=None, help="comma-separated window lengths (default 512,2048; --quick 512)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--clock", default="process", choices=("process", "wall"))
    ap.add_argument("--out", type=output_path, default=None)
    a = ap.parse_args(argv)
    from kvbounds.e2e._checks import hf_missing
    missing = hf_missing()
    if missing:
        print(f"skipped: {missing}")
        return 0
    import torch  # noqa: F401 (threads() sets torch's pool once it is imported)
    from kvbounds.e2e._model import load_smollm2
    lm = load_smollm2("cpu")
    ns = [int(x) for x in (a.n or ("512" if a.quick else "512,2048")).split(",")]
    out = dict(meta=meta(), target=f"every kvbounds method's compress_all <= {TARGET} x the exact prefill",
               runs=[], targets=[])
    for nt in (int(x) for x in a.threads.split(",")):
        for n in ns:
            with threads(nt):
                r = bench(lm, n, a.reps, a.clock)
            r["threads"] = nt
            out["runs"].append(r)
            out["targets"] += report(r, nt)
    out["load_end"] = load()
    write("bench_e2e_compression", a.quick, out, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""SubGen against what a user would pick instead: one exact decode step (issue 13; claims SG.attention). A script.

(a) Speed. A clusterable stream (make_trace "clustered": m = 32 clusters of keys, d = 64, Gaussian values) is
    decoded token by token with :class:`kvbounds.algorithms.subgen.SubGen` (SubGen Alg. 1: update, then the query of
    that step; delta = 0.5, t = 32, s = 256), one thread, numpy float64, against one exact decode step over the j
    cached tokens written in _harness.py (:func:`exact_decode_step` with scale 1, the paper's convention softmax(K q)^T V). The stream
    runs in chunks of 256 tokens, each followed by a timed exact step at the current length: each chunk gives a
    paired ratio (the thread's CPU time; wall-clock ratios alongside, see _harness.stream_vs_exact). At n = 2^12,
    2^14 (2^16 in the full run): the amortised (mean) per-token cost over (n/2, n], the exact step's time, the
    median of the paired ratios and their spread; and the memory ratio.
    Target: <= 0.1x at 2^14.
(b) Accuracy on a stream where the metric means something: a real SmolLM2 trace (kvbounds.traces.real, if cached;
    else the clustered stream), SubGen with exp(<q,k>/sqrt d) (``scaled=True``, the model's own attention) and
    delta = a quarter of the largest key norm. At sampled steps: the relative error ||z - Attn|| / ||Attn||, the
    error in SG.attention's units ||z - Attn|| / (||softmax||_2 ||V||_op), and the all-zero estimator's error
    in the same units (the yardstick).

Usage: python benchmarks/bench_subgen.py [--quick] [--out PATH]
Writes JSON to benchmarks/results/bench_subgen.json (--quick: bench_subgen_quick.json).
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

from _harness import (accuracy_stream, exact_decode_step, load, meta, output_path, print_stream,  # noqa: E402
                      stream_accuracy, stream_pairing, stream_vs_exact, target, thread_counts,
                      threads, write)

from kvbounds.algorithms.subgen import SubGen  # noqa: E402
from kvbounds.traces.synthetic import make_trace  # noqa: E402

TARGET_STREAM = 0.1


def bench_speed(quick: bool) -> dict:
    exps = {"smoke": [8, 9], "quick": [10, 12]}.get(quick, [12, 14, 16])
    n_max = 2 ** exps[-1]
    d, m, delta, t, s = 64, 32, 0.5, 32, 256
    tr = make_trace("clustered", n=n_max, d=d, seed=0, m=m, r=1.0, spread=0.05)
    sg = SubGen(d, delta=delta, s=s, t=t, seed=1)
    rows = stream_vs_exact(sg, tr.K, tr.V, tr.Q, lambda q, K, V: exact_decode_step(q, K, V, scale=1.0), exps)
    for r in rows:
        r["exact_floats"] = r["n"] * 2 * d
    rows[-1]["subgen_floats"] = sg.memory_floats()
    return dict(d=d, m=m, delta=delta, t=t, s=s, clusters=sg.num_clusters(), rows=rows, load=load())


def bench_accuracy(quick: bool) -> dict:
    n = {"smoke": 128, "quick": 512}.get(quick, 2048)
    tr = accuracy_stream(n)
    delta = 0.25 * float(np.linalg.norm(tr.K, axis=1).max())
    sg = SubGen(tr.K.shape[1], delta=delta, s=256, t=32, seed=1, scaled=True)
    return dict(stream_accuracy(sg, tr, v_norm="2"), delta=delta, clusters=sg.num_clusters())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="n up to 2^12 (a short run)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, seconds (for the tests)")
    ap.add_argument("--out", type=output_path, default=None, help="JSON output path")
    args = ap.parse_args(argv)
    args.quick = "smoke" if args.smoke else ("quick" if args.quick else False)
    print(f"load before: {load()}")
    with threads(1):
        sp = bench_speed(args.quick)
        acc = bench_accuracy(args.quick)
        pools = thread_counts()
    print(f"(a) SubGen (delta = {sp['delta']}, t = {sp['t']}, s = {sp['s']}; {sp['clusters']} clusters) update + query "
          f"per token vs one exact decode step, clustered stream d = {sp['d']}, numpy float64, 1 thread")
    print_stream(sp["rows"])
    last = sp["rows"][-1]
    print(f"  memory at n = {last['n']}: SubGen {last['subgen_floats']} floats, exact cache {last['exact_floats']} "
          f"({last['subgen_floats'] / last['exact_floats']:.3f}x)")
    row = next(r for r in sp["rows"] if r["n"] == 2 ** 14) if not args.quick else sp["rows"][-1]
    n_t = row["n"]
    targets = [target(f"streaming SubGen / exact decode step at n = {n_t}", row["ratio"]["median"], "<=", TARGET_STREAM,
                      row["ratio"], note=f"{args.quick} run: n = {n_t}, not the target's 2^14" if args.quick else "")]
    print(f"(b) accuracy on {acc['trace']} (n = {acc['n']}, delta = {acc['delta']:.3g}, {acc['clusters']} clusters): "
          f"median relative error {acc['relative_error_median']:.3g}; SG.attention units (||softmax|| ||V||_op): "
          f"{acc['paper_units_median']:.3g}, the all-zero estimator {acc['zero_estimator_paper_units_median']:.3g}")
    info = meta(quick=args.quick, threads=1, thread_counts=pools, clock="thread CPU time", **stream_pairing())
    write("bench_subgen", args.quick, dict(meta=info, speed=sp, accuracy=acc,
                                           targets=targets), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

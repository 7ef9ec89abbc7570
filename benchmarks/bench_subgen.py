"""SubGen streaming throughput and memory vs exact attention (a script, not a test).

One clusterable stream (make_trace "clustered": m = 32 clusters of keys, d = 64, Gaussian values) is decoded
token by token with :class:`kvbounds.algorithms.subgen.SubGen` (002 Alg. 1: update, then the query of that step).
At n = 2^12 .. 2^17 the table reports SubGen's per-token time (mean over the steps in (n/2, n]), its
throughput and the floats it holds, next to exact attention's per-token decode cost at the same steps
(softmax(K_j q_j) V_j over the j cached tokens, the KV cache preallocated) and its cache size, and the
ratios. Exact attention is timed on a subsample of the steps in (n/2, n] (``--exact-samples`` per
checkpoint, default 64): decoding every step exactly would cost O(n^2 d) (hours at 2^17 on 2 cores).
SubGen's per-token cost should be flat in n; exact attention's grows linearly (log-log slopes printed).

Usage: python benchmarks/bench_subgen.py [--quick] [--out PATH] [--backend numpy|torch:cpu] [--exact-samples N]
Writes JSON to benchmarks/results/bench_subgen.json (--quick: bench_subgen_quick.json, n = 2^9 .. 2^11).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kvbounds.algorithms.subgen import SubGen  # noqa: E402
from kvbounds.gpu.backend import array_namespace, asarray  # noqa: E402
from kvbounds.traces.synthetic import make_trace  # noqa: E402


def exact_step(xp, K, V, j, q):
    """One exact decode step over the first j cached tokens (paper convention, no 1/sqrt(d))."""
    logits = xp.matmul(K[:j], q)
    w = xp.exp(logits - xp.max(logits))
    return xp.matmul(w / xp.sum(w), V[:j])


def run(quick: bool, backend: str, exact_samples: int) -> dict:
    logs = list(range(9, 12)) if quick else list(range(12, 18))
    N = 2 ** logs[-1]
    d, m, delta, t, s = (16, 8, 0.5, 16, 64) if quick else (64, 32, 0.5, 32, 256)
    tr = make_trace("clustered", n=N, d=d, seed=0, m=m, r=1.0, spread=0.05)
    K, V, Q = (asarray(x, backend) for x in (tr.K, tr.V, tr.Q))
    xp = array_namespace(K)
    sg = SubGen(d, delta=delta, s=s, t=t, seed=1)
    step = np.zeros(N)
    checkpoints = {2**k for k in logs}
    memory, clusters = {}, {}
    for j in range(N):
        t0 = time.perf_counter()
        sg.update(K[j], V[j])
        sg.query(Q[j])
        step[j] = time.perf_counter() - t0
        if j + 1 in checkpoints:
            memory[j + 1], clusters[j + 1] = sg.memory_floats(), sg.num_clusters()
    rng = np.random.default_rng(2)
    rows = []
    for k in logs:
        n = 2**k
        js = np.unique(rng.integers(n // 2 + 1, n + 1, exact_samples))
        ex = []
        for j in js:
            t0 = time.perf_counter()
            exact_step(xp, K, V, int(j), Q[int(j) - 1])
            ex.append(time.perf_counter() - t0)
        sub_us = float(step[n // 2: n].mean() * 1e6)
        ex_us = float(np.mean(ex) * 1e6)
        exact_floats = n * (d + V.shape[1])
        rows.append(dict(n=n, subgen_us_per_token=sub_us, subgen_tokens_per_s=1e6 / sub_us,
                         exact_us_per_token=ex_us, exact_tokens_per_s=1e6 / ex_us, exact_steps_timed=int(len(js)),
                         time_ratio=sub_us / ex_us, subgen_floats=int(memory[n]), exact_floats=int(exact_floats),
                         memory_ratio=memory[n] / exact_floats, clusters=int(clusters[n])))
    ns = [r["n"] for r in rows]
    slope = lambda key: float(np.polyfit(np.log(ns), np.log([r[key] for r in rows]), 1)[0])
    return dict(params=dict(d=d, m=m, delta=delta, t=t, s=s, backend=backend, trace="clustered", spread=0.05,
                            exact_samples_per_checkpoint=exact_samples),
                rows=rows, slopes=dict(subgen_per_token=slope("subgen_us_per_token"),
                                       exact_per_token=slope("exact_us_per_token")))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="n = 2^9 .. 2^11, d = 16 (smoke test, seconds)")
    ap.add_argument("--out", type=Path, default=None, help="JSON output path")
    ap.add_argument("--backend", default="numpy", help="numpy (float64, default) or torch:cpu")
    ap.add_argument("--exact-samples", type=int, default=64, help="exact-attention steps timed per checkpoint")
    args = ap.parse_args(argv)
    out = args.out or ROOT / "benchmarks" / "results" / ("bench_subgen_quick.json" if args.quick else "bench_subgen.json")
    t0 = time.perf_counter()
    res = run(args.quick, args.backend, args.exact_samples)
    res["meta"] = dict(python=platform.python_version(), numpy=np.__version__, machine=platform.machine(),
                       cpus=os.cpu_count(), wall_s=time.perf_counter() - t0, quick=args.quick)
    p = res["params"]
    print(f"SubGen streaming decode (update + query per token) vs exact attention, clustered stream: d = {p['d']}, "
          f"m = {p['m']} clusters, delta = {p['delta']}, t = {p['t']}, s = {p['s']}, backend {p['backend']}")
    print(f"exact attention timed on {p['exact_samples_per_checkpoint']} sampled steps in (n/2, n] per row; SubGen on every step")
    head = f"{'n':>7} {'SubGen us/tok':>13} {'tokens/s':>9} {'exact us/tok':>12} {'tokens/s':>9} {'time ratio':>10} " \
           f"{'SubGen floats':>13} {'exact floats':>12} {'mem ratio':>9} {'clusters':>8}"
    print(head)
    for r in res["rows"]:
        print(f"{r['n']:>7} {r['subgen_us_per_token']:>13.1f} {r['subgen_tokens_per_s']:>9.0f} {r['exact_us_per_token']:>12.1f} "
              f"{r['exact_tokens_per_s']:>9.0f} {r['time_ratio']:>10.3f} {r['subgen_floats']:>13} {r['exact_floats']:>12} "
              f"{r['memory_ratio']:>9.4f} {r['clusters']:>8}")
    sl = res["slopes"]
    print(f"log-log slope of per-token time in n: SubGen {sl['subgen_per_token']:+.2f} (flat = 0), "
          f"exact attention {sl['exact_per_token']:+.2f} (linear = 1)")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

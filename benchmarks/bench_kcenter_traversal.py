"""Greedy k-center's farthest-first traversal on the end-to-end harness's real keys (issue 26; claims SG.e2e,
SG.clusterability). A script.

SmolLM2-135M on the CPU, the first n tokens of the ``ppl`` task's window 0 (as bench_e2e_compression.py), every
layer's keys stacked as heads (30 x 3 = 90): the traversals the harness runs at the budget where blockwise BalanceKV
keeps n_mid / 4 (sink = window = 32): SubGen's middle (k = its first round's representatives) and k-center's keys
before its window (k = its centres). Candidates, timed in interleaved repetitions (_harness.paired, the thread's
CPU time, 1 thread):

* ``reference loop`` (the baseline): :func:`kvbounds.algorithms.kcenter.greedy_k_center`'s array-API loop, one
  masked step per centre over every head at once (what a backend without the in-place loop runs;
  ``kcenter._NUMPY_LOOP = False``);
* ``greedy_k_center``: the numpy in-place traversal (heads in groups of ``kcenter.TRAVERSE_BYTES``), what the
  harness runs.

Both must give the same centres, radii and assignment bit for bit (checked and printed). The traversal's seconds
here are the k-center share of bench_e2e_compression's SHORTFALL notes.

Usage: python benchmarks/bench_kcenter_traversal.py [--n 512,2048] [--reps 5] [--out PATH]
Writes JSON to benchmarks/results/bench_kcenter_traversal.json.
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

from _harness import fmt_ratio, meta, output_path, paired, threads, write  # noqa: E402

SINK = WINDOW = 32


def reference_loop(X: np.ndarray, k: int):
    """greedy_k_center(X, k) through its array-API loop (the baseline)."""
    from kvbounds.algorithms import kcenter
    kcenter._NUMPY_LOOP = False
    try:
        return kcenter.greedy_k_center(X, k)
    finally:
        kcenter._NUMPY_LOOP = True


def bench(lm, n: int, reps: int) -> list:
    from kvbounds.algorithms.cache_compressors import SubGenCompressor
    from kvbounds.algorithms.kcenter import greedy_k_center
    from kvbounds.e2e import _harness as harness
    from kvbounds.e2e import _tasks as tasks
    from kvbounds.e2e import _methods as M
    state = harness.prefill(lm, tasks.ppl_task(lm, n, 2, 0).context, capture_inputs=True)
    K = np.concatenate([X[0].float().cpu().numpy() for X in state.keys])            # (90, n, d)
    d = K.shape[-1]
    floats = int(np.floor(M.balance_budgets(n, WINDOW, levels=(2,))[0] * n * 2 * d))
    n_mid = n - SINK - WINDOW
    cases = {"SubGen's middle": (np.ascontiguousarray(K[:, SINK:n - WINDOW]),
                                 SubGenCompressor(sink=SINK, window=WINDOW).sizes(
                                     n_mid, d, floats - (SINK + WINDOW) * 2 * d, floats)[0]),
             "k-center's keys before the window": (np.ascontiguousarray(K[:, :n - WINDOW]),
                                                   floats // (2 * d) - WINDOW)}
    rows = []
    for name, (X, k) in cases.items():
        ref, new = reference_loop(X, k), greedy_k_center(X, k)
        same = all(np.array_equal(a, b) for a, b in zip((ref.centers, ref.radii, ref.assignment),
                                                        (new.centers, new.radii, new.assignment)))
        r = paired({"reference loop": lambda: reference_loop(X, k), "greedy_k_center": lambda: greedy_k_center(X, k)},
                   baseline="reference loop", reps=reps, clock="cpu")
        row = dict(n=n, case=name, heads=X.shape[0], points=X.shape[1], k=k, bit_for_bit=same,
                   reference_s=r["reference loop"]["time"]["median"], now_s=r["greedy_k_center"]["time"]["median"],
                   ratio=r["greedy_k_center"]["ratio"], load=r["load"])
        print(f"n = {n}, {name}: {X.shape[0]} heads x {X.shape[1]} points, k = {k}: reference loop "
              f"{row['reference_s']:.3f} s, greedy_k_center {row['now_s']:.3f} s, ratio {fmt_ratio(row['ratio'])}; "
              f"bit for bit: {same}")
        rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="512,2048")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=output_path, default=None)
    a = ap.parse_args(argv)
    from kvbounds.e2e._checks import hf_missing
    if hf_missing():
        print(f"skipped: {hf_missing()}")
        return 0
    import torch  # noqa: F401 (threads() sets torch's pool once it is imported)
    from kvbounds.e2e._model import load_smollm2
    lm = load_smollm2("cpu")
    out = dict(meta=meta(threads=1), clock="the thread's CPU time, 1 thread", rows=[],
               baseline="greedy_k_center's array-API loop (kcenter._NUMPY_LOOP = False)",
               interleaving="paired: one warm-up each, order rotating every repetition")
    with threads(1):
        for n in (int(x) for x in a.n.split(",")):
            out["rows"] += bench(lm, n, a.reps)
    write("bench_kcenter_traversal", False, out, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

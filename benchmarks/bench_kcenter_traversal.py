"""Greedy k-center's farthest-first traversal on the end-to-end harness's real keys, before and after issue 26's
last changes (claims SG.e2e, SG.clusterability). A script.

SmolLM2-135M on the CPU, the first n tokens of the ``ppl`` task's window 0 (as bench_e2e_compression.py), every
layer's keys stacked as heads (30 x 3 = 90): the traversals the harness runs at the budget where blockwise BalanceKV
keeps n_mid / 4 (sink = window = 32): SubGen's middle (k = its first round's representatives) and k-center's keys
before its window (k = its centres). Candidates, timed in interleaved repetitions (_harness.paired, the thread's
CPU time, 1 thread):

* ``before``: the traversal as it was (written here: :func:`traverse_before`, heads in groups of 4 MiB, the
  assignment updated with ``np.putmask``);
* ``greedy_k_center``: :func:`kvbounds.algorithms.kcenter.greedy_k_center` now.

Both must give the same centres, radii and assignment bit for bit (checked and printed).

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

from _harness import fmt_ratio, meta, paired, threads, write  # noqa: E402

SINK = WINDOW = 32


def traverse_before(X: np.ndarray, k: int):
    """greedy_k_center(X, k) of numpy X (B, n, d) as the package computed it before (the baseline)."""
    from kvbounds.algorithms.attention import _mul_pow2, _pow2_exponent
    B, n, d = X.shape
    e = _pow2_exponent(np, X)
    Xf = _mul_pow2(X, -e)
    sq = np.sum(Xf * Xf, axis=-1)
    per = max(1, (1 << 22) // (n * d * Xf.dtype.itemsize))
    out = [_before_group(Xf[i:i + per], sq[i:i + per], k) for i in range(0, B, per)]
    C, r2, assign = (np.concatenate([o[f] for o in out]) for f in range(3))
    return C, np.ldexp(np.sqrt(np.maximum(r2, 0.0)).astype(np.float64), e), assign


def _before_group(Xf, sq, k: int):
    B, n, d = Xf.shape
    base = np.arange(B, dtype=np.int64) * n
    flat, sq_flat = Xf.reshape(B * n, d), sq.reshape(-1)
    IDX, r2 = np.empty((B, k), dtype=np.int64), np.empty((B, k), dtype=Xf.dtype)
    mind, assign = np.full((B, n), np.inf, dtype=Xf.dtype), np.zeros((B, n), dtype=np.int64)
    mind_flat, assign_flat = mind.reshape(-1), assign.reshape(-1)
    d2 = np.empty((B, n, 1), dtype=Xf.dtype)
    d2v = d2[..., 0]
    closer = np.empty((B, n), dtype=bool)
    idx = base.copy()
    for j in range(k):
        IDX[:, j] = idx
        np.matmul(Xf, flat.take(idx, axis=0)[:, :, None], out=d2)
        d2v *= -2.0
        d2v += sq
        d2v += sq_flat.take(idx)[:, None]
        np.maximum(d2v, 0.0, out=d2v)
        np.less(d2v, mind, out=closer)
        np.putmask(assign, closer, j)
        np.minimum(mind, d2v, out=mind)
        mind_flat.put(idx, -1.0)
        assign_flat.put(idx, j)
        idx = mind.argmax(axis=-1) + base
        r2[:, j] = mind_flat.take(idx)
    return IDX - base[:, None], r2, assign


def bench(lm, n: int, reps: int) -> list:
    from kvbounds.algorithms.cache_compressors import SubGenCompressor
    from kvbounds.algorithms.kcenter import greedy_k_center
    from kvbounds.e2e import harness, tasks
    from kvbounds.e2e import methods as M
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
        ref, new = traverse_before(X, k), greedy_k_center(X, k)
        same = all(np.array_equal(a, b) for a, b in zip(ref, (new.centers, new.radii, new.assignment)))
        r = paired({"before": lambda: traverse_before(X, k), "greedy_k_center": lambda: greedy_k_center(X, k)},
                   baseline="before", reps=reps, clock="cpu")
        row = dict(n=n, case=name, heads=X.shape[0], points=X.shape[1], k=k, bit_for_bit=same,
                   before_s=r["before"]["time"]["median"], now_s=r["greedy_k_center"]["time"]["median"],
                   ratio=r["greedy_k_center"]["ratio"], load=r["load"])
        print(f"n = {n}, {name}: {X.shape[0]} heads x {X.shape[1]} points, k = {k}: before {row['before_s']:.3f} s, "
              f"now {row['now_s']:.3f} s, now / before {fmt_ratio(row['ratio'])}; bit for bit: {same}")
        rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="512,2048")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    from kvbounds.e2e.checks import hf_missing
    if hf_missing():
        print(f"skipped: {hf_missing()}")
        return 0
    import torch  # noqa: F401 (threads() sets torch's pool once it is imported)
    from kvbounds.e2e.model import load_smollm2
    lm = load_smollm2("cpu")
    out = dict(meta=meta(), clock="the thread's CPU time, 1 thread", rows=[])
    with threads(1):
        for n in (int(x) for x in a.n.split(",")):
            out["rows"] += bench(lm, n, a.reps)
    write("bench_kcenter_traversal", False, out, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

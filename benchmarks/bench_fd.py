"""Frequent Directions and coefficient-space decode timings (a script, not a test; claims FD.covariance, SUB.cost).

(a) FD update cost in microseconds per row at d = 512, l = 32, one BLAS thread, float64, for
    * ours: :class:`kvbounds.algorithms.frequent_directions.FrequentDirections` (2l-row buffer, one SVD per l + 1 rows),
      fed blocks of 64 rows and fed one row per call;
    * a plain reference written here: after every row, an SVD of the 2l buffer (shrinking when it is full),
    in the same run, repetitions interleaved. Target: ours at least 3x faster than the reference.
(b) One decode step of coefficient-space attention (:func:`kvbounds.algorithms.subspace_attention.coefficient_decode`, float32)
    vs exact attention (:func:`kvbounds.algorithms.subspace_attention.exact_decode`) at T = 16384, d = 64, r + r_v = 32, for
    J = 32 chunks (L = 512) and one static basis (J = 1), against :func:`kvbounds.theory.subspace.cost_model`: target ratio
    near (r + r_v)/(2d) = 0.25 plus the stated overhead (the model's FLOP and byte ratios). The O(T) softmax part
    (exp, max, sum over the T logits) costs the same in both and is reported separately.

One BLAS thread: threadpoolctl when installed; otherwise the script re-executes itself with
OMP/MKL/OPENBLAS_NUM_THREADS=1 in the environment before numpy is imported.

Usage: python benchmarks/bench_fd.py [--quick] [--out PATH]
Writes JSON to benchmarks/results/bench_fd.json (--quick: bench_fd_quick.json).
"""
from __future__ import annotations

import importlib.util
import os
import sys

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
HAVE_THREADPOOLCTL = importlib.util.find_spec("threadpoolctl") is not None
if not HAVE_THREADPOOLCTL and any(os.environ.get(k) != "1" for k in THREAD_VARS) and "numpy" not in sys.modules:
    os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *sys.argv[1:]],
              {**os.environ, **{k: "1" for k in THREAD_VARS}})

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kvbounds.algorithms.frequent_directions import FrequentDirections  # noqa: E402
from kvbounds.proofs_checks.sub_cost import time_decode  # noqa: E402
from kvbounds.theory.subspace import cost_model  # noqa: E402

TARGET_FD_SPEEDUP = 3.0


def one_blas_thread():
    if HAVE_THREADPOOLCTL:
        from threadpoolctl import threadpool_limits
        return threadpool_limits(limits=1, user_api="blas")
    return contextlib.nullcontext()


class ReferenceFD:
    """Plain FD for comparison: every row is inserted into the 2l buffer and the buffer is re-diagonalised by an SVD
    (B <- Sigma V^T), shrinking by sigma_l^2 when it is full. Same sketch guarantee, one SVD per row."""

    def __init__(self, d: int, ell: int):
        self.d, self.ell = d, ell
        self.B = np.zeros((2 * ell, d))
        self.next = 0
        self.delta = 0.0

    def update_row(self, a: np.ndarray) -> None:
        self.B[self.next] = a
        self.next += 1
        _, s, Vt = np.linalg.svd(self.B[:self.next], full_matrices=False)
        self.B[:] = 0.0
        if self.next == 2 * self.ell:
            dl = s[self.ell - 1] ** 2
            keep = self.ell - 1
            self.B[:keep] = np.sqrt(np.maximum(s[:keep] ** 2 - dl, 0.0))[:, None] * Vt[:keep]
            self.next, self.delta = keep, self.delta + dl
        else:
            k = min(len(s), self.next)
            self.B[:k] = s[:k, None] * Vt[:k]
            self.next = k

    def sketch(self) -> np.ndarray:
        return self.B[:self.next]


def bench_fd(quick: bool) -> dict:
    d, ell = 512, 32
    n_ours, n_ref = (1024, 96) if quick else (8192, 512)
    reps = 3 if quick else 5
    rng = np.random.default_rng(0)
    A = rng.standard_normal((n_ours, d))
    ours_blk, ours_row, ref = [], [], []
    for _ in range(reps):                                  # interleaved repetitions
        fd = FrequentDirections(d, ell)
        t = time.perf_counter()
        for i in range(0, n_ours, 64):
            fd.update(A[i:i + 64])
        ours_blk.append((time.perf_counter() - t) / n_ours * 1e6)
        fd = FrequentDirections(d, ell)
        t = time.perf_counter()
        for i in range(n_ours):
            fd.update(A[i])
        ours_row.append((time.perf_counter() - t) / n_ours * 1e6)
        rf = ReferenceFD(d, ell)
        t = time.perf_counter()
        for i in range(n_ref):
            rf.update_row(A[i])
        ref.append((time.perf_counter() - t) / n_ref * 1e6)
    # both are valid FD sketches of the same rows
    fd = FrequentDirections(d, ell).update(A[:n_ref])
    rf = ReferenceFD(d, ell)
    for i in range(n_ref):
        rf.update_row(A[i])
    G = A[:n_ref].T @ A[:n_ref]
    err = lambda S: float(np.linalg.norm(G - S.T @ S, 2))
    res = dict(d=d, ell=ell, rows_ours=n_ours, rows_reference=n_ref, reps=reps,
               ours_block64_us_per_row=statistics.median(ours_blk), ours_row_us_per_row=statistics.median(ours_row),
               reference_us_per_row=statistics.median(ref),
               covariance_error_ours=err(fd.sketch()), certificate_ours=fd.certificate(),
               covariance_error_reference=err(rf.sketch()), certificate_reference=rf.delta)
    res["speedup_block"] = res["reference_us_per_row"] / res["ours_block64_us_per_row"]
    res["speedup_row"] = res["reference_us_per_row"] / res["ours_row_us_per_row"]
    res["target_met"] = min(res["speedup_block"], res["speedup_row"]) >= TARGET_FD_SPEEDUP
    return res


def bench_decode(quick: bool) -> dict:
    T, d, R = 16384, 64, 32
    reps = 20 if quick else 200
    rows = []
    for L, J in ((512, 32), ("T", 1)):
        t = time_decode(T, d, R, L, reps, 0)
        m = cost_model(T, d, R // 2, R // 2, J=J, ell_k=R, ell_v=R, bytes_per_float=4)
        rows.append(dict(T=T, d=d, r=R // 2, r_v=R // 2, J=J, L=T if L == "T" else L,
                         exact_us=t["exact_s"] * 1e6, ours_us=t["ours_s"] * 1e6, softmax_us=t["softmax_s"] * 1e6,
                         ratio=t["ours_s"] / t["exact_s"], ratio_min=t["ours_min_s"] / t["exact_min_s"],
                         ratio_excl_softmax=(t["ours_s"] - t["softmax_s"]) / (t["exact_s"] - t["softmax_s"]),
                         model_flops_ratio=m["flops_ratio"], model_bytes_ratio=m["bytes_ratio"],
                         leading_ratio=m["leading_ratio"]))
    return dict(reps=reps, rows=rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a < 30 s smoke run")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / ("bench_fd_quick.json" if args.quick else "bench_fd.json")
    with one_blas_thread():
        fd = bench_fd(args.quick)
        dec = bench_decode(args.quick)
    threads = "threadpoolctl" if HAVE_THREADPOOLCTL else ", ".join(f"{k}={os.environ.get(k)}" for k in THREAD_VARS)
    print(f"(a) Frequent Directions update, d = {fd['d']}, l = {fd['ell']}, one BLAS thread ({threads})")
    print(f"    {'implementation':<44}{'us/row':>10}")
    print(f"    {'ours, blocks of 64 rows':<44}{fd['ours_block64_us_per_row']:>10.1f}")
    print(f"    {'ours, one row per call':<44}{fd['ours_row_us_per_row']:>10.1f}")
    print(f"    {'reference (SVD of the 2l buffer per row)':<44}{fd['reference_us_per_row']:>10.1f}")
    print(f"    speedup ratio: {fd['speedup_block']:.1f}x (blocks), {fd['speedup_row']:.1f}x (rows); target >= "
          f"{TARGET_FD_SPEEDUP:g}x: {'met' if fd['target_met'] else 'NOT met'}")
    print(f"    ||A^T A - S^T S|| ours {fd['covariance_error_ours']:.4g} <= Delta {fd['certificate_ours']:.4g}; "
          f"reference {fd['covariance_error_reference']:.4g} <= Delta {fd['certificate_reference']:.4g}")
    print("(b) one decode step, float32, coefficient space vs exact attention")
    print(f"    {'J':>3} {'L':>6} {'exact us':>9} {'ours us':>9} {'ratio':>7} {'model flops':>12} {'model bytes':>12} "
          f"{'(r+r_v)/2d':>11} {'softmax us':>11} {'ratio w/o softmax':>18}")
    for r in dec["rows"]:
        print(f"    {r['J']:>3} {r['L']:>6} {r['exact_us']:>9.1f} {r['ours_us']:>9.1f} {r['ratio']:>7.3f} "
              f"{r['model_flops_ratio']:>12.3f} {r['model_bytes_ratio']:>12.3f} {r['leading_ratio']:>11.3f} "
              f"{r['softmax_us']:>11.1f} {r['ratio_excl_softmax']:>18.3f}")
    result = dict(fd=fd, decode=dec, quick=args.quick, threads=threads, python=platform.python_version(),
                  numpy=np.__version__, machine=platform.machine(), processor=platform.processor(),
                  cpu_count=os.cpu_count(), time=time.strftime("%Y-%m-%d %H:%M:%S"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

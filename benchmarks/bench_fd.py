"""Frequent Directions and coefficient-space decode against what a user would pick instead (issue 13; claims
FD.covariance, SUB.cost). A script, not a test.

(a) :class:`kvbounds.algorithms.frequent_directions.FrequentDirections` against the standard Frequent Directions
    written below (:class:`StandardFD`: a buffer of 2l rows, an SVD when it is full, shrink by the l-th squared
    singular value -- Liberty 2013 / Ghashami, Liberty, Phillips, Woodruff 2016 Alg. 2, as ~20 lines of numpy),
    n = 20000 rows, d = 512, l = 32, float64, one thread (timed in the thread's CPU time, so other processes on a
    loaded machine do not enter the ratios). Ours is fed one row per call and in blocks of 64; the
    standard one row per call. Interleaved repetitions; per-row cost = wall time / n (amortised, shrinks
    included); the median of the paired ratios standard / ours with its spread. Equal accuracy: both sketch the
    same rows with the same shrink schedule, so ||A^T A - S^T S||_2 and the certificate Delta are compared.
    Target: >= 2x faster than the standard FD, both feeding modes.
(b) One decode step of :func:`kvbounds.algorithms.subspace_attention.coefficient_decode` (float32, T = 16384,
    d = 64, r + r_v = 32; J = 32 chunks of L = 512 and one static basis, J = 1) against one exact decode step
    written in _harness.py (:func:`exact_decode_step`: softmax(K q / sqrt d)^T V in numpy), one thread, against
    :func:`kvbounds.theory.subspace.cost_model` (the larger of its FLOP and byte ratios). Target: the measured
    ratio within 1.2x of the model. The profile (per-part times) says what bounds it.

Usage: python benchmarks/bench_fd.py [--quick] [--out PATH]
Writes JSON to benchmarks/results/bench_fd.json (--quick: bench_fd_quick.json).
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

from _harness import exact_decode_step, fmt_ratio, load, meta, output_path, paired, target, threads, write  # noqa: E402

from kvbounds.algorithms.frequent_directions import FrequentDirections  # noqa: E402
from kvbounds.algorithms.subspace_attention import coefficient_decode, top_basis  # noqa: E402
from kvbounds.theory.subspace import cost_model, decode_time_model  # noqa: E402

TARGET_FD_SPEEDUP = 2.0
TARGET_DECODE_OVER_MODEL = 1.2


class StandardFD:
    """The standard Frequent Directions a user would write (Liberty 2013; GLPW16 Alg. 2), row by row."""

    def __init__(self, d: int, ell: int):
        self.ell = ell
        self.B = np.zeros((2 * ell, d))
        self.next = 0                     # first zero-valued row
        self.delta = 0.0                  # total shrinkage (the certificate)

    def update(self, a: np.ndarray) -> None:
        self.B[self.next] = a
        self.next += 1
        if self.next == 2 * self.ell:     # no zero-valued row left
            _, s, Vt = np.linalg.svd(self.B, full_matrices=False)
            dl = s[self.ell - 1] ** 2
            self.B = np.sqrt(np.maximum(s ** 2 - dl, 0.0))[:, None] * Vt   # rows l-1 .. 2l-1 are now zero
            self.next = self.ell - 1
            self.delta += dl

    def sketch(self) -> np.ndarray:
        return self.B[:self.next]


def bench_fd(quick: bool) -> dict:
    d, ell = 512, 32
    n = {"smoke": 256, "quick": 2048}.get(quick, 20000)
    reps = 3 if quick else 5
    A = np.random.default_rng(0).standard_normal((n, d))

    def standard():
        fd = StandardFD(d, ell)
        for i in range(n):
            fd.update(A[i])
        return fd

    def ours_rows():
        fd = FrequentDirections(d, ell)
        for i in range(n):
            fd.update(A[i])
        return fd

    def ours_blocks():
        fd = FrequentDirections(d, ell)
        for i in range(0, n, 64):
            fd.update(A[i:i + 64])
        return fd

    fns = dict(standard=standard, ours_rows=ours_rows, ours_blocks=ours_blocks)
    res = paired(fns, baseline="standard", reps=reps, warmup=0, per_call={k: n for k in fns}, clock="cpu")
    G = A.T @ A
    acc = {}
    for k, f in fns.items():
        fd = f()
        S = fd.sketch()
        acc[k] = dict(covariance_error=float(np.linalg.norm(G - S.T @ S, 2)),
                      certificate=float(fd.delta if k == "standard" else fd.certificate()), rows_held=int(S.shape[0]))
    speed = {k: 1.0 / np.asarray(res[k]["ratio"]["median"]) for k in ("ours_rows", "ours_blocks")}
    return dict(d=d, ell=ell, n=n, reps=reps, timing=res, accuracy=acc,
                speedup={k: float(v) for k, v in speed.items()},
                speedup_spread={k: dict(q25=1 / res[k]["ratio"]["q75"], q75=1 / res[k]["ratio"]["q25"])
                                for k in ("ours_rows", "ours_blocks")})


def decode_inputs(T, d, R, L, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    J, r = T // L, R // 2
    B = np.stack([top_basis(rng.standard_normal((2 * r, d)), r) for _ in range(J)]).astype(dtype)
    E = np.stack([top_basis(rng.standard_normal((2 * r, d)), r) for _ in range(J)]).astype(dtype)
    C = rng.standard_normal((J, r, L)).astype(dtype)
    D = rng.standard_normal((J, r, L)).astype(dtype)
    K = rng.standard_normal((T, d)).astype(dtype)
    V = rng.standard_normal((T, d)).astype(dtype)
    return dict(B=B, E=E, C=C, D=D, K=K, V=V, q=rng.standard_normal(d).astype(dtype), J=J, r=r, L=L)


def machine_kernels(T: int, d: int, R: int, seed: int = 1) -> dict:
    """The micro-kernels whose times give :func:`kvbounds.theory.subspace.decode_time_model`'s constants, each at
    the decode's size and at size 1 (the difference removes the per-call dispatch, which the 1-token decodes carry):
    the streaming pair of the exact step (a GEMV M q and a vector-matrix product u M) over two float32 matrices of
    T x d (the exact step's 2 T d floats) and over two of T R / (2 d) x d (the coefficient cache's T R floats, the
    same kernels on the smaller working set), np.exp on T float32 values, and the three passes over T logits (max,
    subtract, sum). Fresh arrays, never the decodes' own."""
    rng = np.random.default_rng(seed)
    f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)
    rows_o = max(1, T * R // (2 * d))
    Ke, Ve, Ko, Vo, K1, V1 = f32(T, d), f32(T, d), f32(rows_o, d), f32(rows_o, d), f32(1, d), f32(1, d)
    q, ue, uo, u1 = f32(d), f32(T), f32(rows_o), f32(1)
    x, y, x1, y1 = -20 * np.abs(f32(T)), np.empty(T, np.float32), -np.abs(f32(1)), np.empty(1, np.float32)

    def passes(a, out):
        a.max()
        np.subtract(a, 1.0, out=out)
        return out.sum()
    return dict(stream_exact=lambda: (Ke @ q, ue @ Ve), stream_ours=lambda: (Ko @ q, uo @ Vo),
                stream_1=lambda: (K1 @ q, u1 @ V1), exp_T=lambda: np.exp(x, out=y), exp_1=lambda: np.exp(x1, out=y1),
                passes_T=lambda: passes(x, y), passes_1=lambda: passes(x1, y1)), dict(rows_ours=rows_o)


def time_model_constants(med: dict, T: int, d: int, R: int, rows_ours: int) -> dict:
    """decode_time_model's constants from the medians ``med`` (seconds) of :func:`machine_kernels` and of the
    1-token decodes ('call_exact', 'call_ours'). [measured]"""
    return dict(s_per_byte_exact=(med["stream_exact"] - med["stream_1"]) / (2 * T * d * 4),
                s_per_byte_ours=(med["stream_ours"] - med["stream_1"]) / (2 * rows_ours * d * 4),
                s_per_exp=(med["exp_T"] - med["exp_1"]) / (T - 1),
                s_per_pass=(med["passes_T"] - med["passes_1"]) / (3 * (T - 1)),
                call_s_exact=med["call_exact"], call_s_ours=med["call_ours"])


def bench_decode(quick: bool) -> dict:
    T, d, R = 16384, 64, 32
    reps = {"smoke": 5, "quick": 50}.get(quick, 400)
    rows = []
    kernels, kinfo = machine_kernels(T, d, R)
    for L in (512, T):
        x = decode_inputs(T, d, R, L)
        J, r = x["J"], x["r"]
        q, C, D = x["q"], x["C"], x["D"]
        qt = (x["B"].reshape(J * r, d) @ q).reshape(J, r)
        logits = np.matmul(qt[:, None, :], C)
        w = np.exp(logits - logits.max())
        one = decode_inputs(1, d, R, 1, seed=2)                    # a 1-token cache: the per-call cost
        fns = dict(exact=lambda: exact_decode_step(q, x["K"], x["V"]),
                   ours=lambda: coefficient_decode(q, x["B"], x["E"], C, D, gamma=1.0),
                   # profile: the parts of ours that stream T x (r + r_v) floats, and the O(T) exponentials
                   part_logits=lambda: np.matmul(qt[:, None, :], C),
                   part_values=lambda: np.matmul(D, np.swapaxes(w, -1, -2)),
                   part_exp=lambda: np.exp(logits - logits.max()),
                   call_exact=lambda: exact_decode_step(one["q"], one["K"], one["V"]),
                   call_ours=lambda: coefficient_decode(one["q"], one["B"], one["E"], one["C"], one["D"], gamma=1.0),
                   **kernels)
        res = paired(fns, baseline="exact", reps=reps, warmup=3, clock="cpu")
        m = cost_model(T, d, r, R - r, J=J, ell_k=R, ell_v=R, bytes_per_float=4)
        model = max(m["flops_ratio"], m["bytes_ratio"])
        med = {k: res[k]["time"]["median"] for k in fns}
        consts = time_model_constants(med, T, d, R, kinfo["rows_ours"])
        tm = decode_time_model(T, d, r, R - r, J=J, **consts)
        floor = sum(med[k] for k in ("part_logits", "part_values", "part_exp"))
        rows.append(dict(T=T, d=d, r=r, r_v=R - r, J=J, L=L, timing={k: v for k, v in res.items()},
                         ratio=res["ours"]["ratio"], model_flops_ratio=m["flops_ratio"],
                         model_bytes_ratio=m["bytes_ratio"], count_model=model,
                         ratio_over_count_model=res["ours"]["ratio"]["median"] / model,
                         time_model=dict(constants=consts, constants_are="measured (micro-kernels, bench_fd."
                                         "machine_kernels; none fitted to the decodes)", **tm),
                         model=tm["ratio"], ratio_over_model=res["ours"]["ratio"]["median"] / tm["ratio"],
                         predicted_over_measured_s=dict(exact=tm["exact_s"] / med["exact"],
                                                        ours=tm["ours_s"] / med["ours"]),
                         floor_ratio=floor / med["exact"]))
    return dict(reps=reps, rows=rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short run (n = 2048 rows, fewer repetitions)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, seconds (for the tests)")
    ap.add_argument("--out", type=output_path, default=None)
    args = ap.parse_args(argv)
    args.quick = "smoke" if args.smoke else ("quick" if args.quick else False)
    targets = []
    with threads(1):
        print(f"load before: {load()}")
        fd = bench_fd(args.quick)
        t = fd["timing"]
        print(f"(a) Frequent Directions, n = {fd['n']}, d = {fd['d']}, l = {fd['ell']}, float64, 1 thread, "
              f"{fd['reps']} interleaved reps, the thread's CPU time (load {t['load']})")
        print(f"    {'implementation':<40}{'us/row (mean)':>14}{'ratio to standard':>26}{'||A^TA-S^TS||':>15}{'Delta':>12}")
        for k, label in (("standard", "standard FD (SVD per full buffer)"), ("ours_rows", "ours, one row per call"),
                         ("ours_blocks", "ours, blocks of 64 rows")):
            a = fd["accuracy"][k]
            print(f"    {label:<40}{t[k]['time']['median'] * 1e6:>14.2f}{fmt_ratio(t[k]['ratio']):>26}"
                  f"{a['covariance_error']:>15.6g}{a['certificate']:>12.6g}")
        for k in ("ours_rows", "ours_blocks"):
            targets.append(target(f"FD speedup over the standard FD ({k})", fd["speedup"][k], ">=", TARGET_FD_SPEEDUP,
                                  fd["speedup_spread"][k]))
        a, s = fd["accuracy"], fd["accuracy"]["standard"]
        same = all(abs(a[k]["certificate"] - s["certificate"]) <= 1e-9 * s["certificate"] and
                   abs(a[k]["covariance_error"] - s["covariance_error"]) <= 1e-9 * s["covariance_error"]
                   for k in ("ours_rows", "ours_blocks"))
        fd["equal_accuracy"] = bool(same)
        print(f"    equal accuracy (error and Delta within 1e-9 relative of the standard FD): {same}")
        dec = bench_decode(args.quick)
    print(f"(b) one decode step, float32, 1 thread, {dec['reps']} interleaved reps, the thread's CPU time: coefficient "
          f"space vs one exact decode step (load {dec['rows'][-1]['timing']['load']})")
    print("    model: kvbounds.theory.subspace.decode_time_model, t = bytes * s/byte + T (exp + passes) + per call, its "
          "constants measured on micro-kernels in the same interleaved run (not fitted); count model = cost_model's "
          "max(FLOP, byte) ratio, which counts exp as 1 flop and leaves out the per-call cost")
    print(f"    {'J':>3} {'L':>6} {'exact us':>9} {'ours us':>8} {'ratio [q25-q75]':>22} {'model':>6} "
          f"{'ratio/model':>11} {'count model':>11} {'ratio/count':>11} {'C us':>6} {'D us':>6} {'exp us':>7}")
    for r in dec["rows"]:
        tm = r["timing"]
        us = lambda k: tm[k]["time"]["median"] * 1e6
        print(f"    {r['J']:>3} {r['L']:>6} {us('exact'):>9.1f} {us('ours'):>8.1f} {fmt_ratio(r['ratio']):>22} "
              f"{r['model']:>6.3f} {r['ratio_over_model']:>11.2f} {r['count_model']:>11.3f} "
              f"{r['ratio_over_count_model']:>11.2f} {us('part_logits'):>6.1f} {us('part_values'):>6.1f} "
              f"{us('part_exp'):>7.1f}")
        c, terms = r["time_model"]["constants"], r["time_model"]["terms"]
        print(f"        constants [measured]: {c['s_per_byte_exact'] * 1e12:.1f} / {c['s_per_byte_ours'] * 1e12:.1f} ps "
              f"per byte (exact / ours working set), exp {c['s_per_exp'] * 1e9:.2f} ns, pass "
              f"{c['s_per_pass'] * 1e9:.2f} ns per value, per call {c['call_s_exact'] * 1e6:.1f} / "
              f"{c['call_s_ours'] * 1e6:.1f} us")
        for side in ("exact", "ours"):
            print(f"        predicted {side:<5} " + ", ".join(f"{k} {v * 1e6:.1f} us" for k, v in terms[side].items())
                  + f" = {r['time_model'][side + '_s'] * 1e6:.1f} us (measured {us(side):.1f} us)")
        targets.append(target(f"coefficient decode J = {r['J']}: ratio / time model", r["ratio_over_model"], "<=",
                              TARGET_DECODE_OVER_MODEL, note=f"ratio / cost_model's count ratio: "
                              f"{r['ratio_over_count_model']:.2f}"))
    write("bench_fd", args.quick, dict(meta=meta(threads=1, quick=args.quick), fd=fd, decode=dec, targets=targets),
          args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

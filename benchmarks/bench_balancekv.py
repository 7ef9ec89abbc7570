"""BalanceKV timing and memory figures (a script, not a test).

(a) Blockwise BalanceKV (001 App. B, :mod:`kvbounds.algorithms.blockwise_balance_kv`) compression time for a
    cache of 8 heads x 8192 tokens x d = 128 (b = 256, T = 2) on torch CPU float32, as a ratio to exact
    causal attention over the same cache (torch SDPA, is_causal=True, input (1, 8, 8192, 128)) measured
    in the same run with the repetitions interleaved; median of >= 5 repetitions each. Target: <= 0.2.
    Also numpy float64 (reference implementation) and a naive per-block Python-loop walk, timed on one
    head and extrapolated to all heads.
(b) Streaming :class:`kvbounds.algorithms.balance_kv.BalanceKV` (d = 16, batch 64, levels 10, keys in the unit
    ball, Gaussian values): per-token update time and num_stored at n = 2^12 .. 2^16. One stream is
    run to the largest n and read at each checkpoint: the state after n tokens is the state of a run
    of length n with the same seed (the erase rule uses the tokens seen so far).

Usage: python benchmarks/bench_balancekv.py [--quick] [--out PATH] [--stream-budget SECONDS]
Writes JSON to benchmarks/results/bench_balancekv.json (--quick: bench_balancekv_quick.json).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from kvbounds.algorithms.balance_kv import BalanceKV  # noqa: E402
from kvbounds.algorithms.blockwise_balance_kv import block_gram, blockwise_balance_select  # noqa: E402
from kvbounds.algorithms.self_balancing_walk import gram_walk, walk_constant  # noqa: E402
from kvbounds.gpu.backend import like  # noqa: E402

TARGET_RATIO = 0.2


def _timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def naive_select_one_head(K, V, *, b, levels, rng, delta=0.01):
    """Per-block Python loop: one gram_walk call per block of one head (K (n, d), V (n, s) torch)."""
    n, d = K.shape
    W = torch.cat([V, torch.ones(n, 1, dtype=V.dtype)], dim=-1)
    c = walk_constant(b, delta)
    idx = np.arange(n)
    for _ in range(levels):
        kept = []
        m = len(idx)
        for start in range(0, m, b):
            blk = idx[start:start + b]
            v = len(blk)
            Kb = torch.zeros(b, d, dtype=K.dtype)
            Wb = torch.zeros(b, W.shape[1], dtype=K.dtype)
            Kb[:v], Wb[:v] = K[blk], W[blk]
            G = block_gram(Kb, Wb, scale=1.0 / math.sqrt(d))
            signs = gram_walk(G, like(rng.random(b), Kb), c, on_fail="continue").signs.numpy()[:v]
            plus = signs > 0
            minority = plus if 2 * plus.sum() <= v else ~plus
            prio = rng.permutation(v)
            order = np.lexsort((-prio, ~minority))[: v // 2]
            kept.append(blk[order])
        idx = np.sort(np.concatenate(kept))
    return idx


def bench_blockwise(quick: bool) -> dict:
    H, n, d, b, T = (2, 1024, 32, 64, 2) if quick else (8, 8192, 128, 256, 2)
    reps = 5
    rng = np.random.default_rng(0)
    Kn = rng.standard_normal((H, n, d)) / d**0.25
    Vn = rng.standard_normal((H, n, d))
    Qn = rng.standard_normal((H, n, d)) / d**0.25
    K, V, Q = (torch.as_tensor(x, dtype=torch.float32) for x in (Kn, Vn, Qn))
    exact = lambda: torch.nn.functional.scaled_dot_product_attention(Q[None], K[None], V[None], is_causal=True)
    bal_t = lambda: blockwise_balance_select(K, V, block_size=b, levels=T, rng=np.random.default_rng(1))
    bal_n = lambda: blockwise_balance_select(Kn, Vn, block_size=b, levels=T, rng=np.random.default_rng(1))
    with torch.inference_mode():
        exact(), bal_t(), bal_n()                                   # warm-up, not counted
        t_exact, t_torch, t_numpy = [], [], []
        for _ in range(reps):                                       # interleaved: same machine load for all
            t_exact.append(_timed(exact))
            t_torch.append(_timed(bal_t))
            t_numpy.append(_timed(bal_n))
        kept = int(bal_t().shape[-1])
        # naive baseline: one head, one repetition, extrapolated to H heads
        t_naive_head = _timed(lambda: naive_select_one_head(K[0], V[0], b=b, levels=T, rng=np.random.default_rng(1)))
    med = statistics.median
    e = med(t_exact)
    out = dict(heads=H, n=n, d=d, block_size=b, levels=T, reps=reps, kept=kept,
               torch_threads=torch.get_num_threads(),
               exact_causal_sdpa_s=e, exact_all_s=t_exact,
               balance_torch_f32_s=med(t_torch), balance_torch_all_s=t_torch,
               balance_numpy_f64_s=med(t_numpy), balance_numpy_all_s=t_numpy,
               naive_loop_torch_f32_s=t_naive_head * H, naive_loop_note=f"1 head timed once, x{H}",
               ratio_torch=med(t_torch) / e, ratio_numpy=med(t_numpy) / e, ratio_naive=t_naive_head * H / e,
               target_ratio=TARGET_RATIO)
    out["target_met"] = bool(out["ratio_torch"] <= TARGET_RATIO)
    return out


def bench_streaming(quick: bool, budget_s: float) -> dict:
    d, t = (16, 16) if quick else (16, 64)
    exps = [8, 9, 10] if quick else [12, 13, 14, 15, 16]
    n_max = 2 ** exps[-1]
    levels = int(math.log2(n_max / t))
    eps, r, delta = 0.1, 1.0, 1e-3
    rng = np.random.default_rng(0)
    K = rng.standard_normal((n_max, d))
    K *= (r * rng.random((n_max, 1)) ** (1.0 / d)) / np.linalg.norm(K, axis=1, keepdims=True)   # uniform in the ball
    V = rng.standard_normal((n_max, d))
    bk = BalanceKV(d, batch_size=t, levels=levels, eps=eps, r=r, delta=delta, seed=0)
    times = np.empty(n_max)
    rows, note = [], None
    checkpoints = {2 ** e for e in exps}
    start = time.perf_counter()
    for j in range(n_max):
        t0 = time.perf_counter()
        bk.update(K[j], V[j])
        times[j] = time.perf_counter() - t0
        if j + 1 in checkpoints:
            m = j + 1
            ns = bk.num_stored()
            rows.append(dict(n=m, log2_n=math.log2(m), median_us_per_token=float(np.median(times[:m]) * 1e6),
                             mean_us_per_token=float(times[:m].mean() * 1e6), num_stored=ns,
                             stored_per_log2_n=ns / math.log2(m), n_over_stored=m / ns,
                             memory_floats=bk.memory_floats(), num_buckets=bk.num_buckets(),
                             elapsed_s=time.perf_counter() - start))
            if time.perf_counter() - start > budget_s and m < n_max:
                note = f"stopped after n = {m}: streaming exceeded the {budget_s:.0f} s budget"
                break
    return dict(d=d, batch_size=t, levels=levels, eps=eps, r=r, delta=delta, values="N(0, I_d)",
                keys="uniform in the ball of radius r", rows=rows, note=note)


def _print_blockwise(a: dict) -> None:
    print(f"(a) blockwise BalanceKV select vs exact causal attention: {a['heads']} heads x {a['n']} tokens x "
          f"d = {a['d']}, b = {a['block_size']}, T = {a['levels']} (kept {a['kept']} per head), "
          f"torch threads = {a['torch_threads']}, median of {a['reps']} interleaved reps")
    mn = lambda key: min(a[key])
    print(f"  {'method':<56} {'median s':>9} {'ratio':>7} {'min s':>7}")
    print(f"  {'exact causal attention (torch SDPA, f32)':<56} {a['exact_causal_sdpa_s']:>9.3f} {1.0:>7.3f} "
          f"{mn('exact_all_s'):>7.3f}")
    print(f"  {'blockwise BalanceKV, torch CPU f32':<56} {a['balance_torch_f32_s']:>9.3f} {a['ratio_torch']:>7.3f} "
          f"{mn('balance_torch_all_s'):>7.3f}")
    print(f"  {'blockwise BalanceKV, numpy f64 (reference)':<56} {a['balance_numpy_f64_s']:>9.3f} "
          f"{a['ratio_numpy']:>7.3f} {mn('balance_numpy_all_s'):>7.3f}")
    print(f"  {'naive per-block loop, torch f32 (' + a['naive_loop_note'] + ')':<56} "
          f"{a['naive_loop_torch_f32_s']:>9.3f} {a['ratio_naive']:>7.3f} {'-':>7}")
    print(f"  ratio of the minima (less sensitive to other load on the machine): "
          f"{mn('balance_torch_all_s') / mn('exact_all_s'):.3f}")
    print(f"  target: torch ratio <= {a['target_ratio']}: {'MET' if a['target_met'] else 'NOT met'} "
          f"({a['ratio_torch']:.3f})")


def _print_streaming(s: dict) -> None:
    print(f"(b) streaming BalanceKV: d = {s['d']}, batch_size = {s['batch_size']}, levels = {s['levels']}, "
          f"eps = {s['eps']}, r = {s['r']}, keys {s['keys']}, values {s['values']}")
    hdr = (f"  {'n':>7} {'log2 n':>6} {'median us/tok':>13} {'mean us/tok':>11} {'num_stored':>10} "
           f"{'stored/log2n':>12} {'n/stored':>9} {'mem floats':>10} {'buckets':>7}")
    print(hdr)
    for r in s["rows"]:
        print(f"  {r['n']:>7} {r['log2_n']:>6.0f} {r['median_us_per_token']:>13.1f} {r['mean_us_per_token']:>11.1f} "
              f"{r['num_stored']:>10} {r['stored_per_log2_n']:>12.2f} {r['n_over_stored']:>9.1f} "
              f"{r['memory_floats']:>10} {r['num_buckets']:>7}")
    if s["note"]:
        print(f"  note: {s['note']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    ap.add_argument("--out", type=Path, default=None, help="JSON output path")
    ap.add_argument("--stream-budget", type=float, default=300.0, help="wall-clock budget (s) for part (b)")
    args = ap.parse_args(argv)
    out = args.out or ROOT / "benchmarks" / "results" / ("bench_balancekv_quick.json" if args.quick
                                                         else "bench_balancekv.json")
    meta = dict(quick=args.quick, python=platform.python_version(), torch=torch.__version__, numpy=np.__version__,
                machine=platform.machine(), cpu_count=os.cpu_count(), torch_threads=torch.get_num_threads(),
                time=time.strftime("%Y-%m-%dT%H:%M:%S"))
    a = bench_blockwise(args.quick)
    _print_blockwise(a)
    print()
    s = bench_streaming(args.quick, args.stream_budget)
    _print_streaming(s)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(meta=meta, blockwise=a, streaming=s), indent=2))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""GPU benchmarks (issue 15), each against a yardstick measured in the same run on the same device.

Sections (``--only`` picks a comma-separated subset; default all):

walk       the walk alone on per-block Gram inputs (B blocks x b): the package's reference
           ``panel_walk`` called once per block (a Python loop), ``panel_walk`` on all blocks at once, and
           :func:`kvbounds.gpu.batched_walk.walk_signs` (exact / blocked / compiled / triton: the last two where
           torch.compile / Triton work, compiled not in --quick); paired ratios to batched_exact, speedups
           over the per-block loop (timed on 16 blocks, scaled); ops (CPU) or kernel launches (CUDA) per step.
           Also checks that the signs equal the reference's on the benchmark's own inputs.
blockwise  blockwise BalanceKV (T = 2 levels, b = 256) on a Llama-3.1-8B-sized cache, 32 heads x 32768
           tokens x d = 128, float32 and bfloat16 inputs: :func:`kvbounds.gpu.batched_walk.batched_select`
           and the package's ``blockwise_balance_select`` against the authors' released ``balanced_walk``
           (ksheth96/BalanceKV, src/balanced_walk.py, re-implemented in torch in benchmarks/released_walk.py: full
           per-block Gram, one full-row reduction per step, int16 signs, cumsum halving) and against exact causal attention
           (torch SDPA, is_causal=True) on the same cache. Targets: >= 3x faster than the released walk,
           <= 0.2x of SDPA. bfloat16: the released walk runs in bfloat16 (as in the authors' code); ours
           casts to float32 first (cast timed).
bandwidth  the Gram-panel phase alone (the panels the walk reads, all blocks): achieved bandwidth counting
           the panel traffic (12 reads/writes of 4 bytes per panel entry: two matmul outputs, five
           elementwise passes), against the device's peak: H100 SXM 3.35 TB/s (HBM3), H100 PCIe 2.0 TB/s,
           H200 4.8 TB/s, chosen from the device name (``--peak-tbs`` overrides; none on CPU).
streaming  SubGen (update + query per token) and streaming BalanceKV (update per token; its query is not
           timed) mean per-token cost over the steps in (n/2, n], against one exact decode step (softmax(K q) V
           over the n cached tokens, median of sampled steps) at n = 2^k up to 2^20 (quick: 2^8); a stream stops
           at a checkpoint once reaching the next one would exceed ``--stream-budget`` seconds, and says where.
fd         Frequent Directions update throughput (rows/s) at d = 4096, ell = 128 (quick: d = 128), against the
           exact covariance update C += X^T X of the same rows.
e2e        the end-to-end harness (SmolLM2-135M, n = 4096 tokens, quick 256): exact prefill (the yardstick),
           prefill + KV compression per method at one budget, one decode step; see benchmarks/bench_gpu_e2e.py.

Medians of interleaved repetitions and medians of the per-repetition (paired) ratios. JSON to
benchmarks/results/bench_gpu_<device>[_quick].json.

One line per GPU run (sized for the device tool's 10-minute limit on an H100; not yet run on one). The
machine needs a CUDA build of torch and this package installed (``pip install -e .`` from the repository):
    python benchmarks/bench_gpu.py --device cuda --only walk,bandwidth
    python benchmarks/bench_gpu.py --device cuda --only blockwise
    python benchmarks/bench_gpu.py --device cuda --only streaming --stream-budget 200
    python benchmarks/bench_gpu.py --device cuda --only fd
    python benchmarks/bench_gpu.py --device cuda --only e2e
CPU smoke (seconds): python benchmarks/bench_gpu.py --device cpu --quick
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for _p in (str(ROOT), str(ROOT / "benchmarks")):   # the package (a checkout) and bench_gpu_e2e / _harness
    if _p not in sys.path:
        sys.path.insert(0, _p)

import torch  # noqa: E402

from kvbounds.algorithms.blockwise_balance_kv import blockwise_balance_select, panel_walk  # noqa: E402
from kvbounds.algorithms.self_balancing_walk import walk_constant  # noqa: E402
from kvbounds.algorithms.block_walk import gram_panel  # noqa: E402
from kvbounds.gpu.batched_walk import batched_select, compiled_available, ops_per_step, walk_signs  # noqa: E402
from kvbounds.gpu.triton_walk import triton_available  # noqa: E402
import bench_gpu_e2e  # noqa: E402
from _harness import output_path, thread_counts  # noqa: E402
from released_walk import released_balanced_walk  # noqa: E402

SPEEDUP_TARGET, SDPA_TARGET = 3.0, 0.2
PEAKS_TBS = [("H200", 4.8, "H200 HBM3e 4.8 TB/s"), ("H100 PCIe", 2.0, "H100 PCIe HBM2e 2.0 TB/s"),
             ("H100", 3.35, "H100 SXM HBM3 3.35 TB/s")]


def _sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


def _timed(fn, dev):
    _sync(dev)
    t = time.perf_counter()
    fn()
    _sync(dev)
    return time.perf_counter() - t


WARMUP = [1]      # warm-up calls of each candidate (--warmup); every section's paired() reads it


def paired(fns: dict, reps: int, dev: str, base: str) -> dict:
    """Interleaved repetitions of every fn (after WARMUP[0] warm-up calls each; the same order every repetition);
    medians and paired ratios to ``base``. The result states its baseline, interleaving and thread counts."""
    warmup = WARMUP[0]
    for _ in range(warmup):
        for f in fns.values():
            f()
    times = {k: [] for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            times[k].append(_timed(f, dev))
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = {k: statistics.median([a / b for a, b in zip(v, times[base])]) for k, v in times.items()}
    return dict(times=times, median_s=med, paired_ratio_to=base, paired_ratio=ratio, baseline=base,
                interleaving=(f"{reps} repetitions after {warmup} warm-up(s); every candidate once per repetition, "
                              f"in the same order; ratios paired per repetition"),
                threads=thread_counts())


# ---------------------------------------------------------------- sections

def _walk_inputs(B, b, d, dev, seed=0):
    g = torch.Generator().manual_seed(seed)
    K = (torch.randn(B, b, d, generator=g) / d ** 0.25 * 0.5).to(dev)
    W = torch.randn(B, b, d, generator=g).to(dev)
    u = torch.rand(B, b, generator=g).to(dev)
    return K, W, (K * K).sum(-1), (W * W).sum(-1) + 1.0, u


def bench_walk(quick, dev, reps):
    B, b, d = (16, 64, 16) if quick else (4096, 256, 128)
    K, W, nk2, nw2, u = _walk_inputs(B, b, d, dev)
    c = walk_constant(b, 0.01)
    loop_blocks = min(B, 4 if quick else 16)   # the per-block loop is timed on a few blocks and scaled to B
    fns = {
        "per_block_loop": lambda: [panel_walk(K[i], W[i], nk2[i], nw2[i], u[i], c, plus_one=True)
                                   for i in range(loop_blocks)],
        "panel_walk_all_blocks": lambda: panel_walk(K, W, nk2, nw2, u, c, plus_one=True),
        "batched_exact": lambda: walk_signs(K, W, nk2, nw2, u, c, plus_one=True, method="exact"),
        "batched_blocked": lambda: walk_signs(K, W, nk2, nw2, u, c, plus_one=True, method="blocked"),
    }
    if compiled_available(torch.device(dev).type) and not quick:
        fns["batched_compiled"] = lambda: walk_signs(K, W, nk2, nw2, u, c, plus_one=True, method="compiled")
    if dev == "cuda" and triton_available("cuda"):
        fns["batched_triton"] = lambda: walk_signs(K, W, nk2, nw2, u, c, plus_one=True, method="triton")
    res = paired(fns, reps, dev, base="batched_exact")
    scale = B / loop_blocks
    res["per_block_loop_scaled_s"] = res["median_s"]["per_block_loop"] * scale
    res["speedup_vs_per_block_loop"] = {k: res["per_block_loop_scaled_s"] / v for k, v in res["median_s"].items()
                                        if k != "per_block_loop"}
    res["ops_per_step"] = {m: ops_per_step(m, device=dev, blocks=4, d=8, sizes=(32, 64) if quick else (64, 128))
                           for m in ["exact", "blocked"] + [k[8:] for k in fns if k in ("batched_compiled",
                                                                                        "batched_triton")]}
    res.update(blocks=B, b=b, d=d, loop_blocks_timed=loop_blocks)
    ref, _ = panel_walk(K, W, nk2, nw2, u, c, plus_one=True)
    res["signs_equal_reference"] = {m: bool(torch.equal(walk_signs(K, W, nk2, nw2, u, c, plus_one=True,
                                                                   method=m)[0], ref))
                                    for m in ["exact", "blocked"] + (["triton"] if "batched_triton" in fns else [])}
    return res


def bench_blockwise(quick, dev, reps, dtypes=("float32", "bfloat16")):
    H, n, d, b, T = (2, 512, 16, 32, 2) if quick else (32, 32768, 128, 256, 2)
    g = torch.Generator().manual_seed(0)
    K32 = (torch.randn(1, H, n, d, generator=g) / d ** 0.25).to(dev)
    V32 = torch.randn(1, H, n, d, generator=g).to(dev)
    Q32 = (torch.randn(1, H, n, d, generator=g) / d ** 0.25).to(dev)
    c = walk_constant(b, 0.01)
    out = {}
    for name in dtypes:
        dt = getattr(torch, name)
        K, V, Q = K32.to(dt), V32.to(dt), Q32.to(dt)
        gen = torch.Generator(device=dev).manual_seed(1)
        fns = {
            "exact_sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(Q, K, V, is_causal=True),
            "released_walk": lambda: released_balanced_walk(K, V, gen, gamma=1.0 / (2 * c), itrs=T, block_size=b),
            "batched_exact": lambda: batched_select(K.float(), V.float(), block_size=b, levels=T,
                                                    rngs=[np.random.default_rng(2)], method="exact"),
            "batched_blocked": lambda: batched_select(K.float(), V.float(), block_size=b, levels=T,
                                                      rngs=[np.random.default_rng(2)], method="blocked"),
            "package_select": lambda: blockwise_balance_select(K.float()[0], V.float()[0], block_size=b, levels=T,
                                                               rng=np.random.default_rng(2)),
        }
        if dev == "cuda" and triton_available("cuda"):
            fns["batched_triton"] = lambda: batched_select(K.float(), V.float(), block_size=b, levels=T,
                                                           rngs=[np.random.default_rng(2)], method="triton")
        with torch.inference_mode():
            r = paired(fns, reps, dev, base="released_walk")
        ours = [k for k in fns if k.startswith("batched_")]
        best = min(ours, key=lambda k: r["median_s"][k])
        r["best_ours"] = best
        r["speedup_vs_released"] = 1.0 / r["paired_ratio"][best]
        r["ratio_to_sdpa"] = statistics.median(a / e for a, e in zip(r["times"][best], r["times"]["exact_sdpa"]))
        r["speedup_target_met"] = bool(r["speedup_vs_released"] >= SPEEDUP_TARGET)
        r["sdpa_target_met"] = bool(r["ratio_to_sdpa"] <= SDPA_TARGET)
        out[name] = r
    return dict(heads=H, n=n, d=d, block_size=b, levels=T, dtypes=out)


def _peak(dev, override):
    if override:
        return override, f"given on the command line: {override} TB/s"
    if dev != "cuda":
        return None, "no peak stated for a CPU"
    name = torch.cuda.get_device_name()
    for key, tbs, label in PEAKS_TBS:
        if key in name:
            return tbs, f"{label} (device: {name})"
    return None, f"unknown device {name!r}: pass --peak-tbs"


def bench_bandwidth(quick, dev, reps, peak_override):
    B, b, d, m = (16, 64, 16, 32) if quick else (4096, 256, 128, 32)
    K, W, nk2, nw2, _ = _walk_inputs(B, b, d, dev)
    rk2 = nk2.max(-1).values[..., None, None]
    inv = 1.0 / nw2.max(-1).values[..., None, None]
    panels = lambda: [gram_panel(K[..., s:, :], W[..., s:, :], m, rk2, inv, True, None) for s in range(0, b, m)]
    r = paired({"gram_panels": panels}, reps, dev, base="gram_panels")
    entries = B * sum((b - s) * m for s in range(0, b, m))
    t = r["median_s"]["gram_panels"]
    bytes_moved = 12 * 4 * entries
    peak, label = _peak(dev, peak_override)
    gbs = bytes_moved / t / 1e9
    r.update(blocks=B, b=b, d=d, panel=m, panel_entries=entries, bytes_counted=bytes_moved, achieved_GBs=gbs,
             peak_TBs=peak, peak_source=label,
             fraction_of_peak=(gbs / (peak * 1e3)) if peak else None,
             within_2x_of_peak=(bool(gbs >= peak * 1e3 / 2)) if peak else None)
    return r


def bench_streaming(quick, dev, budget):
    from kvbounds.algorithms.balance_kv import BalanceKV
    from kvbounds.algorithms.subgen import SubGen
    from kvbounds.traces.synthetic import make_trace
    logs = [6, 7, 8] if quick else list(range(12, 21))
    N, d = 2 ** logs[-1], 64 if not quick else 16
    tr = make_trace("clustered", n=N, d=d, seed=0, m=32, r=1.0, spread=0.05)
    K, V, Q = (torch.as_tensor(x, dtype=torch.float32, device=dev) for x in (tr.K, tr.V, tr.Q))
    Kb = K / torch.linalg.vector_norm(K, dim=-1, keepdim=True).clamp(min=1.0) * 0.999   # ||k|| <= r = 1 for BalanceKV
    rng = np.random.default_rng(3)
    exact = {}
    for k in logs:
        n = 2 ** k
        js = sorted(set(rng.integers(n // 2 + 1, n + 1, 16 if quick else 32).tolist()))
        f = lambda j: torch.softmax(K[:j] @ Q[j - 1], dim=0) @ V[:j]
        f(js[0])
        exact[n] = statistics.median(_timed(lambda: f(j), dev) for j in js) * 1e6
    streams = {"subgen": (SubGen(d, delta=0.5, s=64, t=16, seed=1),
                          lambda sg, j: (sg.update(K[j], V[j]), sg.query(Q[j]))),
               "balancekv": (BalanceKV(d, batch_size=16, levels=int(math.log2(N / 16)), eps=0.1, r=1.0, seed=1),
                             lambda bk, j: bk.update(Kb[j], V[j]))}
    out = {}
    for name, (state, step) in streams.items():
        times, rows, note, start = np.zeros(N), [], None, time.perf_counter()
        for j in range(N):
            t0 = time.perf_counter()
            step(state, j)
            _sync(dev)
            times[j] = time.perf_counter() - t0
            if (j + 1) in exact:
                n = j + 1
                us = float(times[n // 2:n].mean() * 1e6)
                rows.append(dict(n=n, us_per_token=us, exact_decode_us=exact[n], ratio_to_exact=us / exact[n]))
                if 2 * (time.perf_counter() - start) > budget and n < N:   # the next checkpoint doubles n
                    note = f"stopped after n = {n}: n = {2 * n} would exceed the {budget:.0f} s budget"
                    break
        out[name] = dict(rows=rows, note=note)
    return dict(d=d, trace="clustered m = 32", exact_us=exact, streams=out)


def bench_fd(quick, dev, reps):
    from kvbounds.algorithms.frequent_directions import FrequentDirections
    d, ell, rows = (128, 16, 512) if quick else (4096, 128, 16384)
    A = torch.randn(rows, d, generator=torch.Generator().manual_seed(4)).to(dev)

    def fd():
        FrequentDirections(d, ell).update(A)

    def cov():
        C = torch.zeros(d, d, device=dev)
        for s in range(0, rows, 2 * ell):
            X = A[s:s + 2 * ell]
            C += X.T @ X
    r = paired({"fd_update": fd, "exact_covariance": cov}, reps, dev, base="exact_covariance")
    r.update(d=d, ell=ell, rows=rows, fd_rows_per_s=rows / r["median_s"]["fd_update"],
             covariance_rows_per_s=rows / r["median_s"]["exact_covariance"])
    return r


SECTIONS = ("walk", "blockwise", "bandwidth", "streaming", "fd", "e2e")


def _print(name, res):
    if name == "e2e":
        bench_gpu_e2e.print_e2e(res)
    elif name == "walk":
        print(f"walk: {res['blocks']} blocks x b = {res['b']}, d = {res['d']}; median s, paired ratio to batched_exact")
        for k, v in res["median_s"].items():
            print(f"  {k:<24} {v:10.4f} s  ratio {res['paired_ratio'][k]:7.3f}")
        print(f"  per-block loop scaled to all blocks: {res['per_block_loop_scaled_s']:.4f} s; speedups "
              + ", ".join(f"{k} {v:.1f}x" for k, v in res["speedup_vs_per_block_loop"].items()))
        for m, o in res["ops_per_step"].items():
            print(f"  {m}: {o['per_step']:.2f} {o['unit']} per step")
        print(f"  signs equal to the reference: {res['signs_equal_reference']}")
    elif name == "blockwise":
        for dt, r in res["dtypes"].items():
            print(f"blockwise {res['heads']} heads x {res['n']} x d = {res['d']}, b = {res['block_size']}, "
                  f"T = {res['levels']}, {dt}:")
            for k, v in r["median_s"].items():
                print(f"  {k:<16} {v:10.4f} s  ratio to released {r['paired_ratio'][k]:7.3f}")
            print(f"  {r['best_ours']}: {r['speedup_vs_released']:.2f}x faster than released "
                  f"(target >= {SPEEDUP_TARGET}: {'met' if r['speedup_target_met'] else 'not met'}); "
                  f"{r['ratio_to_sdpa']:.3f}x of SDPA (target <= {SDPA_TARGET}: "
                  f"{'met' if r['sdpa_target_met'] else 'not met'})")
    elif name == "bandwidth":
        f = res["fraction_of_peak"]
        print(f"Gram panels: {res['blocks']} blocks x b = {res['b']}: {res['median_s']['gram_panels']:.4f} s, "
              f"{res['achieved_GBs']:.3g} GB/s counted; peak {res['peak_source']}"
              + (f"; {f:.2f} of peak (within 2x: {'met' if res['within_2x_of_peak'] else 'not met'})" if f else ""))
    elif name == "streaming":
        for s, r in res["streams"].items():
            print(f"{s} per token vs exact decode (d = {res['d']}):")
            for row in r["rows"]:
                print(f"  n = {row['n']:>8} {row['us_per_token']:9.1f} us  exact {row['exact_decode_us']:9.1f} us  "
                      f"ratio {row['ratio_to_exact']:.3f}")
            if r["note"]:
                print(f"  note: {r['note']}")
    elif name == "fd":
        print(f"FD d = {res['d']}, ell = {res['ell']}: {res['fd_rows_per_s']:.0f} rows/s; exact covariance "
              f"{res['covariance_rows_per_s']:.0f} rows/s; paired ratio fd/cov {res['paired_ratio']['fd_update']:.2f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="reduced sizes (CPU smoke run, well under a minute)")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    ap.add_argument("--reps", type=int, default=None, help="interleaved repetitions (default 3 quick, 7 full)")
    ap.add_argument("--warmup", type=int, default=1, help="warm-up calls of each candidate before the repetitions")
    ap.add_argument("--stream-budget", type=float, default=200.0, help="seconds per stream in 'streaming'")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="dtypes of the 'blockwise' cache")
    ap.add_argument("--peak-tbs", type=float, default=None, help="device peak memory bandwidth, TB/s")
    ap.add_argument("--e2e-n", type=int, default=None, help="prompt tokens in 'e2e' (default 4096, quick 256)")
    ap.add_argument("--out", type=output_path, default=None)
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device visible")
    only = [s for s in args.only.split(",") if s]
    bad = set(only) - set(SECTIONS)
    if bad:
        ap.error(f"unknown section(s) {sorted(bad)}; choose from {SECTIONS}")
    reps = args.reps or (3 if args.quick else 7)
    dev = args.device
    WARMUP[0] = args.warmup
    meta = dict(device=dev, device_name=torch.cuda.get_device_name() if dev == "cuda" else platform.processor(),
                quick=args.quick, torch=torch.__version__, torch_threads=torch.get_num_threads(), reps=reps,
                warmup=args.warmup,
                time=time.strftime("%Y-%m-%dT%H:%M:%S"))
    results = {}
    runners = {"walk": lambda: bench_walk(args.quick, dev, reps),
               "blockwise": lambda: bench_blockwise(args.quick, dev, reps, tuple(args.dtypes.split(","))),
               "bandwidth": lambda: bench_bandwidth(args.quick, dev, reps, args.peak_tbs),
               "streaming": lambda: bench_streaming(args.quick, dev, args.stream_budget),
               "fd": lambda: bench_fd(args.quick, dev, reps),
               "e2e": lambda: bench_gpu_e2e.bench_e2e(args.quick, dev, reps, paired, args.e2e_n)}
    for s in only:
        t0 = time.perf_counter()
        results[s] = runners[s]()
        results[s]["wall_s"] = time.perf_counter() - t0
        _print(s, results[s])
    out = args.out or ROOT / "benchmarks" / "results" / f"bench_gpu_{dev}{'_quick' if args.quick else ''}.json"
    from kvbounds.core import write_output       # never onto a result store's files; atomic
    write_output(out, json.dumps(dict(meta=meta, results=results), indent=2, default=float))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Shared measurement plumbing for benchmarks/bench_*.py. Every baseline is written in the benchmarks (none is
imported from the package); each lives in its own bench file, except one exact decode step
(:func:`exact_decode_step`), the yardstick of three of them.

* :func:`threads` fixes the thread count of every BLAS/OpenMP pool (threadpoolctl) and of torch's intra-op pool;
* :func:`paired` runs the candidates in interleaved repetitions (the order rotates every repetition, so a drift in
  machine load hits all alike) and reports, per candidate, the median time and the median of the *paired*
  per-repetition ratios to the baseline with its spread (25th/75th percentiles, min/max);
* :func:`target` turns a measured value and a target into a line saying met / NOT met;
* :func:`load` records the machine's load average next to each measurement; :func:`write` writes the JSON;
* :func:`accuracy_stream` / :func:`stream_accuracy`: the accuracy part of the streaming benchmarks (a real trace
  when cached, else a clustered synthetic stream; errors at 16 steps next to the all-zero estimator's).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"



def exact_decode_step(q, K, V, *, scale: float | None = None):
    """One exact decode step over the cached K, V, as a user would write it: softmax(scale K q)^T V, with
    scale 1/sqrt(d) by default (BalanceKV's and the subspace draft's convention; SubGen's is scale = 1)."""
    s = K @ q
    scale = 1.0 / math.sqrt(q.shape[0]) if scale is None else scale
    if scale != 1.0:
        s *= scale
    s -= s.max()
    np.exp(s, out=s)
    return (s @ V) / s.sum()

@contextlib.contextmanager
def threads(n: int):
    """Every BLAS/OpenMP pool and torch's intra-op pool limited to ``n`` threads inside the block."""
    from threadpoolctl import threadpool_limits
    torch = sys.modules.get("torch")
    old = torch.get_num_threads() if torch is not None else None
    with threadpool_limits(limits=n):
        if torch is not None:
            torch.set_num_threads(n)
        try:
            yield
        finally:
            if torch is not None:
                torch.set_num_threads(old)


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _spread(x) -> dict:
    x = np.asarray(x, float)
    return dict(median=float(np.median(x)), q25=float(np.percentile(x, 25)), q75=float(np.percentile(x, 75)),
                min=float(x.min()), max=float(x.max()))


def paired(fns: dict, *, baseline: str, reps: int, warmup: int = 1, per_call: dict | None = None,
           clock: str = "wall") -> dict:
    """Time every ``fns[name]()`` ``reps`` times, interleaved (rotating order); ``per_call[name]`` divides a
    candidate's time (e.g. rows or tokens per call, for a per-unit cost). Returns {name: {time: spread of seconds
    per unit, ratio: spread of the paired ratios to ``baseline`` (per unit)}, ..., "load": [before, after]}.
    ``clock="cpu"``: the calling thread's CPU time (single-threaded work only): a descheduled stretch on a
    loaded machine does not count, so short and long candidates are measured alike. ``clock="process"``: the
    process's CPU time, all threads (multi-threaded work, e.g. torch at 2 threads; the e2e harness's clock)."""
    now = {"cpu": time.thread_time, "process": time.process_time}.get(clock, time.perf_counter)
    names = list(fns)
    per_call = per_call or {}
    for _ in range(warmup):
        for k in names:
            fns[k]()
    ts = {k: [] for k in names}
    ws = {k: [] for k in names}                       # wall seconds of the same calls (equal to ts for "wall")
    load0 = load()
    for r in range(reps):
        order = names[r % len(names):] + names[:r % len(names)]
        for k in order:
            t0, w0 = now(), time.perf_counter()
            fns[k]()
            ts[k].append((now() - t0) / per_call.get(k, 1))
            ws[k].append((time.perf_counter() - w0) / per_call.get(k, 1))
    out = {}
    base, wbase = np.asarray(ts[baseline]), np.asarray(ws[baseline])
    for k in names:
        out[k] = dict(time=_spread(ts[k]), ratio=_spread(np.asarray(ts[k]) / base), times=ts[k])
        if clock != "wall":
            out[k].update(wall_time=_spread(ws[k]), wall_ratio=_spread(np.asarray(ws[k]) / wbase))
    out["load"] = [load0, load()]
    out["clock"] = clock
    out["baseline"] = baseline
    out["interleaving"] = (f"{reps} repetitions after {warmup} warm-up(s); every candidate once per repetition, the "
                           f"order rotating by one each time; ratios paired per repetition")
    out["threads"] = thread_counts()
    return out


def thread_counts() -> dict:
    """The thread counts in force: each BLAS/OpenMP pool's (threadpoolctl) and torch's intra-op pool's."""
    from threadpoolctl import threadpool_info
    torch = sys.modules.get("torch")
    return dict(pools={f"{p.get('internal_api')}:{Path(p.get('filepath', '')).name}": p.get("num_threads")
                       for p in threadpool_info()},
                torch=torch.get_num_threads() if torch is not None else None)


def fmt_ratio(r: dict) -> str:
    """'0.123 [0.110-0.130]' : median of the paired ratios [25th-75th percentile]."""
    return f"{r['median']:.3f} [{r['q25']:.3f}-{r['q75']:.3f}]"


def target(name: str, value: float, op: str, goal: float, spread: dict | None = None, note: str = "") -> dict:
    """A target line: ``value op goal`` (op '<=' or '>='), printed as met / NOT met."""
    met = bool(value <= goal) if op == "<=" else bool(value >= goal)
    sp = f" [{spread['q25']:.3g}-{spread['q75']:.3g}]" if spread else ""
    print(f"  TARGET {name}: {value:.3g}{sp} {op} {goal:g}: {'met' if met else 'NOT met'}{'  (' + note + ')' if note else ''}")
    return dict(name=name, value=float(value), op=op, goal=goal, met=met, spread=spread, note=note)


def meta(**kw) -> dict:
    torch = sys.modules.get("torch")
    return dict(python=platform.python_version(), numpy=np.__version__,
                torch=getattr(torch, "__version__", None), machine=platform.machine(), cpu_count=os.cpu_count(),
                time=time.strftime("%Y-%m-%dT%H:%M:%S"), load=load(), **kw)


def output_path(value: str) -> Path:
    """The ``type`` of a benchmark's ``--out``: the path checked when the arguments are parsed, before any work
    (:func:`kvbounds.core.check_output`): a device (/dev/null), a FIFO, a socket, a directory, a result
    store's file or a path inside a result store is refused by argparse, exit 2 naming it."""
    import argparse
    from kvbounds.core import OutputRefused, check_output
    try:
        check_output(value)
    except OutputRefused as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return Path(value)


def write(name: str, quick: bool, data: dict, out: Path | None = None) -> Path:
    out = Path(out) if out else RESULTS / (f"{name}_{quick}.json" if quick else f"{name}.json")
    from kvbounds.core import write_output       # never onto a result store's files; atomic
    write_output(out, json.dumps(data, indent=2, default=float))
    print(f"wrote {out}")
    return out


def stream_pairing(chunk: int = 256) -> dict:
    """The baseline and interleaving of :func:`stream_vs_exact`, for a benchmark's JSON metadata."""
    return dict(baseline="one exact decode step at the current length (the exact step the benchmark passes; mean of 3)",
                interleaving=f"the stream in chunks of {chunk} tokens, each chunk followed by the exact step at its "
                             f"length; one paired ratio per chunk (mean per-token cost / exact step)")


def stream_vs_exact(est, K, V, Q, exact_step, exps, chunk: int = 256) -> list[dict]:
    """Streaming estimator ``est`` (update(k, v) then query(q) per token) against ``exact_step(q, K[:m], V[:m])``:
    the stream runs in chunks of ``chunk`` tokens; after each chunk the exact step at the current length is timed
    (mean of 3), so each chunk gives a paired ratio (mean per-token cost over the chunk / exact step). Both
    clocks: wall time, and the thread's CPU time (the headline: on a loaded machine a 250 ms chunk is
    descheduled in proportion to the load while a 1 ms exact step often runs uninterrupted, which biases wall
    ratios against the streaming side; CPU time counts only the work). For each n = 2^e: the amortised (mean)
    per-token cost over (n/2, n] and over [1, n], the exact step's time there, and the median of the chunks'
    paired ratios in (n/2, n] with its spread, per clock."""
    n_max = 2 ** exps[-1]
    t_all = np.empty(n_max)
    chunks = []
    for start in range(0, n_max, chunk):
        w0, c0 = time.perf_counter(), time.thread_time()
        for j in range(start, start + chunk):
            est.update(K[j], V[j])
            est.query(Q[j])
        w_tok, c_tok = (time.perf_counter() - w0) / chunk, (time.thread_time() - c0) / chunk
        t_all[start:start + chunk] = c_tok
        m = start + chunk
        w0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(3):
            exact_step(Q[m - 1], K[:m], V[:m])
        chunks.append((m, c_tok, (time.thread_time() - c0) / 3, w_tok, (time.perf_counter() - w0) / 3))
    rows = []
    for e in exps:
        n = 2 ** e
        sel = [c[1:] for c in chunks if n // 2 < c[0] <= n]
        rows.append(dict(n=n, mean_us_per_token=float(np.mean([c[0] for c in sel]) * 1e6),
                         mean_us_per_token_all=float(t_all[:n].mean() * 1e6),
                         exact_step_us=float(np.median([c[1] for c in sel]) * 1e6),
                         ratio=_spread([c[0] / c[1] for c in sel]),
                         wall_mean_us_per_token=float(np.mean([c[2] for c in sel]) * 1e6),
                         wall_exact_step_us=float(np.median([c[3] for c in sel]) * 1e6),
                         wall_ratio=_spread([c[2] / c[3] for c in sel]),
                         chunks=len(sel), load=load()))
    return rows


def print_stream(rows) -> None:
    print("  CPU time of the thread (wall-clock ratio alongside)")
    print(f"  {'n':>7} {'mean us/tok (n/2,n]':>20} {'mean us/tok [1,n]':>18} {'exact step us':>14} "
          f"{'ratio [q25-q75]':>24} {'wall ratio [q25-q75]':>24}  load")
    for r in rows:
        print(f"  {r['n']:>7} {r['mean_us_per_token']:>20.1f} {r['mean_us_per_token_all']:>18.1f} "
              f"{r['exact_step_us']:>14.1f} {fmt_ratio(r['ratio']):>24} {fmt_ratio(r['wall_ratio']):>24}  {r['load']}")


def accuracy_stream(n: int):
    """The SmolLM2 trace of layer 3, head 0 (if the model package and its cached trace are there), else the claims'
    clustered synthetic stream (d = 64, 32 clusters)."""
    try:
        from kvbounds.traces.real import trace_from_spec
        tr = trace_from_spec(f"smollm2:L3:H0:{n}", missing="none")
    except Exception:          # no model package or no cached trace
        tr = None
    if tr is None:
        from kvbounds.traces.synthetic import make_trace
        tr = make_trace("clustered", n=n, d=64, seed=0, m=32, r=1.0, spread=0.05)
    return tr


def stream_accuracy(est, tr, *, scaled: bool = True, v_norm: str = "fro") -> dict:
    """Stream ``tr`` through ``est`` (update(k, v), query(q)); at 16 steps in [n/8, n]: the relative error
    ||z - Attn|| / ||Attn||, the error in the papers' units ||z - Attn|| / (||softmax||_2 ||V||) (``v_norm``:
    "fro" or "2", the spectral norm), and the all-zero estimator's error in the same units."""
    K, V, Q = tr.K, tr.V, tr.Q
    n, d = K.shape
    steps = set(np.linspace(n // 8, n, 16, dtype=int).tolist())
    rel, paper, zero = [], [], []
    for j in range(1, n + 1):
        est.update(K[j - 1], V[j - 1])
        if j in steps:
            z = est.query(Q[j - 1])
            s = K[:j] @ Q[j - 1] * (1 / math.sqrt(d) if scaled else 1.0)
            p = np.exp(s - s.max())
            p /= p.sum()
            a = p @ V[:j]
            unit = float(np.linalg.norm(p) * (np.linalg.norm(V[:j]) if v_norm == "fro" else np.linalg.norm(V[:j], 2)))
            err = float(np.linalg.norm(z - a))
            rel.append(err / float(np.linalg.norm(a)))
            paper.append(err / unit)
            zero.append(float(np.linalg.norm(a)) / unit)
    return dict(trace=tr.meta.get("spec", tr.meta.get("kind")), n=n, steps=sorted(steps),
                relative_error_median=float(np.median(rel)), paper_units_median=float(np.median(paper)),
                zero_estimator_paper_units_median=float(np.median(zero)), relative_error=rel, paper_units=paper,
                zero_estimator_paper_units=zero)

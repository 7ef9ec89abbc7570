"""Real-trace extraction speed: seconds per 1000 tokens for SmolLM2 and MiniLM (a script, not a test).

For each model and length, the forward pass that captures every layer's q/k/v (what ``kvbounds traces
extract`` runs), timed after one warm-up run at the first length, torch CPU with all cores; the model load (GGUF read and
dequantisation for SmolLM2) is reported once, separately. No cache is read or written: the forward pass
itself is timed, plus the float64 verification of every layer (attention recomputed from the captured
q/k/v) as a separate figure.

Usage: python benchmarks/bench_traces.py [--quick] [--lengths 512,2048,8192] [--out PATH]
Writes JSON to benchmarks/results/bench_traces.json (--quick: bench_traces_quick.json, lengths 512,2048).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from kvbounds.traces import real  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from _harness import output_path  # noqa: E402


def bench_model(model: str, lengths: list[int]) -> dict:
    why = real.available(model)
    if why:
        return {"skipped": why}
    t0 = time.perf_counter()
    m = real.load_real_model(model)
    load_s = time.perf_counter() - t0
    ids = m.encode(real.default_text())
    layers = list(range(real.MODEL_INFO[model]["n_layers"]))
    out = {"load_s": load_s, "runs": []}
    for i, n in enumerate(lengths):
        if model == "smollm2":
            run = lambda: m.forward(ids[:n], capture=layers)
        else:
            segs = m.segments(ids, n)
            run = lambda: [m.forward(s, capture=layers) for s in segs]
        if i == 0:
            run()   # warm-up (allocator, kernels), once
        t = time.perf_counter()
        res = run()
        fwd = time.perf_counter() - t
        caps = res[1] if model == "smollm2" else None
        t = time.perf_counter()
        if caps is not None:
            with real.single_blas_thread():
                for l in layers:
                    real.verify_layer(model, caps[l])
        ver = time.perf_counter() - t
        row = {"n": n, "forward_s": fwd, "s_per_1000_tokens": fwd / n * 1000, "verify_all_layers_s": ver}
        if model == "smollm2":
            from kvbounds.traces.smollm2 import perplexity
            row["perplexity"] = perplexity(res[0])
        out["runs"].append(row)
        print(f"{model:8s} n={n:5d}: forward {fwd:6.2f} s = {row['s_per_1000_tokens']:5.2f} s / 1000 tokens"
              + (f", verify {ver:5.2f} s, perplexity {row['perplexity']:.2f}" if model == "smollm2" else ""), flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--lengths", default=None)
    ap.add_argument("--out", type=output_path, default=None)
    a = ap.parse_args(argv)
    lengths = [int(x) for x in a.lengths.split(",")] if a.lengths else ([512, 2048] if a.quick else [512, 2048, 8192])
    torch.set_num_threads(os.cpu_count() or 1)
    res = {"machine": {"cpus": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
                       "processor": platform.processor()},
           "meta": {"baseline": "none: absolute seconds per 1000 tokens of one forward pass",
                    "interleaving": "none: the lengths in order, each once, after one warm-up run at the first length",
                    "torch_threads": torch.get_num_threads(), "verify_blas_threads": 1},
           "smollm2": bench_model("smollm2", lengths), "minilm": bench_model("minilm", lengths)}
    out = Path(a.out) if a.out else ROOT / "benchmarks" / "results" / f"bench_traces{'_quick' if a.quick else ''}.json"
    from kvbounds.core import write_output       # never onto a result store's files; atomic
    write_output(out, json.dumps(res, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

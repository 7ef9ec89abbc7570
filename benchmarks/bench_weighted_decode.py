"""Decode time per token of the weighted attention (issue 22) beside exact SDPA, on the CPU. A script.

One decode step (one query token) of one attention layer with SmolLM2-135M's shapes (9 query heads, 3 KV heads,
head_dim 64, float32, batch 1), through the functions transformers calls:

* ``exact``: transformers' ``sdpa_attention_forward`` over n cached tokens (the default attention);
* ``exact_grouped``: SDPA alone over the same tokens, each KV group's query heads stacked (no copy of K, V);
* ``weighted``: :func:`kvbounds.e2e._attention.weighted_attention_forward` over a
  :class:`~kvbounds.e2e.WeightedLayer` of n tokens with equal weights a = b (one SDPA call, bias a);
* ``weighted_split``: the same with a != b (SubGen, the released walk: bias max(a, b), values + one column);
* ``weighted_quarter``: equal weights over n/4 stored tokens (a cache compressed to budget 0.25).

Interleaved repetitions, one thread, the thread's CPU time (_harness.paired, clock="cpu"); medians and the paired
ratios to ``exact``. Per token = per layer x 30 layers (the model's attention only; projections and MLP excluded).

Usage: python benchmarks/bench_weighted_decode.py [--quick] [--out PATH]
Writes JSON to benchmarks/results/bench_weighted_decode.json (--quick: bench_weighted_decode_quick.json).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (str(ROOT), str(ROOT / "benchmarks")):
    if p not in sys.path:
        sys.path.insert(0, p)

import torch  # noqa: E402
from _harness import fmt_ratio, meta, output_path, paired, threads, write  # noqa: E402
from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: E402

from kvbounds.e2e._attention import weighted_attention_forward  # noqa: E402
from kvbounds.e2e import WeightedLayer  # noqa: E402

H, HKV, D, LAYERS = 9, 3, 64, 30


class _Module:                     # what the attention functions read from the attention module
    num_key_value_groups = H // HKV
    is_causal = True
    training = False


def _step(kind: str, n: int, g: torch.Generator):
    q = torch.randn(1, H, 1, D, generator=g)
    K, V = torch.randn(1, HKV, n, D, generator=g), torch.randn(1, HKV, n, D, generator=g)
    kq, vq = torch.randn(1, HKV, 1, D, generator=g), torch.randn(1, HKV, 1, D, generator=g)
    mod, scale = _Module(), D ** -0.5
    if kind == "exact":
        keys, values = torch.cat([K, kq], 2), torch.cat([V, vq], 2)
        return lambda: sdpa_attention_forward(mod, q, keys, values, None, scaling=scale)
    if kind == "exact_grouped":
        keys, values = torch.cat([K, kq], 2), torch.cat([V, vq], 2)
        qg = q.reshape(1, HKV, H // HKV, D)
        return lambda: torch.nn.functional.scaled_dot_product_attention(qg, keys, values, scale=scale)
    a = torch.randn(1, HKV, n, generator=g) * 0.5
    b = a + 0.3 * torch.randn(1, HKV, n, generator=g) if kind == "weighted_split" else a.clone()
    layer = WeightedLayer(K, V, a, b, logical_length=4 * n if kind == "weighted_quarter" else 2 * n)
    keys, values = layer.update(kq, vq)

    def run():
        setattr(keys, "_kvbounds_layer", layer)     # the hand-off update() makes at every decode step
        return weighted_attention_forward(mod, q, keys, values, None, scaling=scale)
    return run


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=output_path, default=None)
    args = ap.parse_args(argv)
    lengths = [4096, 16384] if args.quick else [4096, 16384, 65536]
    reps = 7 if args.quick else 21
    rows = []
    with threads(1), torch.no_grad():
        for n in lengths:
            g = torch.Generator().manual_seed(n)
            fns = {"exact": _step("exact", n, g), "exact_grouped": _step("exact_grouped", n, g), "weighted": _step("weighted", n, g),
                   "weighted_split": _step("weighted_split", n, g), "weighted_quarter": _step("weighted_quarter", n // 4, g)}
            res = paired(fns, baseline="exact", reps=reps, warmup=2, clock="cpu")
            row = dict(n=n, load=res["load"])
            for k in fns:
                row[k] = dict(ms_per_layer=res[k]["time"]["median"] * 1e3,
                              ms_per_token=res[k]["time"]["median"] * 1e3 * LAYERS,
                              ratio_to_exact=res[k]["ratio"])
            rows.append(row)
            print(f"n = {n:6d}: exact {row['exact']['ms_per_token']:.2f} ms/token; "
                  + "; ".join(f"{k} {row[k]['ms_per_token']:.2f} ms ({fmt_ratio(row[k]['ratio_to_exact'])}x)"
                              for k in fns if k != "exact"))
    data = dict(meta=meta(threads=1, clock="thread CPU time", shapes=dict(H=H, Hkv=HKV, d=D, layers=LAYERS)),
                rows=rows)
    write("bench_weighted_decode", args.quick, data, args.out)
    return data


if __name__ == "__main__":
    main()

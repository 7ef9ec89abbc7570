"""Regression tests of issue 24 (reliability of the newer surfaces): each example of the issue, as found by fuzzing,
with the answer it must now give (the right value, or an InputError naming the argument and the rule)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from kvbounds.algorithms import compressor_adapters as ca
from kvbounds.algorithms import token_selection as ts
from kvbounds.algorithms.validation import InputError

torch = pytest.importorskip("torch")


# -- CompressedKV.estimate ---------------------------------------------------------------------------------------

def _cache(H=1, m=4, d=3, seed=0):
    rng = np.random.default_rng(seed)
    K, V = rng.standard_normal((H, m, d)), rng.standard_normal((H, m, d))
    z = np.zeros((H, m))
    return ts.CompressedKV(K, V, z, z.copy()), K, V


def _softmax(q, K, V, scale):
    l = q @ K.T * scale
    w = np.exp(l - l.max())
    return w @ V / w.sum()


@pytest.mark.parametrize("bad, match", [
    (dict(q=np.array([[[np.nan, 0.0, 1.0]]] * 2)), "q contains NaN"),
    (dict(q=np.ones((2, 1, 3)), scale=math.nan), "scale"),
    (dict(q=np.ones((2, 1, 4))), "last dimension 4, expected 3"),
    (dict(q=np.ones((2, 1, 3), dtype=np.int64)), "real floating"),
    (dict(q=np.ones((5, 1, 3))), "does not broadcast"),
])
def test_estimate_refuses_bad_queries(bad, match):
    c, _, _ = _cache(H=2)
    with pytest.raises(InputError, match=match):
        c.estimate(bad.pop("q"), **bad)


def test_estimate_empty_denominator_is_refused_empty_numerator_is_zero():
    c, K, V = _cache()
    c.log_w_den[:] = -np.inf
    with pytest.raises(InputError, match="denominator has no token"):
        c.estimate(np.ones((1, 1, 3)))
    c, K, V = _cache()
    c.log_w_num[:] = -np.inf                         # nothing in the numerator: the sum over no token is 0
    np.testing.assert_array_equal(c.estimate(np.ones((1, 1, 3))), 0.0)
    c0 = ts.CompressedKV(np.zeros((1, 0, 3)), np.zeros((1, 0, 3)), np.zeros((1, 0)), np.zeros((1, 0)))
    with pytest.raises(InputError, match="denominator has no token"):
        c0.estimate(np.ones((1, 1, 3)))


def test_estimate_log_gap_above_709_is_exact():
    """Numerator logit 800, denominator logit 0, value 1e-100: Attn_hat = e^800 1e-100 ~ 1e247 (finite); the old
    ``num / den * exp(mn - md)`` gave inf. A gap beyond float64's range is refused by name."""
    K = np.array([[[800.0], [0.0]]])
    V = np.array([[[1e-100], [5.0]]])
    a, b = np.array([[0.0, -np.inf]]), np.array([[-np.inf, 0.0]])
    c = ts.CompressedKV(K, V, a, b)
    out = c.estimate(np.ones((1, 1, 1)), scale=1.0)
    assert math.isclose(float(out[0, 0, 0]), math.exp(800 - 100 * math.log(10)), rel_tol=1e-12)
    c.values[0, 0, 0] = 1.0
    with pytest.raises(InputError, match="exceeds float64's range"):
        c.estimate(np.ones((1, 1, 1)), scale=1.0)


def test_estimate_matches_softmax_on_numpy_and_torch():
    c, K, V = _cache(H=2, m=5, d=3)
    q = np.random.default_rng(1).standard_normal((2, 2, 3))
    ref = np.stack([np.stack([_softmax(q[h, j], K[h], V[h], 3 ** -0.5) for j in range(2)]) for h in range(2)])
    np.testing.assert_allclose(c.estimate(q), ref, rtol=1e-12)
    np.testing.assert_allclose(c.estimate(torch.as_tensor(q)), ref, rtol=1e-12)


def test_subgen_compressor_estimate_at_key_norm_1e3_is_finite_or_refused():
    rng = np.random.default_rng(0)
    K, V = rng.standard_normal((1, 40, 4)) * 1e3, rng.standard_normal((1, 40, 4))
    c = ca.SubGenCompressor(sink=1, window=1).compress(K, V, budget_floats=200, rng=np.random.default_rng(1))
    for _ in range(20):
        try:
            assert np.isfinite(c.estimate(rng.standard_normal((1, 3, 4)) * 1e3)).all()
        except InputError as e:
            assert "range" in str(e)


# -- budgets of the subspace and SubGen compressors ----------------------------------------------------------------

@pytest.mark.parametrize("cls", [ca.SubGenCompressor, ca.SubspaceCompressor])
def test_compressors_never_exceed_their_budget(cls):
    """Issue 24: 192 floats held for a budget of 80, 154 for 130. Now: at most the budget per head, or an
    InputError saying how many floats the minimum needs."""
    rng = np.random.default_rng(0)
    fitted = refused = 0
    for H, n, d in ((1, 16, 4), (2, 40, 8), (1, 13, 3)):
        K, V = rng.standard_normal((H, n, d)), rng.standard_normal((H, n, d))
        for budget in range(10, 400, 9):
            try:
                out = cls(sink=1, window=1).compress(K, V, budget_floats=budget, rng=np.random.default_rng(1))
            except InputError as e:
                assert "budget" in str(e)
                refused += 1
                continue
            assert ts.memory_floats(out) <= budget * H, (H, n, d, budget)
            fitted += 1
    assert fitted and refused


def test_subspace_budget_80_is_refused_with_the_minimum():
    K = np.random.default_rng(0).standard_normal((1, 40, 8))
    with pytest.raises(InputError, match="rank 1 needs"):
        ca.SubspaceCompressor(sink=1, window=1).compress(K, K, budget_floats=80)


# -- SubGen(replicas=1).query ----------------------------------------------------------------------------------

@pytest.mark.parametrize("replicas, shape", [(None, (2,)), (1, (1, 2)), (3, (3, 2))])
def test_subgen_query_shape_is_the_same_on_numpy_and_torch(replicas, shape):
    from kvbounds.algorithms.subgen import SubGen
    rng = np.random.default_rng(0)
    K, V, q = rng.standard_normal((6, 3)), rng.standard_normal((6, 2)), rng.standard_normal(3)
    outs = []
    for conv in (np.asarray, torch.as_tensor):
        sg = SubGen(3, delta=0.5, s=2, t=2, seed=0, replicas=replicas)
        for j in range(6):
            sg.update(conv(K[j]), conv(V[j]))
        out = sg.query(conv(q))
        assert tuple(out.shape) == shape
        outs.append(np.asarray(out))
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-12)


# -- the batched walk and panel_walk -----------------------------------------------------------------------------

def _walk_args(rng, lead=(2,), b=8, d=3, e=2):
    from kvbounds.algorithms.self_balancing_walk import walk_constant
    K = rng.standard_normal(lead + (b, d)) * d ** -0.25
    W = rng.standard_normal(lead + (b, e))
    return [K, W, (K * K).sum(-1), (W * W).sum(-1) + 1.0, rng.random(lead + (b,)), walk_constant(b, 0.01)]


@pytest.mark.parametrize("fn", ["panel_walk", "walk_signs"])
@pytest.mark.parametrize("where, value, match", [
    (0, "nan", "Kb contains NaN"), (1, "inf", "Wb contains NaN or Inf"), (5, math.nan, "c must be a finite"),
    (5, 0.0, "c must be > 0"), (5, "1", "c must be a real"), (4, "big", r"uniforms must lie in \[0, 1\)"),
    (2, "neg", "squared norms"), (0, "int", "real floating"), (0, "complex", "real floating"),
    (4, "short", "uniforms must have shape"), ("panel", 0, "panel must be an integer >= 1"),
    ("panel", 2.5, "panel must be an integer"), ("plus_one", "yes", "plus_one must be a bool")])
def test_walks_check_their_arguments(fn, where, value, match):
    """Issue 24: panel_walk (public, re-exported) checked nothing: NaN keys gave signs, panel = 0 divided by zero,
    c = NaN was accepted. Both walks now refuse by name."""
    from kvbounds.algorithms.blockwise_balance_kv import panel_walk
    from kvbounds.gpu.batched_walk import walk_signs
    walk = dict(panel_walk=panel_walk, walk_signs=walk_signs)[fn]
    args, kw = _walk_args(np.random.default_rng(0)), dict(plus_one=True)
    if isinstance(where, str):
        kw[where] = value
    elif value == "nan":
        args[where][0, 1, 0] = np.nan
    elif value == "inf":
        args[where][1, 0, 1] = np.inf
    elif value == "big":
        args[where][0, 0] = 1.0
    elif value == "neg":
        args[where][0, 0] = -1.0
    elif value == "int":
        args[where] = (args[where] * 3).astype(np.int64)
    elif value == "complex":
        args[where] = args[where] + 1j
    elif value == "short":
        args[where] = args[where][..., :4]
    else:
        args[where] = value
    with pytest.raises(InputError, match=match):
        walk(*args, **kw)


def test_walk_signs_equal_panel_walk_after_the_checks():
    from kvbounds.algorithms.blockwise_balance_kv import panel_walk
    from kvbounds.gpu.batched_walk import walk_signs
    args = _walk_args(np.random.default_rng(3), lead=(3,), b=16)
    ref, _ = panel_walk(*args, plus_one=True)
    np.testing.assert_array_equal(walk_signs(*args, plus_one=True)[0], ref)


def _trials(seed=0, trials=2, heads=1, n=8, d=3):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((trials, heads, n, d)), rng.standard_normal((trials, heads, n, d))


@pytest.mark.parametrize("kw, match", [
    (dict(levels=2.5), "levels must be an integer"), (dict(levels=math.nan), "levels must be an integer"),
    (dict(rngs=None), "rngs must be a sequence"), (dict(V="list"), "V must be an array"),
    (dict(K="int"), "K must have a real floating dtype"), (dict(K="complex"), "K must have a real floating dtype"),
    (dict(levels=-1), "levels must be an integer >= 0"), (dict(block_size=3), "block_size must be an even"),
    (dict(c=math.nan), "c must be a finite"), (dict(method="fast"), "method must be one of")])
def test_batched_select_refuses_bad_arguments(kw, match):
    from kvbounds.gpu.batched_walk import batched_select
    K, V = _trials()
    args = dict(K=K, V=V, block_size=4, levels=1, rngs=[np.random.default_rng(i) for i in range(2)])
    for k, v in kw.items():
        args[k] = {"list": V.tolist(), "int": (K * 3).astype(np.int64), "complex": K + 1j}.get(v, v) \
            if isinstance(v, str) and k in ("K", "V") else v
    with pytest.raises(InputError, match=match):
        batched_select(**args)


def test_batched_select_block_far_above_n_answers_at_once_and_equals_the_reference():
    """Issue 24: block_size = 2^20 on 8 tokens ran for minutes (every step over the padded block); now it walks
    the real tokens only, drawing the same coins as blockwise_balance_select, which it equals trial by trial."""
    import time
    from kvbounds.algorithms.blockwise_balance_kv import blockwise_balance_select
    from kvbounds.gpu.batched_walk import batched_select
    K, V = _trials(trials=3, heads=2, n=9)
    for b, levels in ((2 ** 20, 2), (16, 1), (10, 3)):
        t0 = time.perf_counter()
        out = batched_select(K, V, block_size=b, levels=levels, rngs=[np.random.default_rng(i) for i in range(3)])
        assert time.perf_counter() - t0 < 5.0
        for t in range(3):
            ref = blockwise_balance_select(K[t], V[t], block_size=b, levels=levels, rng=np.random.default_rng(t))
            np.testing.assert_array_equal(out[t], ref)


# -- overflow: blockwise softmax, softmax concatenation, calibrate_gamma --------------------------------------------

@pytest.mark.parametrize("fn", ["blockwise_softmax", "softmax_concat"])
def test_softmax_of_values_near_float_max_is_finite(fn):
    """Issue 24: w^T V summed values near 1.8e308 to inf; the softmax average (a convex combination) is finite."""
    from kvbounds.algorithms import blockwise_softmax as bsm
    l1, l2 = np.array([0.0, 1.0]), np.array([0.5])
    v1, v2 = np.full((2, 2), 1e308), np.full((1, 2), 1.5e308)
    w = np.exp(np.array([0.0, 1.0, 0.5]) - 1.0)
    ref = (w[0] + w[1] + w[2] * 1.5) / w.sum() * 1e308
    out = getattr(bsm, fn)([(l1, v1), (l2, v2)])
    np.testing.assert_allclose(out, [ref, ref], rtol=1e-14)
    # low-rank values: coefficients 1e200 times a basis 1e100 give rows 2e300, finite; 1e300 x 1e100 cannot be
    D, E = np.full((2, 2), 1e200), np.full((2, 3), 1e100)
    np.testing.assert_allclose(getattr(bsm, fn)([(l1, D, E)]), np.full(3, 2e300), rtol=1e-14)
    with pytest.raises(InputError, match="exceeds the range"):
        getattr(bsm, fn)([(l1, D * 1e100, E)])


def test_calibrate_gamma_with_a_huge_basis_is_exact():
    """Issue 24: B of entries 1e150 overflowed the denominator to inf and gamma came back 0.0; gamma scales as
    |B|^-2, so the exact answer is gamma(B / 1e150) * 1e-300."""
    from kvbounds.algorithms import subspace_attention as sa
    rng = np.random.default_rng(0)
    Q, K = rng.standard_normal((3, 4)), rng.standard_normal((5, 4))
    B = np.linalg.qr(rng.standard_normal((4, 2)))[0].T
    g = sa.calibrate_gamma(Q, K, B)
    assert math.isclose(sa.calibrate_gamma(Q, K, B * 1e150), g * 1e-300, rel_tol=1e-12)
    assert math.isclose(sa.calibrate_gamma(Q, K, B * 1e-150), g * 1e300, rel_tol=1e-12)
    with pytest.raises(InputError, match="outside float64's range"):
        sa.calibrate_gamma(Q, K, B * 1e-200)          # gamma ~ 1e400


# -- the backend layer and the rest of the surface the fuzz suite found ---------------------------------------------

def test_backend_helpers_refuse_by_name():
    from kvbounds.algorithms import arrays as be
    from kvbounds.gpu import support
    from kvbounds.gpu.batched_walk import compiled_available
    from kvbounds.gpu.triton_walk import triton_available
    for bad in (math.nan, None, "tpu"):
        with pytest.raises(InputError, match="unknown backend"):
            be.validate_backend(bad)
        assert be.why_unavailable(bad) is not None
    with pytest.raises(InputError, match="dtype must be one of"):
        be.asarray(np.ones(2), "numpy", "bogus")
    with pytest.raises(InputError, match="real numeric"):
        be.asarray("abc")
    for fn in (be.device, be.array_namespace, lambda x: be.like(np.ones(2), x)):
        with pytest.raises(InputError) as e:
            fn("not an array")
        assert isinstance(e.value, TypeError)            # also what array-api-compat's callers catch
    with pytest.raises(InputError, match="claim_ids must be a list"):
        support.describe("SG.e2e", "cupy")              # was one line per character
    for probe in (compiled_available, triton_available):
        with pytest.raises(InputError, match="device_type"):
            probe(-0.5)                                 # was a torch.compile attempt per value


def test_like_keeps_0d_and_refuses_what_the_target_dtype_cannot_hold():
    from kvbounds.algorithms.arrays import like
    assert like(np.asarray(1.5), torch.zeros(2)).shape == ()           # was (1,) through np.ascontiguousarray
    with pytest.raises(InputError, match="exceed the range of float16"):
        like(np.full(2, 1e150), np.zeros(2, np.float16))               # was inf
    assert np.isinf(like(np.array([-np.inf, 1.0]), np.zeros(1, np.float32))[0])   # -inf flags pass through


def test_play_and_equal_memory_baseline_check_their_arguments():
    from kvbounds.algorithms.compressor_adapters import play
    from kvbounds.e2e._checks import equal_memory_baseline
    for kw, match in ((dict(reps=math.nan), "reps"), (dict(name=None), "name"), (dict(rule="x"), "rule"),
                      (dict(rng=None), "rng")):
        args = dict(name="uniform", setting=3, n=8, d=4, r=1.0, reps=2, rng=np.random.default_rng(0)) | kw
        with pytest.raises(InputError, match=match):
            play(**args)
    for bad in (math.nan, None, math.inf):
        with pytest.raises(InputError, match="baseline_loss"):
            equal_memory_baseline(bad)

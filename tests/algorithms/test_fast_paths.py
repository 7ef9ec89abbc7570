"""Fast paths (issue 13) against the generic array-API reference paths: same signs, same state; floats within
tolerance only where the order of summation changes."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbounds.algorithms.balance_kv import BalanceKV
from kvbounds.algorithms.frequent_directions import FrequentDirections, shrunk, shrunk_gram
from kvbounds.algorithms.self_balancing_walk import _gram_walk_array, _gram_walk_numpy, gram_walk
from kvbounds.algorithms.softmax_balance import normalized_kernel_gram


# -- the self-balancing walk: plain-float loop == array loop, bit for bit ---------------------------------

@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.integers(1, 6), st.integers(0, 2**31 - 1), st.sampled_from([0.05, 1.0, 30.0]),
       st.sampled_from([np.float64, np.float32]))
def test_gram_walk_numpy_is_the_array_walk(n, d, seed, c, dtype):
    rng = np.random.default_rng(seed)
    K, V = rng.standard_normal((n, d)), rng.standard_normal((n, 2))
    G = normalized_kernel_gram(K, V, float(np.linalg.norm(K, axis=1).max()), float(np.linalg.norm(V, axis=1).max()))
    G, u = G.astype(dtype), rng.random(n).astype(dtype)
    a, b = _gram_walk_numpy(G, u, c, "continue"), _gram_walk_array(G, u, c, "continue")
    np.testing.assert_array_equal(a.signs, b.signs)
    assert a.signs.dtype == b.signs.dtype
    np.testing.assert_array_equal(a.failed, b.failed)
    np.testing.assert_array_equal(a.fail_index, b.fail_index)
    np.testing.assert_array_equal(a.max_abs_inner, b.max_abs_inner)


def test_gram_walk_raises_the_same_failure():
    rng = np.random.default_rng(0)
    G = np.abs(rng.standard_normal((12, 12)))
    G = G + G.T
    u = rng.random(12)
    errs = []
    for walk in (_gram_walk_numpy, _gram_walk_array):
        with pytest.raises(Exception) as e:
            walk(G, u, 0.01, "raise")
        errs.append((type(e.value), e.value.index, e.value.inner))
    assert errs[0] == errs[1]
    assert gram_walk(G, u, 0.01, on_fail="continue").failed


# -- Frequent Directions: eigendecomposition shrink vs the SVD shrink --------------------------------------

@settings(max_examples=60, deadline=None)
@given(st.integers(2, 24), st.integers(0, 2**31 - 1), st.integers(0, 14), st.integers(-150, 150),
       st.sampled_from(["spread", "rank_deficient", "repeated"]))
def test_shrunk_gram_matches_the_svd_shrink(m, seed, decades, exp10, kind):
    """Small singular values included: a spectrum over up to 14 decades, exactly rank-deficient rows."""
    rng = np.random.default_rng(seed)
    d = m + int(rng.integers(0, 20))
    if kind == "spread":
        U = np.linalg.qr(rng.standard_normal((m, m)))[0]
        W = np.linalg.qr(rng.standard_normal((d, m)))[0]
        B = (U * np.logspace(0, -decades, m)) @ W.T
    elif kind == "rank_deficient":
        B = rng.standard_normal((m, 2)) @ rng.standard_normal((2, d))
    else:
        B = np.repeat(rng.standard_normal((1, d)), m, axis=0)
    B *= 10.0 ** exp10
    ell = max(1, m // 2)
    for keep in sorted({ell - 1, ell}):
        a, ka, da = shrunk(B, ell, keep=keep, out_rows=m)
        b, kb, db = shrunk_gram(B, ell, keep=keep, out_rows=m)
        scale2 = float(np.sum(B * B)) or 1.0
        assert ka == kb
        assert abs(da - db) <= 1e-12 * scale2
        np.testing.assert_allclose(b.T @ b, a.T @ a, rtol=0, atol=1e-12 * scale2)
        assert np.all(b[kb:] == 0)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 200), st.integers(1, 10), st.integers(1, 30), st.integers(0, 2**31 - 1),
       st.sampled_from([np.float64, np.float32]))
def test_frequent_directions_fast_equals_reference(n, ell, d, seed, dtype):
    A = np.random.default_rng(seed).standard_normal((n, d)).astype(dtype)
    fast, ref = FrequentDirections(d, ell), FrequentDirections(d, ell)
    ref.fast = False
    for i in range(0, n, 7):
        fast.update(A[i:i + 7])
        ref.update(A[i:i + 7])
    assert fast.n_shrinks == ref.n_shrinks and fast.n_rows == ref.n_rows
    S, R = fast.sketch().astype(float), ref.sketch().astype(float)
    tol = (1e-10 if dtype == np.float64 else 1e-4) * float(np.sum(A.astype(float) ** 2))
    np.testing.assert_allclose(S.T @ S, R.T @ R, rtol=0, atol=tol * (fast.n_shrinks + 1))
    assert abs(fast.certificate() - ref.certificate()) <= tol * (fast.n_shrinks + 1)
    assert fast.sketch().dtype == ref.sketch().dtype


@pytest.mark.parametrize("bad", [np.array([1.0, np.nan, 0.0, 0.0]), np.full((2, 4), 1e160), np.array([np.inf] * 4)])
def test_frequent_directions_fast_check_falls_back_to_the_same_error(bad):
    from kvbounds.algorithms.validation import InputError
    msgs = []
    for fast in (True, False):
        fd = FrequentDirections(4, 2)
        fd.fast = fast
        with pytest.raises(InputError) as e:
            fd.update(bad)
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1]


# -- streaming BalanceKV: numpy fast path vs the generic path ----------------------------------------------

def _stream(seed, n, d, s, zero_every=0, scale_v=1.0):
    rng = np.random.default_rng(seed)
    K = rng.standard_normal((n, d))
    K *= (rng.random((n, 1)) ** (1 / d)) / np.linalg.norm(K, axis=1, keepdims=True)
    V = rng.standard_normal((n, s)) * scale_v * np.exp(rng.standard_normal((n, 1)))
    if zero_every:
        V[::zero_every] = 0.0
    Q = rng.standard_normal((n, d)) / math.sqrt(d)
    return K, V, Q


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 300), st.sampled_from([2, 4, 8]), st.integers(0, 4), st.integers(0, 2**31 - 1),
       st.sampled_from([0, 3]), st.sampled_from(["alg1", "proof001", "none"]))
def test_balance_kv_fast_equals_reference(n, t, T, seed, zero_every, rule):
    d, s = 4, 3
    K, V, Q = _stream(seed, n, d, s, zero_every)
    fast = BalanceKV(d, batch_size=t, levels=T, eps=0.3, r=1.0, seed=seed, erase_rule=rule)
    ref = BalanceKV(d, batch_size=t, levels=T, eps=0.3, r=1.0, seed=seed, erase_rule=rule)
    ref.fast = False
    for j in range(n):
        fast.update(K[j], V[j])
        ref.update(K[j], V[j])
        if j % 5 == 0 or j == n - 1:
            assert fast.num_stored() == ref.num_stored() and fast.erased == ref.erased
            try:
                want = ref.query(Q[j])
            except Exception as e:                     # the same error on both paths
                with pytest.raises(type(e)):
                    fast.query(Q[j])
                continue
            np.testing.assert_allclose(fast.query(Q[j]), want, rtol=1e-9, atol=1e-12 * float(np.abs(want).max() + 1))
    # the same state: every cell's keys and values, bit for bit
    assert set(fast.numerators) == set(ref.numerators)
    for a, b in [*((fast.numerators[i], ref.numerators[i]) for i in ref.numerators), (fast.denominator, ref.denominator)]:
        for (ka, va), (kb, vb) in zip(a.cells(), b.cells()):
            assert (ka is None) == (kb is None)
            if ka is not None:
                np.testing.assert_array_equal(ka, kb)
                np.testing.assert_array_equal(va, vb)


def test_balance_kv_fast_query_sees_state_changed_behind_its_back():
    """A state edited directly (as a test might) is noticed: the slab is rebuilt, the generic rules apply."""
    from kvbounds.algorithms.balance_kv import DegenerateEstimate
    b = BalanceKV(2, batch_size=2, levels=1, eps=0.5, r=1.0, seed=0)
    b.update(np.array([1.0, 0.0]), np.array([1.0, 0.0]))
    b.query(np.array([1.0, 0.0]))                       # builds the slab
    b.denominator.cells_k = [None, None]
    b.denominator._buf_k, b.denominator._buf_v = [], []
    with pytest.raises(DegenerateEstimate):
        b.query(np.array([1.0, 0.0]))


# -- SubGen: numpy query/cluster search vs the generic path -----------------------------------------------

@settings(max_examples=25, deadline=None)
@given(st.integers(1, 200), st.integers(0, 2**31 - 1), st.sampled_from([None, 3]), st.booleans(),
       st.sampled_from([0.05, 0.5, 2.0]), st.sampled_from([np.float64, np.float32]))
def test_subgen_fast_equals_reference(n, seed, replicas, scaled, delta, dtype):
    from kvbounds.algorithms.subgen import SubGen
    from kvbounds.traces.synthetic import make_trace
    tr = make_trace("clustered", n=n, d=8, seed=seed % 1000, m=4, r=1.0, spread=0.1)
    K, V, Q = (x.astype(dtype) for x in (tr.K, tr.V, tr.Q))
    fast = SubGen(8, delta=delta, s=16, t=4, seed=seed, replicas=replicas, scaled=scaled)
    ref = SubGen(8, delta=delta, s=16, t=4, seed=seed, replicas=replicas, scaled=scaled)
    ref.fast = False
    rtol = 1e-9 if dtype == np.float64 else 1e-4
    for j in range(n):
        fast.update(K[j], V[j])
        ref.update(K[j], V[j])
        if j % 3 == 0 or j == n - 1:
            want = ref.query(Q[j])
            got = fast.query(Q[j])
            assert got.shape == want.shape and got.dtype == want.dtype
            np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * float(np.abs(want).max() + 1e-30))
    a, b = fast.state(), ref.state()
    for f in ("representatives", "rep_index", "counts", "sample_index", "samples", "matrix_index", "matrix_keys",
              "matrix_values"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    assert a.mu == b.mu


def test_subgen_fast_query_falls_back_on_bad_q():
    from kvbounds.algorithms.subgen import SubGen
    from kvbounds.algorithms.validation import InputError
    sg = SubGen(2, delta=0.5, s=4, t=2, seed=0)
    sg.update(np.array([1.0, 0.0]), np.array([1.0, 2.0]))
    with pytest.raises(InputError):
        sg.query(np.array([np.nan, 0.0]))
    ref = SubGen(2, delta=0.5, s=4, t=2, seed=0)
    ref.fast = False
    ref.update(np.array([1.0, 0.0]), np.array([1.0, 2.0]))
    for sub in (sg, ref):
        sub.update(np.array([0.0, 1.0]), np.array([1e-300, 0.0]))
    for scale in (1.0, 1e2, 1e3, 1e5):                  # up to logits far beyond the float range
        q = np.array([-1.0, 1.0]) * scale
        try:
            want = ref.query(q)
        except InputError as e:
            with pytest.raises(InputError, match=str(e)[:20]):
                sg.query(q)
            continue
        np.testing.assert_allclose(sg.query(q), want, rtol=1e-9)


# -- blockwise BalanceKV: panel-local walk vs the stepwise panel walk -------------------------------------

@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([(1, 8), (3, 32), (2, 64), (1, 48), (2, 128)]), st.booleans(),
       st.sampled_from([0.5, 5.0, 60.0]), st.sampled_from(["numpy", "torch:cpu"]))
def test_panel_walk_equals_stepwise(seed, shape, plus_one, c, backend):
    from kvbounds.algorithms.blockwise_balance_kv import panel_walk, panel_walk_stepwise
    from kvbounds.algorithms.arrays import asarray, to_numpy
    blocks, b = shape
    rng = np.random.default_rng(seed)
    d, e = 5, 3
    Kb = rng.standard_normal((2, blocks, b, d)) * 0.4
    Wb = rng.standard_normal((2, blocks, b, e))
    nk2, nw2 = (Kb ** 2).sum(-1), (Wb ** 2).sum(-1) + (1.0 if plus_one else 0.0)
    ones = None
    if plus_one and b > 8:                                 # padded rows at the end of the last block
        o = np.ones((blocks, b))
        o[-1, b - 3:] = 0.0
        Kb[:, -1, b - 3:] = Wb[:, -1, b - 3:] = 0.0
        nk2, nw2 = (Kb ** 2).sum(-1), (Wb ** 2).sum(-1) + o
        ones = asarray(o, backend)
    u = rng.random((2, blocks, b))
    args = [asarray(x, backend) for x in (Kb, Wb, nk2, nw2, u)]
    for panel in (64, 32, 8):
        s1, f1 = panel_walk(*args, c, panel=panel, plus_one=plus_one, ones=ones)
        s2, f2 = panel_walk_stepwise(*args, c, panel=panel, plus_one=plus_one, ones=ones)
        np.testing.assert_array_equal(to_numpy(s1), to_numpy(s2))
        np.testing.assert_array_equal(f1, f2)


# -- coefficient-space decode: uncounted numpy path vs the counted path -----------------------------------

@pytest.mark.parametrize("T,L", [(256, 64), (256, 256), (96, 32)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_coefficient_decode_numpy_equals_counted(T, L, dtype):
    from kvbounds.algorithms.subspace_attention import OpCounter, coefficient_decode
    rng = np.random.default_rng(T + L)
    J, r, d = T // L, 4, 16
    B, E = rng.standard_normal((J, r, d)).astype(dtype), rng.standard_normal((J, r, d)).astype(dtype)
    C, D = rng.standard_normal((J, r, L)).astype(dtype) * 3, rng.standard_normal((J, r, L)).astype(dtype)
    q = rng.standard_normal(d).astype(dtype)
    fast = coefficient_decode(q, B, E, C, D, gamma=0.7)
    ref = coefficient_decode(q, B, E, C, D, gamma=0.7, ops=OpCounter(np, count=False))
    assert fast.dtype == ref.dtype and fast.shape == ref.shape
    np.testing.assert_allclose(fast, ref, rtol=1e-10 if dtype == np.float64 else 1e-4)

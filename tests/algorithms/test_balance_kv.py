import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kvbounds.algorithms.attention import exact_attention
from kvbounds.algorithms.balance_kv import BalanceKV, DegenerateEstimate, bucket_index, erase_threshold
from kvbounds.algorithms.validation import InputError
from kvbounds.algorithms.arrays import asarray, to_numpy


def _stream(rng, n, d, r=1.0):
    K = rng.standard_normal((n, d))
    return r * K / np.linalg.norm(K, axis=1, keepdims=True), rng.standard_normal((n, d))


def test_exact_before_compression(rng):
    K, V = _stream(rng, 15, 4)
    V = V / np.linalg.norm(V, axis=1, keepdims=True) * rng.uniform(0.5, 1.0, (15, 1))  # no erasure possible
    b = BalanceKV(4, batch_size=16, levels=3, eps=0.1, r=1.0, seed=0)
    for j, (k, v) in enumerate(zip(K, V), 1):
        b.update(k, v)
        q = rng.standard_normal(4)
        np.testing.assert_allclose(b.query(q), exact_attention(q, K[:j], V[:j]), rtol=1e-10, atol=1e-12)


@settings(max_examples=20, deadline=None)
@given(norms=st.lists(st.floats(1e-6, 1e3), min_size=1, max_size=60), seed=st.integers(0, 100))
def test_bucket_bookkeeping(norms, seed):
    rng = np.random.default_rng(seed)
    d = 3
    b = BalanceKV(d, batch_size=4, levels=2, eps=0.5, r=1.0, seed=seed, erase_rule="none")
    sent = []
    for x in norms:
        k, v = rng.standard_normal(d), rng.standard_normal(d)
        v = v / np.linalg.norm(v) * x
        sent.append(float(np.linalg.norm(v)))         # the norm BalanceKV sees (x up to rounding)
        b.update(k / np.linalg.norm(k), v)
    # every token went to the bucket of its value norm (2^{i-1} < ||v|| <= 2^i), and to the denominator
    assert set(b.numerators) == {bucket_index(x) for x in sent}
    assert sum(mr.j for mr in b.numerators.values()) == len(norms) == b.denominator.j
    for i, mr in b.numerators.items():
        for k, v in mr.cells():
            if v is not None:
                nv = np.linalg.norm(v, axis=1)
                assert np.all((2.0 ** (i - 1) < nv) & (nv <= 2.0**i))


def test_bucket_index_bounds():
    for x in [1e-5, 0.3, 1.0, 1.5, 2.0, 1000.0]:
        i = bucket_index(x)
        assert 2.0 ** (i - 1) < x <= 2.0**i


def test_erase_rule_erases_small_buckets(rng):
    b = BalanceKV(2, batch_size=4, levels=2, eps=0.1, r=1.0, seed=0, n=100)
    b.update(np.array([1.0, 0.0]), np.array([1e-9, 0.0]))
    assert b.num_buckets() == 1
    b.update(np.array([0.0, 1.0]), np.array([1.0, 0.0]))     # vmax = 1: threshold 0.1/200 e^{-1/sqrt 2}
    assert b.num_buckets() == 1 and bucket_index(1e-9) in b.erased
    thr = erase_threshold("alg1", eps=0.1, n=100, r=1.0, d=2, vmax=1.0)
    assert math.isclose(thr, 0.1 / 200 * math.exp(-1 / math.sqrt(2)))


def test_backend_agreement(backend, rng):
    K, V = _stream(rng, 64, 4)
    ref = BalanceKV(4, batch_size=8, levels=3, eps=0.5, r=1.0 + 1e-9, seed=3)
    out = BalanceKV(4, batch_size=8, levels=3, eps=0.5, r=1.0 + 1e-9, seed=3)
    for k, v in zip(K, V):
        ref.update(k, v)
        out.update(asarray(k, backend), asarray(v, backend))
    q = rng.standard_normal(4)
    np.testing.assert_allclose(to_numpy(out.query(asarray(q, backend))), ref.query(q), rtol=1e-9)
    assert out.num_stored() == ref.num_stored()


def test_memory_is_sublinear(rng):
    K, V = _stream(rng, 2048, 4)
    b = BalanceKV(4, batch_size=16, levels=7, eps=0.5, r=1.0 + 1e-9, seed=0)
    for k, v in zip(K, V):
        b.update(k, v)
    assert b.num_stored() < 2048 / 2


def test_degenerate_denominator_is_an_error_not_inf():
    b = BalanceKV(2, batch_size=2, levels=1, eps=0.5, r=1.0, seed=0)
    b.update(np.array([1.0, 0.0]), np.array([1.0, 0.0]))
    b.denominator.cells_k = [None, None]
    b.denominator._buf_k, b.denominator._buf_v = [], []
    with pytest.raises(DegenerateEstimate, match="denominator"):
        b.query(np.array([1.0, 0.0]))


@pytest.mark.parametrize("kw,match", [
    (dict(eps=0.0), "eps"), (dict(eps=-1.0), "eps"), (dict(levels=99), "too large"), (dict(batch_size=3), "even"),
    (dict(r=0.0), "r"), (dict(delta=1.5), "delta"), (dict(erase_rule="sometimes"), "erase_rule"),
])
def test_bad_parameters(kw, match):
    args = dict(batch_size=4, levels=2, eps=0.1, r=1.0, seed=0)
    args.update(kw)
    with pytest.raises(InputError, match=match):
        BalanceKV(3, **args)


def test_bad_stream():
    b = BalanceKV(3, batch_size=4, levels=2, eps=0.1, r=1.0, seed=0)
    with pytest.raises(InputError, match="empty stream"):
        b.query(np.ones(3))
    with pytest.raises(InputError, match="exceeds r"):
        b.update(np.ones(3), np.ones(3))
    with pytest.raises(InputError, match="NaN"):
        b.update(np.array([np.nan, 0, 0]), np.ones(3))
    with pytest.raises(InputError, match="last dimension"):
        b.update(np.ones(2) * 0.1, np.ones(3))


def test_tokens_from_another_backend_or_device(backend):
    pytest.importorskip("torch")
    from backend_helpers import host_tensor_after
    bkv = BalanceKV(3, batch_size=4, levels=1, eps=0.5, r=2.0)
    bkv.update(asarray(np.ones(3) / 2, backend), asarray(np.ones(2), backend))
    host_tensor_after(backend, lambda host: bkv.update(host(np.ones(3) / 2), host(np.ones(2))))


def test_host_syncs_per_token_on_torch_cpu():
    """Issue 15: one host read per token on the generic path (the bucket of lines 5-6 is a host decision; the
    checks and ||k|| travel in the same copy); it was four (two checks, two norms). batch_size > n: no
    MergeAndReduce batch completes, so only the per-token cost is counted. Same buckets and estimates as numpy."""
    pytest.importorskip("torch")
    from sync_counter import count_syncs
    rng = np.random.default_rng(3)
    n, d = 64, 8
    K, V, Q = rng.standard_normal((n, d)), rng.standard_normal((n, d)) * np.exp(rng.uniform(-3, 3, (n, 1))), \
        rng.standard_normal((4, d))
    Kt, Vt = asarray(K, "torch:cpu"), asarray(V, "torch:cpu")
    b = BalanceKV(d, batch_size=128, levels=2, eps=0.5, r=10.0, seed=1)
    with count_syncs() as c:
        for j in range(n):
            b.update(Kt[j], Vt[j])
    assert c.total <= n, c
    ref = BalanceKV(d, batch_size=8, levels=2, eps=0.5, r=10.0, seed=1)
    got = BalanceKV(d, batch_size=8, levels=2, eps=0.5, r=10.0, seed=1)
    for j in range(n):
        ref.update(K[j], V[j])
        got.update(Kt[j], Vt[j])
    assert sorted(got.numerators) == sorted(ref.numerators) and got.erased == ref.erased and got.vmax == ref.vmax
    for q in Q:
        np.testing.assert_allclose(to_numpy(got.query(asarray(q, "torch:cpu"))), ref.query(q), rtol=1e-9, atol=1e-12)
    bad = Kt[0].clone()
    bad[1] = float("nan")
    with pytest.raises(InputError, match="NaN"):
        got.update(bad, Vt[0])

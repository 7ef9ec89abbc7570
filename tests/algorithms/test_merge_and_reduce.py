import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kvbounds.algorithms.merge_and_reduce import MergeAndReduce
from kvbounds.algorithms.validation import InputError
from kvbounds.algorithms.arrays import asarray, to_numpy


def _mr(t=4, T=3, d=3, s=2, seed=0, **kw):
    return MergeAndReduce(d, s, t=t, T=T, delta=0.1, rng=np.random.default_rng(seed), **kw)


@settings(max_examples=25, deadline=None)
@given(t=st.sampled_from([2, 4, 8]), T=st.integers(0, 5), n=st.integers(1, 200), seed=st.integers(0, 1000))
def test_cell_invariants(t, T, n, seed):
    rng = np.random.default_rng(seed)
    mr = _mr(t=t, T=T, seed=seed)
    for j in range(n):
        mr.update(rng.standard_normal(3), rng.standard_normal(2))
        sizes = mr.cell_sizes()
        assert len(sizes) == T + 1
        assert max(sizes[:T] or [0]) <= t                     # |C^i| <= t below the top
        if n <= t * 2**T:
            assert sizes[T] <= t                               # C^T too, within the theorem's n <= t 2^T
        assert sum(s > 0 for s in sizes) <= T + 1
        assert mr.num_stored() == sum(sizes) <= j + 1


def test_estimate_is_exact_before_first_reduction(rng):
    mr = _mr(t=8, T=2)
    K, V = rng.standard_normal((7, 3)), rng.standard_normal((7, 2))
    for k, v in zip(K, V):
        mr.update(k, v)
    q = rng.standard_normal(3)
    m, u = mr.estimate(q)
    np.testing.assert_allclose(math.exp(m) * u, (np.exp(K @ q / math.sqrt(3))[:, None] * V).sum(0), rtol=1e-12)


def test_T0_keeps_everything(rng):
    mr = _mr(t=4, T=0)
    K, V = rng.standard_normal((13, 3)), rng.standard_normal((13, 2))
    for k, v in zip(K, V):
        mr.update(k, v)
    assert mr.num_stored() == 13 and mr.balance_calls == 0
    Kc, Vc = mr.cells()[0]                     # C^0 = the carried batches plus the batch in progress
    np.testing.assert_array_equal(Kc, K)
    q = rng.standard_normal(3)
    m, u = mr.estimate(q)
    np.testing.assert_allclose(math.exp(m) * u, (np.exp(K @ q / math.sqrt(3))[:, None] * V).sum(0), rtol=1e-12)


def test_weights_are_powers_of_two(rng):
    mr = _mr(t=16, T=2)
    for _ in range(52):
        mr.update(rng.standard_normal(3), rng.standard_normal(2))
    K, V, logw = mr.weighted_tokens()
    assert set(np.round(np.exp(logw)).astype(int)) <= {1, 2, 4, 8}


def test_backend_agreement(backend, rng):
    K, V = rng.standard_normal((40, 3)), rng.standard_normal((40, 2))
    ref, out = _mr(seed=5), _mr(seed=5)
    for k, v in zip(K, V):
        ref.update(k, v)
        out.update(asarray(k, backend), asarray(v, backend))
    assert ref.cell_sizes() == out.cell_sizes()
    q = rng.standard_normal(3)
    m1, u1 = ref.estimate(q)
    m2, u2 = out.estimate(asarray(q, backend))
    np.testing.assert_allclose(math.exp(m2) * to_numpy(u2), math.exp(m1) * u1, rtol=1e-10)


def test_tokens_from_another_backend_or_device(backend):
    pytest.importorskip("torch")
    from backend_helpers import host_tensor_after
    mr = _mr(t=4, T=2)
    mr.update(asarray(np.ones(3) / 2, backend), asarray(np.ones(2), backend))
    host_tensor_after(backend, lambda host: mr.update(host(np.ones(3) / 2), host(np.ones(2))))


def test_meta_device_token_is_rejected():
    torch = pytest.importorskip("torch")
    mr = _mr(t=4, T=2)
    mr.update(torch.ones(3, dtype=torch.float64) / 2, torch.ones(2, dtype=torch.float64))
    with pytest.raises(InputError, match="device"):
        mr._check_like_stream(torch.ones(3, dtype=torch.float64, device="meta"),   # (update's NaN check
                              torch.ones(2, dtype=torch.float64, device="meta"))   # cannot read a meta tensor)


def test_panel_memory_keeps_the_same_cells(rng):
    """memory="panel" (the default above PANEL_FROM) keeps exactly the tokens the full-Gram reductions keep."""
    K, V = rng.standard_normal((256, 3)), rng.standard_normal((256, 2))
    a = MergeAndReduce(3, 2, t=32, T=3, delta=0.1, rng=np.random.default_rng(4), memory="gram")
    b = MergeAndReduce(3, 2, t=32, T=3, delta=0.1, rng=np.random.default_rng(4), memory="panel")
    assert (a.memory, b.memory, _mr(t=2048).memory) == ("gram", "panel", "panel")
    for k, v in zip(K, V):
        a.update(k, v)
        b.update(k, v)
    for (ka, va), (kb, vb) in zip(a.cells(), b.cells()):
        assert (ka is None) == (kb is None)
        if ka is not None:
            np.testing.assert_array_equal(ka, kb)
            np.testing.assert_array_equal(va, vb)


@pytest.mark.parametrize("kw,match", [
    (dict(t=3), "even"), (dict(t=0), "t"), (dict(T=-1), "levels"), (dict(T=100), "too large"),
    (dict(memory="disk"), "memory"),
])
def test_bad_parameters(kw, match):
    with pytest.raises(InputError, match=match):
        _mr(**kw)


def test_bad_tokens():
    mr = _mr()
    with pytest.raises(InputError, match="NaN"):
        mr.update(np.array([1.0, np.inf, 0.0]), np.ones(2))
    with pytest.raises(InputError, match="last dimension"):
        mr.update(np.ones(4), np.ones(2))


def test_host_reads_per_token_on_torch_cpu():
    """Issue 15: one read per token for update's checks (two before) and a few per reduction (about 5.3 per token
    before at t = 8, now about 2.3)."""
    pytest.importorskip("torch")
    from sync_counter import count_syncs
    rng = np.random.default_rng(0)
    K, V = asarray(rng.standard_normal((64, 4)), "torch:cpu"), asarray(rng.standard_normal((64, 2)), "torch:cpu")
    mr = MergeAndReduce(4, 2, t=8, T=3, delta=0.1, rng=np.random.default_rng(2))
    with count_syncs() as c:
        for j in range(64):
            mr.update(K[j], V[j])
    assert c.total <= 2.5 * 64, c

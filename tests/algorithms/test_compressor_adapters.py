"""The compressor adapters (kvbounds.algorithms.compressor_adapters) on every backend against numpy: the INDEX-game
players keep the same pairs and answer the same estimate (within the dtype's tolerance) from the same seeds, on
the input's device; the whole-cache compressors take backend arrays and return the numpy contract unchanged."""
import numpy as np
import pytest

from backend_helpers import assert_close, assert_on_device_of
from kvbounds.algorithms import compressor_adapters as ca
from kvbounds.algorithms.index_reduction import random_instance
from kvbounds.algorithms.arrays import asarray, to_numpy


@pytest.mark.parametrize("name", ["uniform", "blockwise", "balancekv", "subgen"])
def test_index_players_agree_with_numpy(backend, name):
    if name == "subgen" and ca.subgen_class() is None:
        pytest.skip("algorithms/subgen.py is not importable")
    inst = random_instance(128, 16, 4.0, np.random.default_rng(11))
    _, K, V = inst.stream()
    q = inst.query(3)
    ref = ca.make_compressor(name, 3, d=16, r=4.0, u_size=inst.u_size, seed=1)
    ref.consume(K, V)
    got = ca.make_compressor(name, 3, d=16, r=4.0, u_size=inst.u_size, seed=1)
    got.consume(asarray(K, backend), asarray(V, backend))
    qb = asarray(q, backend)
    z = got.query(qb)
    assert_on_device_of(z, qb)
    assert_close(z, ref.query(q), atol=1e-12)
    assert got.num_stored() == ref.num_stored() and got.state_bits(inst.n) == ref.state_bits(inst.n)


@pytest.mark.parametrize("compressor", [ca.SubGenCompressor(sink=4, window=4), ca.SubspaceCompressor(sink=4, window=4)])
def test_cache_compressors_take_backend_arrays(backend, compressor):
    rng = np.random.default_rng(5)
    K, V = rng.standard_normal((2, 96, 8)).astype(np.float32), rng.standard_normal((2, 96, 8)).astype(np.float32)
    ref = compressor.compress(K, V, budget_floats=600, rng=np.random.default_rng(2))
    got = compressor.compress(asarray(K, backend, "float32"), asarray(V, backend, "float32"), budget_floats=600,
                              rng=np.random.default_rng(2))
    Kb = asarray(K, backend, "float32")
    for field in ("keys", "values", "log_w_num", "log_w_den"):      # on K's device; numpy's values (same draws)
        a, b = getattr(got, field), getattr(ref, field)
        assert_on_device_of(a, Kb)
        assert str(a.dtype).replace("torch.", "") == str(b.dtype)
        np.testing.assert_allclose(to_numpy(a), b, rtol=1e-5, atol=1e-6)
    assert (got.extra_floats, got.rank, got.projected) == (ref.extra_floats, ref.rank, ref.projected)

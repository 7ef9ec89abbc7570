"""Greedy k-center (Gonzalez / Dyer-Frieze), the clusterability measures, the practical variant's indices."""
import itertools

import numpy as np
import pytest
from hypothesis import given, strategies as st

from kvbounds.algorithms.kcenter import (clusterability, covering_radius_curve, greedy_k_center, normalized_radius,
                                recent_plus_centers, stream_cluster_counts)
from kvbounds.algorithms.subgen import SubGen
from kvbounds.algorithms.validation import InputError
from kvbounds.algorithms.arrays import asarray, to_numpy
from kvbounds.traces.synthetic import make_trace


def _opt_radius(X, k):
    """Brute-force optimal k-center radius with centres among the points."""
    D = np.linalg.norm(X[:, None] - X[None], axis=-1)
    return min(D[:, list(c)].min(axis=1).max() for c in itertools.combinations(range(len(X)), k))


@given(n=st.integers(2, 9), k=st.integers(1, 3), d=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_greedy_is_a_2_approximation_and_radii_decrease(n, k, d, seed):
    k = min(k, n)
    X = np.random.default_rng(seed).standard_normal((n, d))
    res = greedy_k_center(X, k)
    assert np.all(np.diff(res.radii) <= 1e-12)
    assert len(set(to_numpy(res.centers).tolist())) == k or res.radii[-1] < 1e-12
    assert res.radii[-1] <= 2 * _opt_radius(X, k) + 1e-9
    C = X[to_numpy(res.centers)]
    D = np.linalg.norm(X[:, None] - C[None], axis=-1)
    np.testing.assert_allclose(D.min(axis=1).max(), res.radii[-1], atol=1e-7)
    assert np.all(D[np.arange(n), to_numpy(res.assignment)] <= D.min(axis=1) + 1e-7)


def test_farthest_first_order_and_heads():
    X = np.array([[0.0], [1.0], [10.0], [4.0]])
    res = greedy_k_center(X, 3)
    assert to_numpy(res.centers).tolist() == [0, 2, 3]
    np.testing.assert_allclose(res.radii, [10.0, 4.0, 1.0])
    rng = np.random.default_rng(0)
    H = rng.standard_normal((3, 40, 5))
    batched = greedy_k_center(H, 6)
    for h in range(3):
        single = greedy_k_center(H[h], 6)
        assert to_numpy(batched.centers[h]).tolist() == to_numpy(single.centers).tolist()
        np.testing.assert_allclose(batched.radii[h], single.radii)


def test_radius_curve_drops_at_the_number_of_clusters():
    tr = make_trace("clustered", n=600, d=8, seed=1, m=5, spread=0.01)
    r = covering_radius_curve(tr.K, 8)
    assert r[4] < 0.1 * r[3]
    assert normalized_radius(tr.K, 8) < 0.05
    assert normalized_radius(make_trace("gaussian", n=600, d=8, seed=1).K, 8) > 0.5


def test_stream_cluster_counts_match_subgen():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((80, 2))
    counts = stream_cluster_counts(X, 0.7)
    sg = SubGen(2, delta=0.7, s=1, t=1)
    for j in range(80):
        sg.update(X[j], np.ones(1))
        assert sg.num_clusters() == counts[j]


def test_clusterability_separates_clustered_from_isotropic():
    a = clusterability(make_trace("clustered", n=1024, d=16, seed=0, m=8, spread=0.05).K)
    b = clusterability(make_trace("gaussian", n=1024, d=16, seed=0).K)
    assert a["count_slope"] < 0.2 and b["count_slope"] > 0.8
    assert a["normalized_radius"] < 0.3 < b["normalized_radius"]
    assert len(a["radius_curve"]) == 16 and a["cluster_counts"][-1] == 8


def test_recent_plus_centers():
    rng = np.random.default_rng(0)
    K = rng.standard_normal((2, 50, 3))
    idx, sizes = recent_plus_centers(K, window=10, k=7)
    idx, sizes = to_numpy(idx), to_numpy(sizes)
    assert idx.shape == (2, 17)
    assert np.all(np.diff(idx, axis=-1) > 0)
    assert np.all(idx[:, -10:] == np.arange(40, 50))
    np.testing.assert_allclose(sizes.sum(axis=-1), 50)
    only, ones = recent_plus_centers(K[0], window=5, k=0)
    assert to_numpy(only).tolist() == list(range(45, 50))


def test_backend_agreement(backend):
    X = np.random.default_rng(5).standard_normal((2, 60, 4))
    ref = greedy_k_center(X, 9)
    res = greedy_k_center(asarray(X, backend), 9)
    assert to_numpy(res.centers).tolist() == to_numpy(ref.centers).tolist()
    np.testing.assert_allclose(res.radii, ref.radii, rtol=1e-10)


@pytest.mark.parametrize("call, match", [
    (lambda X: greedy_k_center(X, 0), "k must"), (lambda X: greedy_k_center(X, 11), "exceeds"),
    (lambda X: greedy_k_center(X, 2, start=10), "start"), (lambda X: greedy_k_center(X[0], 1), "dimension"),
    (lambda X: stream_cluster_counts(X, 0.0), "delta"), (lambda X: recent_plus_centers(X, window=-1, k=1), "window"),
    (lambda X: recent_plus_centers(X, window=8, k=3), "exceeds"),
])
def test_bad_input(call, match):
    with pytest.raises(InputError, match=match):
        call(np.random.default_rng(0).standard_normal((10, 2)))
    with pytest.raises(InputError, match="NaN"):
        greedy_k_center(np.full((4, 2), np.nan), 1)


def test_backend_agreement_of_the_clusterability_measures(backend):
    """recent_plus_centers, stream_cluster_counts and clusterability on the backend fixture equal numpy's
    (indices and counts exactly, radii within the dtype's tolerance); selections stay on K's device."""
    from backend_helpers import assert_close, assert_equal, assert_on_device_of
    X = make_trace("clustered", n=80, d=4, seed=3, m=5, r=1.0, spread=0.05).K
    Xb = asarray(X, backend)
    for start in ("first", "last"):
        got, ref = recent_plus_centers(Xb, window=6, k=7, start=start), recent_plus_centers(X, window=6, k=7, start=start)
        for g, r in zip(got, ref):
            assert_on_device_of(g, Xb)
            assert_equal(g, r)
    np.testing.assert_array_equal(stream_cluster_counts(Xb, 0.3), stream_cluster_counts(X, 0.3))
    got, ref = clusterability(Xb, k=6), clusterability(X, k=6)
    assert got.keys() == ref.keys() and got["cluster_counts"] == ref["cluster_counts"]
    for key in ("radius_curve", "normalized_radius", "delta", "count_slope"):
        assert_close(np.asarray(got[key]), np.asarray(ref[key]), atol=1e-12)


def test_stream_cluster_counts_host_syncs_on_torch_cpu(monkeypatch):
    """Issue 15: m' stays on the device (the path GPU arrays take; forced here on CPU tensors); it is read when the
    buffer may be full and once at the end (it was read once per row). Same counts as numpy."""
    pytest.importorskip("torch")
    import kvbounds.algorithms.kcenter as kc
    monkeypatch.setattr(kc, "_DEVICE_COUNTS", True)
    from sync_counter import count_syncs
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.standard_normal((70, 3)) * 0.1 + rng.integers(0, 4, (70, 1)) * 3, rng.standard_normal((130, 3)) * 4])
    for delta in (0.5, 2.0):
        Xt = asarray(X, "torch:cpu")
        with count_syncs() as c:
            got = stream_cluster_counts(Xt[:64], delta)
        assert c.total <= 4, c
        np.testing.assert_array_equal(got, stream_cluster_counts(X[:64], delta))
        np.testing.assert_array_equal(stream_cluster_counts(Xt, delta), stream_cluster_counts(X, delta))  # grows


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_traversal_is_the_array_api_loop_bit_for_bit(monkeypatch, dtype):
    """The in-place numpy traversal (issue 26, the e2e harness's cost) and the array-API loop give the same
    centers, radii, assignment and exhausted flags, ties and duplicates included."""
    from kvbounds.algorithms import kcenter
    rng = np.random.default_rng(26)
    for trial in range(40):
        B, n, d = int(rng.integers(1, 4)), int(rng.integers(2, 90)), int(rng.integers(1, 12))
        X = rng.standard_normal((B, n, d)).astype(dtype)
        if trial % 3 == 0:
            X[:, n // 2:] = X[:, :n - n // 2]                  # duplicates: the radius reaches 0
        if trial % 5 == 0:
            X = np.round(X)                                    # many exact ties
        k, start = int(rng.integers(1, n + 1)), int(rng.integers(n))
        monkeypatch.setattr(kcenter, "TRAVERSE_BYTES", [1, 1 << 20][trial % 2])   # heads one by one / together
        fast = greedy_k_center(X, k, start=start)
        monkeypatch.setattr(kcenter, "_NUMPY_LOOP", False)
        ref = greedy_k_center(X, k, start=start)
        monkeypatch.setattr(kcenter, "_NUMPY_LOOP", True)
        for f in ("centers", "radii", "assignment", "exhausted"):
            assert np.array_equal(getattr(fast, f), getattr(ref, f)), (trial, f)


def test_farthest_first_answers_every_k_as_greedy_k_center(monkeypatch):
    """FarthestFirst (issue 26: SubGen's equal-memory fit asks one layer for several k) gives greedy_k_center's
    result for every k, in any order, for a (L, H, n, d) stack split into layers (each layer scaled on its own) and
    for (H, n, d); ties and duplicates included."""
    from kvbounds.algorithms import kcenter
    rng = np.random.default_rng(261)
    for trial in range(6):
        L, H, n, d = 3, int(rng.integers(1, 4)), int(rng.integers(8, 70)), int(rng.integers(1, 9))
        X = rng.standard_normal((L, H, n, d)).astype(np.float32) * np.float32([1e-3, 1.0, 7e2])[:, None, None, None]
        if trial % 2:
            X[:, :, n // 2:] = np.round(X[:, :, :n - n // 2])
        monkeypatch.setattr(kcenter, "TRAVERSE_BYTES", [1, 1 << 20][trial % 2])
        start = int(rng.integers(n))
        ff = kcenter.FarthestFirst(X, start=start)
        k0 = int(rng.integers(1, n + 1))
        whole = ff.result(k0)
        layers = ff.layers()
        for l in range(L):
            ref = greedy_k_center(X[l], k0, start=start)
            for f in ("centers", "radii", "assignment", "exhausted"):
                assert np.array_equal(getattr(whole, f)[l], getattr(ref, f)), (trial, l, f)
            for k in rng.integers(1, n + 1, size=5).tolist() + [k0, n]:
                got, ref = layers[l].result(int(k)), greedy_k_center(X[l], int(k), start=start)
                for f in ("centers", "radii", "assignment", "exhausted"):
                    assert np.array_equal(getattr(got, f), getattr(ref, f)), (trial, l, k, f)
        one = kcenter.FarthestFirst(X[0])
        assert np.array_equal(one.result(3).centers, greedy_k_center(X[0], 3).centers)
    with pytest.raises(InputError, match="numpy"):
        kcenter.FarthestFirst([[1.0]])
    with pytest.raises(InputError, match="exceeds"):
        kcenter.FarthestFirst(X).result(n + 1)


def test_subgen_refuses_a_traversal_of_other_keys():
    from kvbounds.algorithms.compressor_adapters import SubGenCompressor
    from kvbounds.algorithms.kcenter import FarthestFirst
    rng = np.random.default_rng(0)
    K, V = rng.standard_normal((2, 2, 80, 8)).astype(np.float32)
    c = SubGenCompressor(sink=4, window=4)
    with pytest.raises(InputError, match="traversal"):
        c.compress(K, V, budget_floats=900, rng=np.random.default_rng(1), traversal=FarthestFirst(K.copy()[:, 4:76]))
    got = c.compress(K, V, budget_floats=900, rng=np.random.default_rng(1), traversal=FarthestFirst(K[:, 4:76]))
    ref = c.compress(K, V, budget_floats=900, rng=np.random.default_rng(1))
    for f in ("keys", "values", "log_w_num", "log_w_den"):
        assert np.array_equal(getattr(got, f), getattr(ref, f))

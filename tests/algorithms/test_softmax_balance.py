
import numpy as np
import pytest
from hypothesis import given, strategies as st

from kvbounds.algorithms.softmax_balance import normalized_kernel_gram, softmax_balance
from kvbounds.algorithms.validation import InputError
from kvbounds.algorithms.arrays import asarray, to_numpy


@given(n=st.integers(1, 40), d=st.integers(1, 6), s=st.integers(1, 4), seed=st.integers(0, 10**6))
def test_half_property(n, d, s, seed):
    rng = np.random.default_rng(seed)
    res = softmax_balance(rng.standard_normal((n, d)), rng.standard_normal((n, s)), delta=0.1, rng=rng,
                          on_fail="continue")
    assert 2 * int(res.keep.sum()) <= n                       # |C'| <= |C|/2
    assert set(np.unique(res.signs)) <= {-1.0, 1.0}


def test_gram_is_kernel_over_R2(rng):
    K, V = rng.standard_normal((7, 4)), rng.standard_normal((7, 3))
    rk, rv = np.linalg.norm(K, axis=1).max(), np.linalg.norm(V, axis=1).max()
    G = normalized_kernel_gram(K, V, rk, rv)
    direct = np.exp(K @ K.T / 2.0) * (V @ V.T) / (np.exp(rk**2 / 2.0) * rv**2)
    np.testing.assert_allclose(G, direct, rtol=1e-12)


def test_huge_key_norms_do_not_overflow(rng):
    K = rng.standard_normal((64, 64))
    K = 60 * K / np.linalg.norm(K, axis=1, keepdims=True)    # R^2 = e^{3600/8}: would overflow if formed
    res = softmax_balance(K, rng.standard_normal((64, 8)), delta=0.01, rng=rng)
    assert np.all(np.isfinite(res.signs)) and not res.walk.failed.any()


def test_rows_mode_matches_gram_mode(rng):
    K, V = rng.standard_normal((50, 5)), rng.standard_normal((50, 2))
    a = softmax_balance(K, V, delta=0.01, rng=np.random.default_rng(3), c=2.0, on_fail="continue")
    b = softmax_balance(K, V, delta=0.01, rng=np.random.default_rng(3), c=2.0, on_fail="continue", memory="rows")
    np.testing.assert_array_equal(a.signs, b.signs)


@pytest.mark.parametrize("shape,repeats,c", [((50,), None, 2.0), ((3, 130), 4, 3.0), ((2, 2, 65), None, None),
                                              ((1,), 3, None), ((300,), 16, None)])
def test_panel_mode_matches_gram_mode(rng, shape, repeats, c):
    """memory="panel" (Gram panels shared by the repeats, one product per panel) gives the gram path's signs, FAIL
    flags and certificate |x|/c: the same walk, summed in another order."""
    K, V = rng.standard_normal(shape + (5,)), rng.standard_normal(shape + (2,))
    kw = dict(delta=0.01, c=c, repeats=repeats, on_fail="continue")
    a = softmax_balance(K, V, rng=np.random.default_rng(3), **kw)
    b = softmax_balance(K, V, rng=np.random.default_rng(3), memory="panel", **kw)
    np.testing.assert_array_equal(a.signs, b.signs)
    np.testing.assert_array_equal(a.keep, b.keep)
    np.testing.assert_array_equal(a.walk.failed, b.walk.failed)
    np.testing.assert_array_equal(a.walk.fail_index, b.walk.fail_index)
    np.testing.assert_allclose(a.walk.max_abs_inner, b.walk.max_abs_inner, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("panel,chunk", [(5, 7), (8, 8), (16, 1000)])
def test_panel_mode_in_column_chunks_matches_gram_mode(rng, monkeypatch, panel, chunk):
    """The panel's later columns formed ``PANEL_CHUNK`` at a time (a chunk smaller than, equal to and larger than
    the panel; a last chunk shorter than the rest): the gram path's signs and certificate, repeats included."""
    import kvbounds.algorithms.softmax_balance as sb
    monkeypatch.setattr(sb, "PANEL", panel)
    monkeypatch.setattr(sb, "PANEL_CHUNK", chunk)
    K, V = rng.standard_normal((2, 93, 4)), rng.standard_normal((2, 93, 1))
    kw = dict(delta=0.01, c=3.0, repeats=3, on_fail="continue")
    a = softmax_balance(K, V, rng=np.random.default_rng(5), **kw)
    b = softmax_balance(K, V, rng=np.random.default_rng(5), memory="panel", **kw)
    np.testing.assert_array_equal(a.signs, b.signs)
    np.testing.assert_allclose(a.walk.max_abs_inner, b.walk.max_abs_inner, rtol=1e-12, atol=1e-15)


def test_given_uniforms_are_the_walks_coins(rng):
    """``uniforms`` given: the walk drawn from rng with the same numbers; nested prefixes of one stream with the
    prefixes of one set of coins (the scale sweeps' common random numbers); bad coins are refused by name."""
    K, V = rng.standard_normal((120, 4)), rng.standard_normal((120, 1))
    u = np.random.default_rng(4).random((3, 120))
    kw = dict(delta=0.01, repeats=3, on_fail="continue", memory="panel")
    a = softmax_balance(K, V, rng=np.random.default_rng(4), **kw)
    b = softmax_balance(K, V, rng=None, uniforms=u, **kw)
    np.testing.assert_array_equal(a.signs, b.signs)
    c = softmax_balance(K[:70], V[:70], rng=None, uniforms=np.ascontiguousarray(u[:, :70]), **kw)
    ref = softmax_balance(K[:70], V[:70], rng=None, uniforms=u[:, :70].copy(), memory="gram",
                          **{k: v for k, v in kw.items() if k != "memory"})
    np.testing.assert_array_equal(c.signs, ref.signs)
    for bad in (u[:, :60], u.astype(np.float32), np.full((3, 120), 1.0), u.tolist()):
        with pytest.raises(InputError, match="uniforms"):
            softmax_balance(K, V, rng=None, uniforms=bad, **kw)


def test_panel_mode_backend_agreement(backend, rng):
    K, V = rng.standard_normal((200, 4)), rng.standard_normal((200, 1))
    kw = dict(delta=0.01, repeats=8, on_fail="continue", memory="panel")
    ref = softmax_balance(K, V, rng=np.random.default_rng(9), **kw)
    out = softmax_balance(asarray(K, backend), asarray(V, backend), rng=np.random.default_rng(9), **kw)
    np.testing.assert_array_equal(to_numpy(out.signs), ref.signs)
    np.testing.assert_array_equal(to_numpy(out.keep), ref.keep)


def test_panel_mode_never_forms_the_gram():
    """O((panel + repeats) n) memory: at n = 4096 the full Gram would be 134 MB; the panel path stays far below."""
    import tracemalloc
    rng = np.random.default_rng(0)
    K, V = rng.standard_normal((4096, 4)), rng.standard_normal((4096, 1))
    tracemalloc.start()
    softmax_balance(K, V, delta=0.01, rng=rng, repeats=2, on_fail="continue", memory="panel")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 4096 * 4096 * 8 / 16


def test_backend_agreement(backend, rng):
    K, V = rng.standard_normal((3, 40, 6)), rng.standard_normal((3, 40, 2))
    ref = softmax_balance(K, V, delta=0.01, rng=np.random.default_rng(9), c=3.0, on_fail="continue")
    out = softmax_balance(asarray(K, backend), asarray(V, backend), delta=0.01, rng=np.random.default_rng(9),
                          c=3.0, on_fail="continue")
    np.testing.assert_array_equal(to_numpy(out.signs), ref.signs)
    np.testing.assert_array_equal(to_numpy(out.keep), ref.keep)


@pytest.mark.parametrize("K,V,kw,match", [
    (np.full((4, 2), np.nan), np.ones((4, 1)), {}, "NaN"),
    (np.ones((4, 2)), np.ones((3, 1)), {}, "agree"),
    (np.ones(4), np.ones((4, 1)), {}, "dimension"),
    (np.ones((0, 2)), np.ones((0, 1)), {}, "empty"),
    (np.ones((4, 2), dtype=np.int64), np.ones((4, 1)), {}, "floating"),
    (np.ones((4, 2)), np.ones((4, 1)), {"delta": 0.0}, "delta"),
    (np.ones((4, 2)), np.ones((4, 1)), {"r_key": 0.1}, "radii"),
    (np.ones((4, 2)), np.ones((4, 1)), {"memory": "disk"}, "memory"),
])
def test_bad_inputs(K, V, kw, match):
    args = dict(delta=0.1, rng=np.random.default_rng(0))
    args.update(kw)
    with pytest.raises(InputError, match=match):
        softmax_balance(K, V, **args)


def test_backend_agreement_rows_repeats_and_signed_sum(backend):
    """The O((d+s) n)-memory walk (memory="rows"), repeated walks on one Gram, the normalized Gram and the signed
    kernel sum on the backend: numpy's signs exactly, floats within the dtype's tolerance, on the input's device."""
    from backend_helpers import assert_close, assert_equal, assert_on_device_of
    from kvbounds.algorithms.softmax_balance import signed_kernel_sum
    rng = np.random.default_rng(8)
    K, V, q = rng.standard_normal((2, 30, 5)), rng.standard_normal((2, 30, 3)), rng.standard_normal(5)
    Kb, Vb = asarray(K, backend), asarray(V, backend)
    for kw in (dict(memory="rows"), dict(memory="panel"), dict(repeats=3), dict(repeats=3, memory="panel")):
        ref = softmax_balance(K, V, delta=0.01, rng=np.random.default_rng(2), c=3.0, on_fail="continue", **kw)
        got = softmax_balance(Kb, Vb, delta=0.01, rng=np.random.default_rng(2), c=3.0, on_fail="continue", **kw)
        assert_on_device_of(got.keep, Kb)
        assert_equal(got.signs, ref.signs)
        assert_equal(got.keep, ref.keep)
    G = normalized_kernel_gram(Kb, Vb, 5.0, 5.0)
    assert_on_device_of(G, Kb)
    assert_close(G, normalized_kernel_gram(K, V, 5.0, 5.0), atol=1e-300)
    m, u = signed_kernel_sum(Kb, Vb, got.signs[0], asarray(q, backend))
    m_ref, u_ref = signed_kernel_sum(K, V, ref.signs[0], q)
    assert_on_device_of(u, Kb)
    assert_close(m, m_ref)
    assert_close(u, u_ref, atol=1e-12)


def test_host_reads_per_call_on_torch_cpu():
    """Issue 15: finiteness and the largest norms come to the host in one read; the Gram and the walk are not
    checked again (13 reads per call before on the gram path, 7 on the panel path; now 4 on both: the checks,
    the walk's FAIL flags and certificate, the smaller side)."""
    pytest.importorskip("torch")
    from sync_counter import count_syncs
    rng = np.random.default_rng(0)
    K, V = asarray(rng.standard_normal((64, 4)), "torch:cpu"), asarray(rng.standard_normal((64, 2)), "torch:cpu")
    for mem in ("gram", "panel"):
        with count_syncs() as c:
            out = softmax_balance(K, V, delta=0.1, rng=np.random.default_rng(1), memory=mem, on_fail="continue")
        assert c.reads <= 4, (mem, c)
        ref = softmax_balance(to_numpy(K), to_numpy(V), delta=0.1, rng=np.random.default_rng(1), memory=mem,
                              on_fail="continue")
        np.testing.assert_array_equal(to_numpy(out.signs), ref.signs)
    for bad, name in ((np.nan, "K"), (np.inf, "V")):
        Kb, Vb = rng.standard_normal((5, 2)), rng.standard_normal((5, 1))
        (Kb if name == "K" else Vb)[2, 0] = bad
        with pytest.raises(InputError, match=f"{name} contains NaN or Inf"):
            softmax_balance(asarray(Kb, "torch:cpu"), asarray(Vb, "torch:cpu"), delta=0.1, rng=rng)


def test_choices_are_refused_by_name_even_when_the_walk_does_not_fail():
    """on_fail='bogus' was accepted whenever the walk did not fail (it is read only on a failure)."""
    from kvbounds.algorithms.validation import InputError
    rng = np.random.default_rng(0)
    K, V = rng.standard_normal((16, 4)) * 0.1, rng.standard_normal((16, 3))
    softmax_balance(K, V, delta=0.1, rng=np.random.default_rng(0))                       # this walk does not fail
    for kw, name in ((dict(on_fail="bogus"), "on_fail"), (dict(on_fail=None), "on_fail"), (dict(memory="disk"), "memory")):
        with pytest.raises(InputError, match=name):
            softmax_balance(K, V, delta=0.1, rng=np.random.default_rng(0), **kw)


def test_an_integer_radius_beyond_int64_is_a_float():
    """Found by the fuzz: r_value = 10**30 (a Python int) overflowed the torch scalar (OverflowError)."""
    torch = pytest.importorskip("torch")
    K, V = torch.randn(8, 3, dtype=torch.float64), torch.randn(8, 2, dtype=torch.float64)
    res = softmax_balance(K, V, delta=0.1, rng=np.random.default_rng(0), r_value=10**30, on_fail="continue")
    assert res.r_value == 1e30

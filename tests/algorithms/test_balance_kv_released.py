"""The released BalanceKV variant (kvbounds.algorithms.balance_kv_released) against a direct torch
re-statement of the authors' released walk (ksheth96/BalanceKV, src/balanced_walk.py, ``balanced_walk``),
written here from its semantics: same signs, indices and weights given the same uniforms."""
from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kvbounds.algorithms.balance_kv_released import (compress_cache_released, cut_weights, expand_groups,
                                                      released_log_weights, released_select,
                                                      split_weighted_attention, theory_walk_c)
from kvbounds.algorithms.blockwise_balance_kv import weighted_attention
from kvbounds.algorithms.validation import InputError


def reference_released_walk(key, value, gen, gamma, temp, beta, itrs, block):
    """The released walk restated in torch: key/value (b, h, n, d); returns (order (b, h, n//2^T), weights)."""
    bsz, h, n, d = key.shape
    order, weight = None, None
    for t in range(itrs):
        m_pad = math.ceil(n / block) * block
        if order is None:
            ks, vs = key, value
        else:
            ix = order[..., None].expand(-1, -1, -1, d)
            ks, vs = key.gather(2, ix), value.gather(2, ix) * weight[..., None]
        ks = torch.nn.functional.pad(ks, (0, 0, 0, m_pad - n)).reshape(bsz, h, -1, block, d)
        vs = torch.nn.functional.pad(vs, (0, 0, 0, m_pad - n)).reshape(bsz, h, -1, block, d)
        kc = ks - ks.mean(dim=-2, keepdim=True)                      # the mean includes the padding rows
        kern = torch.exp(temp * kc @ kc.transpose(-1, -2) / math.sqrt(d) - beta)
        kern = kern * (vs @ vs.transpose(-1, -2) + 0.025 + 1e-8)
        signs = torch.zeros(kern.shape[:4], dtype=torch.int16)
        signs[..., 0] = 1
        u = torch.rand(signs.shape, generator=gen)
        for i in range(1, block):
            prob = 0.5 - gamma * (kern[..., i, :] * signs).sum(-1)
            signs[..., i] = (2 * (u[..., i] < prob) - 1).to(torch.int16)
        signs = signs.reshape(bsz, h, -1)[..., :n]
        half = n // 2
        first_neg = torch.argmax(((signs == -1).cumsum(-1) == half).to(torch.int64), dim=-1)
        first_pos = torch.argmax(((signs == 1).cumsum(-1) == half).to(torch.int64), dim=-1)
        cut = torch.maximum(first_neg, first_pos)
        pos = torch.arange(n).view(1, 1, -1)
        w = signs.clone()
        after = pos > cut[..., None]
        w[after] = w[after].abs()
        before = ~after
        w[before] *= 2
        flip = before & (signs.gather(2, cut[..., None]) == 1)
        w[flip] *= -1
        srt = torch.argsort(-w, dim=-1, stable=True)[..., :half]
        if order is None:
            order, weight = srt, w.gather(-1, srt)
        else:
            order, weight = order.gather(2, srt), weight.gather(-1, srt) * w.gather(-1, srt)
        n = half
    return order, weight


def _kv(h=3, n=200, d=8, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((h, n, d)) * scale, rng.standard_normal((h, n, d))


@pytest.mark.parametrize("n,block,T,temp", [(200, 16, 2, 1.0), (256, 32, 3, 0.1), (97, 8, 3, 1.0)])
def test_golden_same_signs_given_the_same_uniforms(n, block, T, temp):
    K, V = _kv(n=n, scale=0.7)
    ref_idx, ref_w = reference_released_walk(torch.as_tensor(K)[None], torch.as_tensor(V)[None],
                                             torch.Generator().manual_seed(5), 4.0, temp, 0.0, T, block)
    for Kb, Vb in ((K, V), (torch.as_tensor(K), torch.as_tensor(V))):
        gen = torch.Generator().manual_seed(5)
        draw = lambda shape: torch.rand((1,) + tuple(shape), generator=gen).reshape(shape)
        idx, w = released_select(Kb, Vb, levels=T, block_size=block, uniforms=draw, temp=temp)
        np.testing.assert_array_equal(np.asarray(idx), ref_idx[0].numpy())
        np.testing.assert_array_equal(np.asarray(w), ref_w[0].numpy())


def test_cut_keeps_the_other_class_before_the_cut_with_weight_two():
    s = np.array([[1, 1, -1, 1, -1, -1, 1, -1]])
    # #(+1) reaches 4 at index 6, #(-1) reaches 4 at index 7: cut = 7 (max), eta_7 = -1: +1 tokens get 2
    np.testing.assert_array_equal(cut_weights(s), [[2, 2, -2, 2, -2, -2, 2, -2]])
    s = np.array([[1, 1, 1, -1, -1, 1]])            # #(+1) reaches 3 at index 2; #(-1) never: argmax 0
    np.testing.assert_array_equal(cut_weights(s), [[-2, -2, -2, 1, 1, 1]])


def test_weights_are_products_of_two_and_one_and_compress_cache_layout():
    K, V = _kv(n=256)
    idx, w = released_select(K, V, levels=3, block_size=32, rng=np.random.default_rng(0))
    assert idx.shape == (3, 32) and set(np.unique(w)) <= {1, 2, 4, 8}
    assert all(len(set(r)) == 32 for r in idx)
    full, lwn, lwd = compress_cache_released(K, V, sink=8, window=8, levels=2, block_size=16,
                                             rng=np.random.default_rng(0))
    assert full.shape == lwn.shape == lwd.shape == (3, 16 + 240 // 4)
    assert np.all(np.diff(full, axis=-1) > 0)
    assert np.all(lwd[:, 8:-8] == 2 * math.log(2)) and np.all(lwn[:, :8] == 0)


def test_estimators_and_the_split_attention():
    K, V = _kv(n=128)
    q = np.random.default_rng(1).standard_normal((3, 8))
    idx, lwn, lwd = compress_cache_released(K, V, sink=4, window=4, levels=1, block_size=16,
                                            rng=np.random.default_rng(2), estimator="consistent")
    assert np.allclose(lwn, lwd)
    assert np.allclose(split_weighted_attention(q, K, V, idx, lwn, lwd), weighted_attention(q, K, V, idx, lwn))
    w = np.array([[2, 1, 4]])
    num, den = released_log_weights(w, 2, "released")
    assert np.allclose(num, np.log(w)) and np.allclose(den, 2 * math.log(2))
    with pytest.raises(InputError):
        released_log_weights(w, 2, "nope")


def test_theory_constant_makes_the_walk_a_coin_and_gamma_zero_too():
    K, V = _kv(n=256, scale=3.0)
    diag = []
    released_select(K, V, levels=2, block_size=32, rng=np.random.default_rng(0), walk_c=theory_walk_c(32), diagnostics=diag)
    assert len(diag) == 2 and all(dl["mean_abs_p_dev"] < 1e-2 and dl["clipped"] == 0 for dl in diag)
    diag = []
    released_select(K, V, levels=2, block_size=32, rng=np.random.default_rng(0), diagnostics=diag)
    assert all(dl["clipped"] > 0.5 for dl in diag)     # the released gamma = 4: almost always clipped


def test_numpy_and_torch_agree_with_numpy_rng():
    K, V = _kv(n=160)
    a = released_select(K, V, levels=2, block_size=16, rng=np.random.default_rng(3), temp=0.1)
    b = released_select(torch.as_tensor(K), torch.as_tensor(V), levels=2, block_size=16, rng=np.random.default_rng(3),
                        temp=0.1)
    np.testing.assert_array_equal(a[0], b[0].numpy())
    np.testing.assert_array_equal(a[1], b[1].numpy())


def test_expand_groups_and_bad_input():
    x = np.arange(6).reshape(2, 3)
    np.testing.assert_array_equal(expand_groups(x, 3), np.repeat(x, 3, axis=0))
    K, V = _kv(n=64)
    with pytest.raises(InputError):
        released_select(K, V, levels=1, block_size=7, rng=np.random.default_rng(0))
    with pytest.raises(InputError):
        released_select(K, V, levels=1, block_size=8, rng=None)
    with pytest.raises(InputError):
        compress_cache_released(K, V, sink=40, window=40, levels=1, block_size=8, rng=np.random.default_rng(0))


def test_pseudocode_walk_diagnostic():
    from kvbounds.algorithms.blockwise_balance_kv import blockwise_balance_select, compress_cache
    K, V = _kv(n=256, scale=0.3)
    for c, coin in ((1e-3, False), (1e12, True)):
        diag = []
        a = blockwise_balance_select(K, V, block_size=32, levels=2, rng=np.random.default_rng(0), c=c, diagnostics=diag)
        b = blockwise_balance_select(K, V, block_size=32, levels=2, rng=np.random.default_rng(0), c=c)
        np.testing.assert_array_equal(a, b)                      # the diagnostic draws nothing
        assert [dl["level"] for dl in diag] == [1, 2] and diag[0]["tokens"] == 256 and diag[1]["tokens"] == 128
        assert (max(dl["mean_abs_p_dev"] for dl in diag) < 1e-9) == coin
        assert (min(dl["clipped"] for dl in diag) > 0.5) == (not coin)
    diag = []
    compress_cache(torch.as_tensor(K), torch.as_tensor(V), sink=8, window=8, levels=1, block_size=32,
                   rng=np.random.default_rng(0), diagnostics=diag)
    assert len(diag) == 1 and np.isfinite(diag[0]["log10_R2"])


def test_vs_uniform_records_every_variant_with_walk_diagnostics_and_findings():
    from kvbounds.proofs_checks import bkv_variants, bkv_vs_uniform
    p = dict(trace="synthetic:gaussian:256:16:0", T=2, sink=16, window=16, block_size=32, seeds=3, fallback="test")
    recs = bkv_vs_uniform.run_trial(p, 1, "numpy")
    by = {r.check: r for r in recs}
    for m in bkv_vs_uniform.METHODS:
        assert f"error {m}" in by and by[f"error {m}"].extra["per_kv_head"]
    for m in bkv_vs_uniform.BKV_VARIANTS:
        w = by[f"error {m}"].extra
        assert len(w["walk"]) == 2 and {"mean_abs_p_dev", "clipped", "log10_R2"} <= set(w["walk"][0])
        assert w["walk_note"] == (bkv_variants.COIN_NOTE if w["walk_is_coin"] else "")
    v = bkv_vs_uniform.summarize(recs)
    assert [r.variant for r in v.reproductions] == list(bkv_vs_uniform.BKV_VARIANTS)
    assert v.kind == "empirical" and v.reproduction in ("reproduced", "partial", "not-reproduced", "not-shown", "reversed")
    assert "the pseudocode" in v.headline and "released walk" in v.headline
    assert sum(f.kind == "versions disagree" for f in v.findings) == 8


def test_walk_summary_calls_a_fair_coin_a_coin():
    from kvbounds.proofs_checks.bkv_variants import COIN_NOTE, walk_summary
    coin = walk_summary([dict(mean_abs_p_dev=1e-10, clipped=0.0), dict(mean_abs_p_dev=2e-9, clipped=0.0)])
    assert coin["walk_is_coin"] and coin["walk_note"] == COIN_NOTE
    greedy = walk_summary([dict(mean_abs_p_dev=0.49, clipped=0.98)])
    assert not greedy["walk_is_coin"] and greedy["walk_note"] == ""


# -- backends: numpy is the reference ------------------------------------------------------------------------

@pytest.mark.parametrize("walk", [dict(), dict(walk_c=30.0), dict(center=False, carry_weights=False)])
def test_backends_agree_with_numpy(backend, walk):
    """Same numpy draws -> the same indices and weights on every backend; log-weights and the split estimator
    within sqrt(eps) of float64; every output on K's device."""
    from backend_helpers import assert_close, assert_equal, assert_on_device_of
    from kvbounds.algorithms.balance_kv_released import ESTIMATORS
    from kvbounds.algorithms.arrays import asarray
    K, V = _kv(n=160, scale=0.7)
    Kb, Vb = asarray(K, backend), asarray(V, backend)
    ref = released_select(K, V, levels=2, block_size=16, rng=np.random.default_rng(3), temp=0.1, **walk)
    got = released_select(Kb, Vb, levels=2, block_size=16, rng=np.random.default_rng(3), temp=0.1, **walk)
    for g, r in zip(got, ref):
        assert_equal(g, r)
        assert_on_device_of(g, Kb)
    q = np.random.default_rng(4).standard_normal((3, 2, 8))
    for est in ESTIMATORS:
        ref = compress_cache_released(K, V, sink=8, window=8, levels=2, block_size=16, rng=np.random.default_rng(5),
                                      estimator=est, **walk)
        got = compress_cache_released(Kb, Vb, sink=8, window=8, levels=2, block_size=16,
                                      rng=np.random.default_rng(5), estimator=est, **walk)
        assert_equal(got[0], ref[0])
        for g, r in zip(got, ref):
            assert_on_device_of(g, Kb)
        assert_close(got[1], ref[1])
        assert_close(got[2], ref[2])
        out = split_weighted_attention(asarray(q, backend), Kb, Vb, *got)
        assert_on_device_of(out, Kb)
        assert_close(out, split_weighted_attention(q, K, V, *ref))
    assert_equal(expand_groups(got[0], 2), np.repeat(ref[0], 2, axis=0))


def test_uniforms_from_a_torch_generator_follow_k_to_its_device(backend):
    """``uniforms`` drawing CPU torch tensors (the docstring's ``torch.rand(s, generator=g)``) with K on another
    device: the draws move to K's device (on CUDA they stayed on the CPU and the walk mixed devices)."""
    from backend_helpers import assert_equal, assert_on_device_of
    from kvbounds.algorithms.arrays import asarray
    K, V = _kv(n=96, scale=0.7)
    Kb, Vb = asarray(K, backend), asarray(V, backend)

    def draws():
        gen = torch.Generator().manual_seed(7)
        return lambda shape: torch.rand(tuple(shape), generator=gen, dtype=torch.float64)

    ref = released_select(K, V, levels=2, block_size=16, uniforms=draws())
    got = released_select(Kb, Vb, levels=2, block_size=16, uniforms=draws())
    for g, r in zip(got, ref):
        assert_equal(g, r)
        assert_on_device_of(g, Kb)


def test_kernel_overflow_raises_or_is_evaluated_in_float64():
    """Real SmolLM2 keys overflow the unnormalised kernel in float32 (exponent ~101 at n >= 1024): by default an
    InputError; overflow="float64" evaluates those levels in float64, the same signs as float64 input."""
    rng = np.random.default_rng(0)
    K = rng.standard_normal((2, 128, 16)) * 6.0          # temp ||k - mean||^2 / sqrt(d) ~ 140 > 88 (float32's exp)
    V = rng.standard_normal((2, 128, 8))
    kw = dict(levels=2, block_size=32)
    with pytest.raises(InputError, match="overflow='float64'"):
        released_select(K.astype(np.float32), V.astype(np.float32), rng=np.random.default_rng(1), **kw)
    diag: list = []
    idx32, w32 = released_select(K.astype(np.float32), V.astype(np.float32), rng=np.random.default_rng(1),
                                 overflow="float64", diagnostics=diag, **kw)
    idx64, w64 = released_select(K, V, rng=np.random.default_rng(1), **kw)
    np.testing.assert_array_equal(idx32, idx64)
    np.testing.assert_array_equal(w32, w64)
    assert all("float64" in d["evaluated_in"] for d in diag)
    with pytest.raises(InputError, match="overflow"):
        released_select(K, V, rng=np.random.default_rng(1), overflow="ignore", **kw)

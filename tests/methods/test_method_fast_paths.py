"""The end-to-end methods' host fast paths (issue 26: compression cheap next to the prefill) compute what the plain
formulas compute, bit for bit: kernel thinning's kernel matrix (upper triangle, in place, scratch reused), the
released walk's kernel (gemm with a copy, in place), subspace's projections written into one array, and the
stacked layers split back with CompressedKV.head_groups."""
import math

import numpy as np
import pytest

from kvbounds.algorithms import balance_kv_released as bkr
from kvbounds.algorithms import cache_compressors as cc
from kvbounds.algorithms import kernel_thinning as ktm
from kvbounds.algorithms.compressed_kv import CompressedKV
from kvbounds.algorithms.validation import InputError


def _plain_kernel_matrix(K, V):
    K, V, s2, shift = ktm._centred(K, V)
    return np.exp(K @ K.T / math.sqrt(K.shape[-1]) - shift) * (1.0 + V @ V.T / s2)


@pytest.mark.parametrize("n,d", [(1, 3), (64, 8), (130, 16), (200, 5)])
def test_kernel_thinning_matrix_is_the_plain_formula(n, d):
    rng = np.random.default_rng(n)
    K = rng.standard_normal((n, d)).astype(np.float32) * 2 + 3.0      # a common key component, as real keys have
    V = rng.standard_normal((n, d)).astype(np.float32)
    ref = _plain_kernel_matrix(K, V)
    assert np.array_equal(ktm._kernel_matrix(K, V), ref)
    scratch = np.full((2, n, n), np.nan)
    assert np.array_equal(ktm._kernel_matrix(K, V, scratch), ref)
    assert np.array_equal(ktm._kernel_matrix(K, V, scratch), ref)       # the scratch written over, reused


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("temp,beta", [(1.0, 0.0), (0.1, 0.5), (np.float64(0.3), 0.0), (2, 1)])
def test_released_kernel_is_the_plain_formula(dtype, temp, beta):
    rng = np.random.default_rng(3)
    Kc = rng.standard_normal((2, 3, 16, 8)).astype(dtype)
    Wc = rng.standard_normal((2, 3, 16, 8)).astype(dtype)
    gram = lambda X: np.matmul(X, np.ascontiguousarray(np.swapaxes(X, -1, -2)))     # the products before issue 26
    assert np.array_equal(bkr._self_gram(Kc), gram(Kc))
    G, _, _ = bkr._kernel(Kc, Wc, temp=temp, beta=beta, kernel_const=0.025, center=True)
    C = Kc - Kc.mean(axis=-2, keepdims=True)
    ref = np.exp(temp * gram(C) / math.sqrt(8) - beta) * (gram(Wc) + (0.025 + bkr.KERNEL_EPS))
    assert G.dtype == ref.dtype and np.array_equal(G, ref)


def test_subspace_projection_written_in_place_is_the_concatenation():
    rng = np.random.default_rng(5)
    K = rng.standard_normal((5, 120, 16)).astype(np.float32)
    V = rng.standard_normal((5, 120, 16)).astype(np.float32)
    sink, window, budget = 8, 8, 120 * 32 // 3
    got = cc.SubspaceCompressor(sink=sink, window=window).compress(K, V, budget_floats=budget)
    r = got.rank

    def plain(X):
        X = X.astype(np.float64)
        vec = np.linalg.eigh(np.swapaxes(X, -1, -2) @ X)[1]
        B = np.flip(vec, axis=-1)[..., :r]
        return (X @ B @ np.swapaxes(B, -1, -2)).astype(np.float32)
    for X, Y in ((K, got.keys), (V, got.values)):
        ref = np.concatenate([X[:, :sink], plain(X[:, sink:-window]), X[:, -window:]], axis=1)
        assert np.array_equal(Y, ref)
    assert not got.log_w_num.any() and not got.log_w_den.any() and got.log_w_num.dtype == np.float32


def test_head_groups_are_views_of_equal_parts():
    rng = np.random.default_rng(0)
    c = CompressedKV(rng.standard_normal((6, 4, 3)).astype(np.float32), rng.standard_normal((6, 4, 2)),
                     np.zeros((6, 4), np.float32), np.full((6, 4), -math.inf, np.float32), extra_floats=12, rank=2,
                     projected=3)
    parts = c.head_groups(3)
    assert len(parts) == 3
    for g, p in enumerate(parts):
        assert np.shares_memory(p.keys, c.keys) and np.array_equal(p.keys, c.keys[2 * g:2 * g + 2])
        assert np.array_equal(p.values, c.values[2 * g:2 * g + 2])
        assert np.array_equal(p.log_w_den, c.log_w_den[2 * g:2 * g + 2])
        assert (p.extra_floats, p.rank, p.projected) == (4, 2, 3)
    with pytest.raises(InputError, match="groups"):
        c.head_groups(4)
    with pytest.raises(InputError, match="groups"):
        c.head_groups(0)
    with pytest.raises(InputError, match="groups"):
        CompressedKV(np.zeros((4, 3)), np.zeros((4, 3)), np.zeros(4), np.zeros(4)).head_groups(2)

"""Coefficient-space attention (004 Secs. 4-6, 10): static and adaptive subspaces, gamma_B choices, the chunking
rules of Sec. 5, the batched decode kernel and its operation counts, backends and bad input."""
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvbounds.algorithms.attention import exact_attention
from kvbounds.algorithms.subspace_attention import (AdaptiveSubspaceAttention, Chunk, OpCounter, StaticSubspaceAttention,
                                           aggregate, calibrate_gamma, coefficient_decode, draft_gamma, exact_decode,
                                           resolve_gamma, top_basis)
from kvbounds.algorithms.validation import InputError
from kvbounds.algorithms.arrays import asarray, to_numpy
from kvbounds.theory.subspace import cost_model
from kvbounds.traces.rope import rope_trace
from kvbounds.traces.synthetic import make_trace


def test_full_rank_static_with_gamma_1_is_exact(backend):
    tr = make_trace("gaussian", n=200, d=16, seed=0)
    K, V, Q = (asarray(x, backend) for x in (tr.K, tr.V, tr.Q[:5]))
    I = asarray(np.eye(16), backend)
    att = StaticSubspaceAttention(I, I, gamma=1.0).extend(K, V)
    np.testing.assert_allclose(to_numpy(att.attend(Q)), exact_attention(tr.Q[:5], tr.K, tr.V), atol=1e-13)


@pytest.mark.parametrize("gamma", ["sqrt(r/d)", "1", 0.7])
def test_static_logits_are_gamma_q_P_k_over_sqrt_d(gamma):
    tr = make_trace("low_rank", n=300, d=32, seed=1, rank=4)
    att = StaticSubspaceAttention.from_calibration(tr.K[:150], tr.V[:150], 6, 5, gamma=gamma).extend(tr.K[150:], tr.V[150:])
    g = resolve_gamma(gamma, 6, 32)
    P, Pe = att.B.T @ att.B, att.E.T @ att.E
    q = tr.Q[:3]
    np.testing.assert_allclose(att.logits(q), g * q @ P @ tr.K[150:].T / math.sqrt(32), atol=1e-13)
    w = np.exp(att.logits(q) - att.logits(q).max(1, keepdims=True))
    np.testing.assert_allclose(att.attend(q), (w / w.sum(1, keepdims=True)) @ tr.V[150:] @ Pe, atol=1e-13)
    assert draft_gamma(6, 32) == pytest.approx(math.sqrt(6 / 32))


@given(st.integers(1, 8), st.integers(0, 10**6))
def test_calibrated_gamma_is_one_on_the_basis_own_keys(r, seed):
    """Least squares of q.k on q^T P k over the keys the SVD basis was fitted on is exactly 1 (P K^T K (I-P) = 0)."""
    rng = np.random.default_rng(seed)
    K, Q = rng.standard_normal((40, 8)), rng.standard_normal((10, 8))
    assert calibrate_gamma(Q, K, top_basis(K, r)) == pytest.approx(1.0, abs=1e-9)


def test_top_basis_orthonormal_and_padded():
    rng = np.random.default_rng(2)
    X = rng.standard_normal((3, 10))
    B = top_basis(X, 6)
    np.testing.assert_allclose(B @ B.T, np.eye(6), atol=1e-12)
    np.testing.assert_allclose(X @ B.T @ B, X, atol=1e-12)          # the rows of X lie in its span
    B0 = top_basis(np.zeros((0, 5)), 2)
    np.testing.assert_allclose(np.abs(B0), np.eye(5)[:2], atol=1e-12)


def test_length_triggered_chunks():
    tr = rope_trace(300, 16, rank=2, seed=3)
    att = AdaptiveSubspaceAttention(16, 4, 4, ell_k=8, ell_v=8, tau_k=math.inf, tau_v=math.inf, L=64).extend(tr.K, tr.V)
    assert [c.length for c in att.chunks] == [64] * 4 + [44]
    assert [c.reason for c in att.chunks] == ["start"] + ["L"] * 4
    assert att.fd_k.n_rows == att.fd_v.n_rows == 300
    mem = att.memory_floats()
    assert mem["chunks"] == 5 and mem["coefficients"] == 300 * 8


def test_zero_threshold_opens_a_chunk_per_token_and_draft_step_order():
    """tau = 0: every token after the first triggers (step 2). The trigger token is coded in the new chunk's basis,
    snapshot from the sketch *before* the token is added (step 4 after step 3)."""
    rng = np.random.default_rng(4)
    K, V = rng.standard_normal((12, 6)), rng.standard_normal((12, 6))
    att = AdaptiveSubspaceAttention(6, 2, 2, ell_k=3, ell_v=3, tau_k=0.0, tau_v=0.0, L=100).extend(K, V)
    assert len(att.chunks) == 12 and all(c.length == 1 for c in att.chunks)
    ch = att.chunks[5]
    from kvbounds.algorithms.frequent_directions import FrequentDirections
    expect = top_basis(FrequentDirections(6, 3).update(K[:5]).sketch(), 2)
    np.testing.assert_allclose(np.abs(ch.B @ expect.T), np.eye(2), atol=1e-9)   # same basis up to signs
    np.testing.assert_allclose(ch.C, K[5:6] @ ch.B.T, atol=1e-12)


def test_adaptive_with_full_rank_is_exact_and_backends_agree(backend):
    tr = rope_trace(150, 8, rank=3, seed=5)
    K, V, Q = (asarray(x, backend) for x in (tr.K, tr.V, tr.Q[-4:]))
    att = AdaptiveSubspaceAttention(8, 8, 8, ell_k=8, ell_v=8, tau_k=0.1, tau_v=0.1, L=40, gamma=1.0).extend(K, V)
    np.testing.assert_allclose(to_numpy(att.attend(Q)), exact_attention(tr.Q[-4:], tr.K, tr.V), atol=1e-12)


def test_adaptive_numpy_and_torch_agree():
    tr = rope_trace(200, 16, rank=3, freq_bias=8.0, seed=6)
    kw = dict(ell_k=8, ell_v=8, tau_k=0.3, tau_v=0.3, L=50)
    a = AdaptiveSubspaceAttention(16, 4, 4, **kw).extend(tr.K, tr.V)
    b = AdaptiveSubspaceAttention(16, 4, 4, **kw).extend(asarray(tr.K, "torch:cpu"), asarray(tr.V, "torch:cpu"))
    assert [c.start for c in a.chunks] == [c.start for c in b.chunks]
    np.testing.assert_allclose(to_numpy(b.attend(asarray(tr.Q[-3:], "torch:cpu"))), a.attend(tr.Q[-3:]), atol=1e-10)


def test_adaptive_with_init_bases_on_the_backend(backend):
    """Initial bases of the tokens' backend and device: the same chunks and outputs as numpy; bases on another
    backend (or, on a GPU, on the CPU beside CUDA tokens) or of the wrong shape are an InputError, not a crash."""
    from backend_helpers import assert_close, assert_on_device_of
    tr = rope_trace(120, 8, rank=3, seed=7)
    B0, E0 = np.eye(8)[:3], np.eye(8)[2:6]
    kw = dict(ell_k=6, ell_v=6, tau_k=0.5, tau_v=0.5, L=40)
    ref = AdaptiveSubspaceAttention(8, 3, 4, init_bases=(B0, E0), **kw).extend(tr.K, tr.V)
    got = AdaptiveSubspaceAttention(8, 3, 4, init_bases=(asarray(B0, backend), asarray(E0, backend)), **kw)
    got.extend(asarray(tr.K, backend), asarray(tr.V, backend))
    assert [c.start for c in got.chunks] == [c.start for c in ref.chunks]
    out = got.attend(asarray(tr.Q[-3:], backend))
    assert_on_device_of(out, asarray(tr.K, backend))
    assert_close(out, ref.attend(tr.Q[-3:]))
    with pytest.raises(InputError, match="rows"):
        AdaptiveSubspaceAttention(8, 3, 4, init_bases=(B0[:2], E0), **kw)
    if backend != "numpy":
        with pytest.raises(InputError, match="init_bases and the tokens"):
            AdaptiveSubspaceAttention(8, 3, 4, init_bases=(B0, E0), **kw).extend(asarray(tr.K, backend),
                                                                                asarray(tr.V, backend))


def test_masked_decode():
    tr = make_trace("gaussian", n=40, d=8, seed=7)
    I = np.eye(8)
    att = StaticSubspaceAttention(I, I, gamma=1.0).extend(tr.K, tr.V)
    mask = np.arange(40) < 25
    np.testing.assert_allclose(att.attend(tr.Q[0], mask=mask), exact_attention(tr.Q[0], tr.K[:25], tr.V[:25]), atol=1e-13)


@given(st.integers(1, 5), st.integers(1, 40), st.integers(1, 6), st.integers(1, 6), st.integers(0, 10**6))
def test_batched_decode_matches_blockwise_and_its_counts_match_the_model(J, L, r, r_v, seed):
    d = 8
    rng = np.random.default_rng(seed)
    B = np.stack([top_basis(rng.standard_normal((r + 1, d)), r) for _ in range(J)])
    E = np.stack([top_basis(rng.standard_normal((r_v + 1, d)), r_v) for _ in range(J)])
    C, D, q = rng.standard_normal((J, L, r)), rng.standard_normal((J, L, r_v)), rng.standard_normal(d)
    ops = OpCounter(np)
    o = coefficient_decode(q, B, E, C.transpose(0, 2, 1).copy(), D.transpose(0, 2, 1).copy(), gamma=0.8, ops=ops)
    chunks = [Chunk(B[j], E[j], C[j], D[j], j * L, (j + 1) * L) for j in range(J)]
    np.testing.assert_allclose(o, aggregate(q, chunks, 0.8, d), atol=1e-12)
    m = cost_model(J * L, d, r, r_v, J=J, bytes_per_float=8)
    assert (ops.flops, ops.bytes) == (m["ours_flops"], m["ours_bytes"])
    K, V = rng.standard_normal((J * L, d)), rng.standard_normal((J * L, d))
    ops_e = OpCounter(np)
    np.testing.assert_allclose(exact_decode(q, K, V, ops=ops_e), exact_attention(q, K, V), atol=1e-12)
    assert (ops_e.flops, ops_e.bytes) == (m["baseline_flops"], m["baseline_bytes"])


@pytest.mark.parametrize("case", ["nonorthonormal", "r_gt_d", "ell_lt_r", "neg_tau", "nan_tau", "bad_gamma_str",
                                  "neg_gamma", "calibrated_missing", "empty_attend", "kv_rows", "q_dim", "nan_k"])
def test_bad_input_raises(case):
    I = np.eye(4)
    calls = {
        "nonorthonormal": lambda: StaticSubspaceAttention(2 * I[:2], I[:2]),
        "r_gt_d": lambda: AdaptiveSubspaceAttention(4, 5, 2, ell_k=8, ell_v=8, tau_k=1, tau_v=1, L=4),
        "ell_lt_r": lambda: AdaptiveSubspaceAttention(4, 3, 2, ell_k=2, ell_v=8, tau_k=1, tau_v=1, L=4),
        "neg_tau": lambda: AdaptiveSubspaceAttention(4, 2, 2, ell_k=2, ell_v=2, tau_k=-1, tau_v=1, L=4),
        "nan_tau": lambda: AdaptiveSubspaceAttention(4, 2, 2, ell_k=2, ell_v=2, tau_k=math.nan, tau_v=1, L=4),
        "bad_gamma_str": lambda: StaticSubspaceAttention(I[:2], I[:2], gamma="sqrt(d/r)"),
        "neg_gamma": lambda: StaticSubspaceAttention(I[:2], I[:2], gamma=-1.0),
        "calibrated_missing": lambda: StaticSubspaceAttention(I[:2], I[:2], gamma="calibrated"),
        "empty_attend": lambda: StaticSubspaceAttention(I[:2], I[:2]).attend(np.ones(4)),
        "kv_rows": lambda: StaticSubspaceAttention(I[:2], I[:2]).extend(np.ones((3, 4)), np.ones((2, 4))),
        "q_dim": lambda: StaticSubspaceAttention(I[:2], I[:2]).extend(np.ones((3, 4)), np.ones((3, 4))).attend(np.ones(5)),
        "nan_k": lambda: AdaptiveSubspaceAttention(4, 2, 2, ell_k=2, ell_v=2, tau_k=1, tau_v=1, L=4).extend(
            np.full((2, 4), np.nan), np.ones((2, 4))),
    }
    with pytest.raises(InputError):
        calls[case]()


@pytest.mark.parametrize("taus", [(0.05, 0.05), (0.5, 0.5), (math.inf, math.inf)])
def test_host_syncs_per_token_and_windowed_extend_on_torch_cpu(taus, monkeypatch):
    """Issue 15: step() reads the host once per token (its checks and both residuals in one copy; it was about
    ten, with the sketches' checks); extend() reads a window of residuals at once, so on a stream that stays in its
    subspace the reads per token fall well below one. Same chunks, triggers and output as one token at a time, bit
    for bit, and as numpy within rounding. (Windows are what GPU arrays get; forced here on CPU tensors.)"""
    pytest.importorskip("torch")
    from sync_counter import count_syncs
    monkeypatch.setattr(AdaptiveSubspaceAttention, "WINDOWED", True)
    rng = np.random.default_rng(2)
    n, d = 64, 8
    basis = np.linalg.qr(rng.standard_normal((d, 3)))[0].T
    K = rng.standard_normal((n, 3)) @ basis + 0.01 * rng.standard_normal((n, d))
    V = rng.standard_normal((n, 3)) @ basis + 0.01 * rng.standard_normal((n, d))
    Q = rng.standard_normal((4, d))
    Kt, Vt, Qt = (asarray(x, "torch:cpu") for x in (K, V, Q))
    make = lambda: AdaptiveSubspaceAttention(d, 3, 3, ell_k=4, ell_v=4, tau_k=taus[0], tau_v=taus[1], L=32)
    stepped, extended, ref = make(), make(), make()
    with count_syncs() as c:
        for j in range(n):
            stepped.step(Kt[j], Vt[j])
    assert c.reads <= n + 2 * len(stepped.chunks) and c.uploads == c.masks == 0, c     # + top_basis' scale per chunk
    with count_syncs() as c:
        extended.extend(Kt, Vt)
    # a trigger restarts the window at one token, so a stream with many chunks reads nearly once per token
    assert c.total <= (n // 2 if len(extended.chunks) <= 4 else n + 2 * len(extended.chunks)), (c, len(extended.chunks))
    ref.extend(K, V)
    assert stepped.triggers == extended.triggers
    assert [(ch.start, ch.stop, ch.reason) for ch in extended.chunks] == [(ch.start, ch.stop, ch.reason) for ch in ref.chunks]
    assert to_numpy(stepped.attend(Qt)).tobytes() == to_numpy(extended.attend(Qt)).tobytes()
    assert stepped.fd_k.certificate() == extended.fd_k.certificate()
    np.testing.assert_allclose(to_numpy(extended.attend(Qt)), ref.attend(Q), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose([t[2:] for t in extended.triggers[1:]], [t[2:] for t in ref.triggers[1:]], rtol=1e-9)
    bad = Kt.clone()
    bad[5, 2] = float("inf")
    with pytest.raises(InputError, match="NaN or Inf"):
        make().extend(bad, Vt)
    with pytest.raises(InputError, match="too large"):
        make().step(Kt[0] * 1e300, Vt[0])

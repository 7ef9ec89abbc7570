"""The synthetic RoPE generator (traces/rope.py; seed 004 Sec. 7): frequencies, rotations, the relative-position
property, both pair layouts, and the spectra of pre- and post-RoPE keys."""
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvbounds.algorithms.validation import InputError
from kvbounds.theory.subspace import energy_at_rank
from kvbounds.traces.rope import apply_rope, rope_frequencies, rope_trace
from kvbounds.traces.synthetic import Trace


def test_frequencies():
    f = rope_frequencies(8, 1e4)
    np.testing.assert_allclose(f, [1.0, 1e4 ** -0.25, 1e4 ** -0.5, 1e4 ** -0.75])
    assert rope_frequencies(64, 1e5)[-1] == pytest.approx(1e5 ** (-62 / 64))


@pytest.mark.parametrize("convention", ["half", "interleaved"])
@given(st.integers(0, 10**6), st.integers(-50, 5000), st.integers(-50, 5000), st.sampled_from([1e4, 1e5]))
def test_relative_position_property(convention, seed, m, n, theta):
    """<R_m q, R_n k> = <q, R_{n-m} k>: logits depend on the offset only; rotations preserve norms."""
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((1, 16)), rng.standard_normal((1, 16))
    Rq = apply_rope(q, m, theta=theta, convention=convention)
    Rk = apply_rope(k, n, theta=theta, convention=convention)
    rel = apply_rope(k, n - m, theta=theta, convention=convention)
    assert float((Rq @ Rk.T)[0, 0]) == pytest.approx(float((q @ rel.T)[0, 0]), rel=1e-9, abs=1e-9)
    assert np.linalg.norm(Rk) == pytest.approx(np.linalg.norm(k), rel=1e-12)
    np.testing.assert_allclose(apply_rope(k, 0, theta=theta, convention=convention), k)


def test_half_layout_matches_the_hugging_face_formula():
    """x cos + rotate_half(x) sin with cos/sin tables of cat([angles, angles]) (HF Llama, SmolLM2)."""
    rng = np.random.default_rng(0)
    X, d = rng.standard_normal((6, 8)), 8
    pos = np.arange(6)
    ang = pos[:, None] * rope_frequencies(d, 1e5)[None, :]
    emb = np.concatenate([ang, ang], axis=1)
    rot = np.concatenate([-X[:, d // 2:], X[:, :d // 2]], axis=1)
    np.testing.assert_allclose(apply_rope(X, pos, theta=1e5), X * np.cos(emb) + rot * np.sin(emb), atol=1e-12)


def test_layouts_differ_by_a_permutation():
    rng = np.random.default_rng(1)
    X, d = rng.standard_normal((5, 8)), 8
    perm = np.array([0, 4, 1, 5, 2, 6, 3, 7])          # half-layout index of interleaved coordinate
    a = apply_rope(X[:, perm], np.arange(5), convention="interleaved")
    b = apply_rope(X, np.arange(5), convention="half")[:, perm]
    np.testing.assert_allclose(a, b, atol=1e-12)


def test_trace_shapes_and_meta():
    tr = rope_trace(300, 32, 16, rank=4, value_rank=3, theta=1e5, seed=2)
    assert isinstance(tr, Trace) and tr.Q.shape == tr.K.shape == (300, 32) and tr.V.shape == (300, 16)
    np.testing.assert_allclose(apply_rope(tr.meta["K_pre"], tr.meta["positions"], theta=1e5), tr.K)
    assert tr.meta["theta"] == 1e5 and tr.meta["rank"] == 4
    assert np.median(np.linalg.norm(tr.K, axis=1)) == pytest.approx(1.0, rel=0.5)


def test_spectra_pre_and_post_rope():
    """Pre-RoPE keys are rank 4 (+ noise); RoPE spreads them globally; a short window stays near low rank; the
    slower theta 1e5 and a bias towards low-frequency pairs spread them less."""
    d, r, n = 64, 4, 2048
    tr = rope_trace(n, d, rank=r, noise=0.01, theta=1e4, seed=3)
    pre, post = energy_at_rank(tr.meta["K_pre"], r), energy_at_rank(tr.K, r)
    assert pre > 0.99 and post < 0.5
    window = energy_at_rank(tr.K[1000:1016], 2 * r)
    assert window > post
    slow = rope_trace(n, d, rank=r, noise=0.01, theta=1e5, seed=3)
    biased = rope_trace(n, d, rank=r, noise=0.01, theta=1e4, freq_bias=8.0, seed=3)
    assert energy_at_rank(biased.K, 2 * r) > energy_at_rank(tr.K, 2 * r)
    assert energy_at_rank(slow.K, 4 * r) > energy_at_rank(tr.K, 4 * r) - 0.05


@pytest.mark.parametrize("call", [lambda: rope_frequencies(7), lambda: apply_rope(np.ones(4), 0),
                                  lambda: apply_rope(np.ones((2, 4)), 0, convention="other"),
                                  lambda: rope_trace(10, 8, rank=9), lambda: rope_trace(0, 8),
                                  lambda: rope_frequencies(8, theta=-1.0)])
def test_bad_input_raises(call):
    with pytest.raises(InputError):
        call()


def test_seed_reproducible():
    a, b = rope_trace(50, 8, seed=11), rope_trace(50, 8, seed=11)
    np.testing.assert_array_equal(a.K, b.K)
    assert not math.isclose(float(a.K[0, 0]), float(rope_trace(50, 8, seed=12).K[0, 0]))

import numpy as np
import pytest

from kvbounds.algorithms.attention import attention_weights, causal_attention, exact_attention
from kvbounds.algorithms.validation import InputError
from kvbounds.algorithms.arrays import asarray, to_numpy


def test_matches_definition(rng):
    q, K, V = rng.standard_normal(5), rng.standard_normal((9, 5)), rng.standard_normal((9, 3))
    w = np.exp(K @ q / np.sqrt(5))
    np.testing.assert_allclose(exact_attention(q, K, V), w @ V / w.sum(), rtol=1e-12)
    np.testing.assert_allclose(attention_weights(q, K).sum(), 1.0)


def test_batched_queries_and_causal(rng):
    Q, K, V = rng.standard_normal((6, 4)), rng.standard_normal((6, 4)), rng.standard_normal((6, 2))
    out = causal_attention(Q, K, V)
    for j in range(6):
        np.testing.assert_allclose(out[j], exact_attention(Q[j], K[: j + 1], V[: j + 1]), rtol=1e-12)
    assert exact_attention(Q, K, V).shape == (6, 2)


def test_no_overflow_for_huge_logits():
    K = np.array([[1000.0, 0.0], [0.0, 1000.0]])
    out = exact_attention(np.array([1000.0, 0.0]), K, np.eye(2))
    assert np.all(np.isfinite(out)) and out[0] == pytest.approx(1.0)


def test_backends_agree(backend, rng):
    q, K, V = rng.standard_normal((3, 4)), rng.standard_normal((7, 4)), rng.standard_normal((7, 2))
    Q = rng.standard_normal((7, 4))
    np.testing.assert_allclose(to_numpy(causal_attention(*(asarray(x, backend) for x in (Q, K, V)))),
                               causal_attention(Q, K, V), rtol=1e-10)
    np.testing.assert_allclose(to_numpy(exact_attention(*(asarray(x, backend) for x in (q, K, V)))),
                               exact_attention(q, K, V), rtol=1e-10)


@pytest.mark.parametrize("q,K,V,match", [
    (np.ones(3), np.ones((4, 2)), np.ones((4, 1)), "last dimension"),
    (np.ones(2), np.ones((4, 2)), np.ones((3, 1)), "same number of rows"),
    (np.ones(2), np.ones((0, 2)), np.ones((0, 1)), "empty"),
    (np.ones(2), np.full((4, 2), np.inf), np.ones((4, 1)), "NaN or Inf"),
    (np.ones(2), np.ones((4, 2)), np.ones(4), "dimension"),
    ([1.0, 1.0], np.ones((4, 2)), np.ones((4, 1)), "must be an array"),
])
def test_bad_inputs(q, K, V, match):
    with pytest.raises(InputError, match=match):
        exact_attention(q, K, V)


def test_weights_backends_agree(backend, rng):
    """softmax_weights / attention_weights on the backend: numpy's within the dtype's tolerance, on its device."""
    from backend_helpers import assert_close, assert_on_device_of
    from kvbounds.algorithms.attention import softmax_weights
    q, K = rng.standard_normal((3, 4)), rng.standard_normal((2, 7, 4)) * 30
    extra = np.log(rng.random(7))
    Kb = asarray(K, backend)
    got = softmax_weights(asarray(q, backend), Kb, 0.5, asarray(extra, backend))
    assert_on_device_of(got, Kb)
    assert_close(got, softmax_weights(q, K, 0.5, extra), atol=1e-300)
    got = attention_weights(asarray(q, backend), Kb[0])
    assert_on_device_of(got, Kb)
    assert_close(got, attention_weights(q, K[0]), atol=1e-300)

import numpy as np
import pytest

from kvbounds.algorithms.validation import InputError
from kvbounds.traces import GENERATORS, make_trace


@pytest.mark.parametrize("kind", list(GENERATORS))
def test_shapes_and_determinism(kind):
    a = make_trace(kind, n=50, d=8, s=4, seed=3)
    b = make_trace(kind, n=50, d=8, s=4, seed=3)
    assert a.Q.shape == a.K.shape == (50, 8) and a.V.shape == (50, 4)
    np.testing.assert_array_equal(a.K, b.K)
    assert all(np.isfinite(x).all() for x in (a.Q, a.K, a.V))
    assert a.meta["kind"] == kind


def test_bounded_norm_respects_r():
    t = make_trace("bounded_norm", n=500, d=16, seed=0, r=2.5)
    assert t.max_norm() <= 2.5 + 1e-12


def test_clustered_is_clustered():
    t = make_trace("clustered", n=400, d=16, seed=0, m=4, spread=0.01)
    assert len(np.unique(np.round(t.K, 1), axis=0)) <= 4 * 50


def test_heavy_tailed_values_span_scales():
    t = make_trace("heavy_tailed_values", n=2000, d=8, seed=0)
    norms = np.linalg.norm(t.V, axis=1)
    assert norms.max() / np.median(norms) > 10


def test_bad_parameters():
    with pytest.raises(InputError, match="unknown trace kind"):
        make_trace("fractal", n=5, d=2)
    with pytest.raises(InputError, match="n"):
        make_trace("gaussian", n=0, d=2)
    with pytest.raises(InputError, match="rank"):
        make_trace("low_rank", n=5, d=4, rank=9)

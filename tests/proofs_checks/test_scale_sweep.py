"""The scale sweeps' rate past a reached onset when the measured curve still bends at the largest size (issue 47):
not reached, with the size a decision needs (where the falling local slope reaches flat) and a unit's CPU seconds
there (the measured time per size, continued); an undetermined rate whose curve is flat at its end stays
undetermined."""
import math

import numpy as np
import pytest

from kvbounds.core import Record
from kvbounds.proofs_checks.scale_sweep import cpu_at, decide_scale, local_slopes, needed_size, scale_findings
from kvbounds.verdict import GROWTH_TOL, rate_words

SIZES = (1024, 2048, 4096, 8192, 16384)


def _bending(n):
    """A log-log local slope of 0.35 - 0.05 log2(n / 1024): falling, still 0.1 at n = 8192..16384."""
    k = math.log2(n / 1024)
    return math.exp(math.log(2) * (0.35 * k - 0.025 * k * k))


def _recs(curve, units=6, noise=0.12, seed=5):
    rng = np.random.default_rng(seed)
    out = []
    for u in range(units):
        level = math.exp(rng.normal(0, 0.3))
        for n in SIZES:
            out.append(Record("MR.error", dict(t=n, unit=u, d=2, s=1), 0, "numpy",
                              curve(n) * level * math.exp(rng.normal(0, noise)), 1.0, True, bound_kind="shape",
                              check="paper c", extra=dict(cpu_s=0.268 * (n / 16384) ** 2, wall_s=1.0)))
    return out


def _decide(recs, onset=4096.0):
    return decide_scale(recs, "t", main="paper c", control=None, group=lambda r: r.params["d"],
                        onset=lambda r: onset, top=lambda r: 1000.0, value=lambda r: r.ratio, stated_exponent=-1.0,
                        label="O(1/t) rate", words="d = ")


def test_needed_size_continues_the_falling_local_slope_to_flat():
    local = [(4096.0, 8192.0, 0.2), (8192.0, 16384.0, 0.1)]          # falls 0.1 a doubling
    assert needed_size(local, 16384.0) == 32768.0                    # one more doubling reaches 0
    assert needed_size([(4096.0, 8192.0, 0.22), (8192.0, 16384.0, 0.14)], 16384.0) == 4 * 16384.0
    assert needed_size([(4096.0, 8192.0, 0.1), (8192.0, 16384.0, 0.2)], 16384.0) is None     # not falling
    assert needed_size(local[1:], 16384.0) is None


def test_cpu_at_continues_the_measured_growth_per_doubling():
    recs = _recs(_bending)
    assert cpu_at(recs, "t", 65536.0) == pytest.approx(0.268 * 16)  # n^2 per unit: x4 a doubling
    assert cpu_at([r for r in recs if r.params["t"] == 1024], "t", 4096.0) is None


def test_a_curve_still_bending_past_the_onset_is_not_reached_with_the_size_needed():
    recs = _recs(_bending)
    [x], _, parts = _decide(recs)
    slopes = [s for _, _, s in local_slopes(recs, "t", value=lambda r: r.ratio)]
    assert slopes[-1] < slopes[-2] and slopes[-1] > 0
    assert x.rate == "not-reached" and x.bend is None
    ri = x.info
    assert ri.onset == 4096.0 and ri.largest == 16384.0 and ri.needed == 65536.0
    assert ri.needed_cpu_s == pytest.approx(0.268 * 16)
    assert ri.ci[0] < -1 + GROWTH_TOL < ri.ci[1]                      # the fit past t*/2 alone: undetermined
    words = rate_words(x.rate, ri)
    assert "past the derived onset t* ~ 4.1e+03 the measured curve still bends at the largest t = 16384" in words
    assert "deciding needs t ~ 6.6e+04, ~4.3 CPU s a unit at that size" in words
    assert any("falls toward flat near t ~ 6.6e+04 (16 t*" in p for p in parts)
    [f] = scale_findings("MR.error", [x], recs, "paper c", "MergeAndReduce's O(1/t) rate")
    assert "has not set in by t = 16384 = 4 t*" in f.title


def test_a_curve_flat_at_its_end_keeps_its_decision():
    recs = _recs(lambda n: min(n, 3000) ** 1.0, noise=0.05)           # grows as t, then flat: O(1/t) observed
    [x], _, _ = _decide(recs, onset=8192.0)
    assert x.bend is not None and x.rate == "observed" and x.info.needed is None

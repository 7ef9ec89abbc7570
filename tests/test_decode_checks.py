"""The decode-time checks BKV.decode and SG.decode (issue 23): records and verdicts from measurement rows (cheap,
synthetic rows; the SmolLM2 smoke run of both checks is in tests/test_checks.py)."""
from __future__ import annotations

import math

import numpy as np

from kvbounds.proofs_checks import bkv_decode, sg_decode
from kvbounds.proofs_checks.decode_stream import FAMILY, PROFILES, certificate_stats, trial_params
from kvbounds.proofs_checks.decode_verdict import SHAPE, build_records, summarize
from kvbounds.proofs_checks.power_streams import POWER_CHECK
from kvbounds.registry import get_claim


def rows(method_err: float, layers: int = 12, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    for n in (160, 192, 224, 256):
        for layer in range(layers):
            heads = []
            for _ in range(3):
                e = method_err * rng.uniform(0.5, 1.5)
                heads.append(dict(err=e, units={"F": 1.0, "op": 0.5}, cert=10 * e, r=5.0, kmax=5.0, vmax=1.0,
                                  qnorm=4.0, controls={"zeros": 1.0 + rng.uniform(), "mean_values": 0.5 + rng.uniform(),
                                                       "recent": 0.3 + rng.uniform(0, .1), "uniform": 0.4}))
            out.append(dict(n=n, layer=layer, stored=96 + n % 32, d=64, heads=heads))
    return out


def test_records_and_verdict():
    rs = build_records("BKV.decode", "src", trial_params("quick"), rows(0.01), "F", lambda row, h: math.log(2.0))
    shape = [r for r in rs if r.check == SHAPE]
    power = [r for r in rs if r.check == POWER_CHECK]
    assert len(shape) == 48 and len(power) == 12 and all(r.params["family"] == FAMILY for r in power)
    assert all(r.bound == 2.0 and r.bound_kind == "shape" and r.extra["cert_covered"] == 3 for r in shape)
    v = summarize("BKV.decode", rs, scale_text="s", certificate_kind="a bound")
    assert v.statement == "holds-fitted" and v.fitted_constant.kind == "fitted"
    assert "covers the measured error in 144/144" in v.summary and v.power == "shown"
    assert "best trivial control (recent)" in v.summary


def test_no_better_than_a_control_is_low_power():
    rs = build_records("SG.decode", "src", trial_params("quick"), rows(2.0), "op", lambda row, h: 0.0)
    v = summarize("SG.decode", rs, scale_text="s", certificate_kind="an estimate")
    assert v.power == "low"


def test_certificate_stats_counts_vacuous_and_misses():
    row = dict(heads=[dict(err=1.0, cert=0.5, vmax=1.0), dict(err=0.1, cert=3.0, vmax=1.0)])
    s = certificate_stats([row])
    assert s == dict(heads=2, covered=1, looseness=np.median([0.5, 30.0]), vacuous=1)


def test_claims_registered_with_profiles():
    for mod in (bkv_decode, sg_decode):
        c = get_claim(mod.CLAIM)
        assert c.check_module() is mod and c.bound_function() is not None and c.kind == "theorem"
        assert mod.trials("full")[0]["prompt"] == 512 and mod.trials("full")[0]["new"] == 1024
        assert mod.trials("quick")[0]["model"] == "smollm2" and mod.trials("smoke")[0]["model"] == "tiny"
    assert PROFILES["full"]["target"] == 256 and PROFILES["full"]["interval"] == 64

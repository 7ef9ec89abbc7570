"""SUB.logit-error against the trivial logit estimators (the rule is :mod:`kvbounds.controls`).

The draft's logit bound (Subspace-FD-draft Sec. 8) is an error bound on the estimate l^_i = gamma q^T P_B k_i /
sqrt d. Its trivial competitors: ``zeros`` (l^ = 0) and ``mean_keys`` (l^_i = q^T mean(k) / sqrt d, O(d) memory:
every logit replaced by the one of the mean key). Metric, in the bound's own unit: the max over 8 queries of
||l - l^||_inf / (||q|| max_i ||k_i|| / sqrt d), so zeros scores <= 1 by Cauchy-Schwarz. The method is the static
rank-8 subspace of SUB.output-error's power sweep (bases from the first half of the stream), at the draft's
default gamma = sqrt(r/d) and at gamma = 1 (the only gamma for which the stated bound holds); one setting per
(stream family, gamma). Records: ``check = POWER_CHECK``, ``bound_kind="shape"``, ``extra["controls"]``.
"""
from __future__ import annotations

import math

import numpy as np

from kvbounds.algorithms.subspace_attention import StaticSubspaceAttention
from kvbounds.controls import WorstError
from kvbounds.algorithms.arrays import to_numpy

from .common import pick
from .power_streams import missing_record, power_record, real_params

POWER_FAMILIES = ("low_rank", "gaussian", "real SmolLM2", "real MiniLM")
POWER_R = 8
GAMMAS = ("sqrt(r/d)", 1.0)


def power_trials(profile: str) -> list[dict]:
    """One trial per family running all its ``streams`` (cheap streams: one trial each would cost more in dispatch)."""
    return [dict(dict(mode="power", kind=f, family=f, n=pick(profile, smoke=128, quick=256, full=1024), d=64,
                      streams=pick(profile, smoke=2, quick=10, full=20), sweep="power"), **real_params(f, profile))
            for f in pick(profile, smoke=POWER_FAMILIES[:2], quick=POWER_FAMILIES, full=POWER_FAMILIES)]


def _stream(params: dict, seed: int, rng):
    fam = params["family"]
    if fam in ("low_rank", "gaussian"):
        from kvbounds.traces.synthetic import make_trace
        tr = make_trace(fam, n=params["n"], d=params["d"], seed=rng, **({"rank": 8, "r": 4.0} if fam == "low_rank" else {}))
        return tr.Q, tr.K, tr.V
    from .power_streams import stream
    Q, K, V, _, _ = stream(dict(params, family=fam), seed, scale_of_d=lambda d: 1 / math.sqrt(d))
    return Q, K, V


def power_trial(claim: str, source: str, params: dict, seed: int):
    """Per stream (``rep`` = 0 .. streams - 1, each its own seed), one record per gamma."""
    return [r for i in range(params["streams"])
            for r in stream_trial(claim, source, dict(params, rep=i), seed * 1000 + i)]


def stream_trial(claim: str, source: str, params: dict, seed: int):
    """One record per gamma (see the module docstring); a missing real model gives a record that says so."""
    rng = np.random.default_rng(seed)
    try:
        Q, K, V = _stream(params, seed, rng)
    except LookupError as e:
        return [missing_record(claim, params, source, e, gamma_choice=str(g)) for g in GAMMAS]
    n, d = K.shape
    qs = Q[rng.choice(len(Q), 8, replace=False)]
    unit = np.linalg.norm(qs, axis=1) * float(np.linalg.norm(K, axis=1).max()) / math.sqrt(d)
    exact = qs @ K.T / math.sqrt(d)                                        # (8, n)
    ctl = WorstError()
    for a in range(len(qs)):
        ctl.add("zeros", np.abs(exact[a]).max() / unit[a])
        ctl.add("mean_keys", np.abs(exact[a] - qs[a] @ K.mean(0) / math.sqrt(d)).max() / unit[a])
    controls = ctl.values()
    recs = []
    for g in GAMMAS:
        att = StaticSubspaceAttention.from_calibration(K[: n // 2], V[: n // 2], r=POWER_R, r_v=POWER_R,
                                                       gamma=g).extend(K, V)
        lhat = to_numpy(att.logits(qs))
        worst = float((np.abs(exact - lhat).max(axis=1) / unit).max())
        recs.append(power_record(claim, params, source, worst, controls, gamma=float(att.gamma),
                                 gamma_choice=str(g)))
    return recs


def setting(r) -> str:
    g = r.extra.get("gamma_choice", "?")
    return f"{r.params['family']} | gamma={'1' if g == '1.0' else g}"

"""SUB.logit-error against the battery of controls (:mod:`kvbounds.battery`; the rule is :mod:`kvbounds.battery`).

The draft's logit bound (Subspace-FD-draft Sec. 8) is an error bound on the estimate l^_i = gamma q^T P_B k_i /
sqrt d. Its competitors at the method's floats (:func:`logit_controls`): ``zeros`` (l^ = 0), ``mean`` (l^_i =
q^T mean(k) / sqrt d, O(d) memory: every logit replaced by the one of the mean key), ``streaming_llm`` and
``uniform`` (the tokens they keep exact, the others at the mean key's logit), and the ablation (a random basis of
the same rank). Metric, in the bound's own unit: the max over 8 queries of
||l - l^||_inf / (||q|| max_i ||k_i|| / sqrt d), so zeros scores <= 1 by Cauchy-Schwarz. The method is the static
rank-8 subspace of SUB.output-error's power sweep (bases from the first half of the stream), at the draft's
default gamma = sqrt(r/d) and at gamma = 1 (the only gamma for which the stated bound holds); one setting per
(stream family, gamma). Records: ``check = POWER_CHECK``, ``bound_kind="shape"``, ``extra["controls"]``.
"""
from __future__ import annotations

import math

import numpy as np

from kvbounds.algorithms.subspace_attention import StaticSubspaceAttention
from kvbounds.algorithms.arrays import to_numpy

from .common import pick
from kvbounds.streams import battery_record, missing_record, real_params, streams_per_family

POWER_FAMILIES = ("low_rank", "gaussian", "real SmolLM2", "real MiniLM")
POWER_R = 8
GAMMAS = ("sqrt(r/d)", 1.0)


def power_trials(profile: str) -> list[dict]:
    """One trial per family running all its ``streams`` (cheap streams: one trial each would cost more in dispatch)."""
    return [dict(dict(mode="power", kind=f, family=f, n=pick(profile, smoke=128, quick=256, full=1024), d=64,
                      streams=streams_per_family(profile), sweep="power"), **real_params(f, profile))
            for f in pick(profile, smoke=POWER_FAMILIES[:2], quick=POWER_FAMILIES, full=POWER_FAMILIES)]


def _stream(params: dict, seed: int, rng):
    fam = params["family"]
    if fam in ("low_rank", "gaussian"):
        from kvbounds.traces.synthetic import make_trace
        tr = make_trace(fam, n=params["n"], d=params["d"], seed=rng, **({"rank": 8, "r": 4.0} if fam == "low_rank" else {}))
        return tr.Q, tr.K, tr.V, f"draw {fam} #{params.get('rep', 0)} (seed {seed})"
    from kvbounds.streams import stream
    ps = stream(dict(params, family=fam), seed, scale_of_d=lambda d: 1 / math.sqrt(d), held_out=0)
    return ps.Q, ps.K, ps.V, ps.unit


def power_trial(claim: str, source: str, params: dict, seed: int):
    """Per stream (``rep`` = 0 .. streams - 1, each its own seed), one record per gamma."""
    return [r for i in range(params["streams"])
            for r in stream_trial(claim, source, dict(params, rep=i), seed * 1000 + i)]


def logit_controls(qs, K, floats: int, rng) -> tuple[dict, dict]:
    """The battery's logit estimates of l = K q / sqrt(d) for the queries ``qs`` (8, d) at ``floats`` (keys only):
    ``zeros`` (l^ = 0, no float), ``mean`` (every logit the mean key's, d floats), ``streaming_llm`` and
    ``uniform`` (the tokens they keep (kvbounds.battery.streaming_llm_indices / uniform_indices) exact, every other
    token at the mean key's logit: (kept + 1) d floats). Returns ({name: (8, n) estimates}, {name: floats})."""
    from kvbounds.battery import streaming_llm_indices, uniform_indices
    n, d = K.shape
    mean = qs @ K.mean(0) / math.sqrt(d)
    exact = qs @ K.T / math.sqrt(d)
    tokens = max(floats - d, 0) // d
    out = {"zeros": np.zeros_like(exact), "mean": np.repeat(mean[:, None], n, axis=1)}
    for name, idx in (("streaming_llm", streaming_llm_indices(n, tokens)), ("uniform", uniform_indices(n, tokens, rng)[0])):
        est = out["mean"].copy()
        est[:, idx] = exact[:, idx]
        out[name] = est
    return out, {"zeros": 0, "mean": d, "streaming_llm": (min(tokens, n) + 1) * d, "uniform": (min(tokens, n) + 1) * d}


def stream_trial(claim: str, source: str, params: dict, seed: int):
    """One record per gamma (see the module docstring), the battery's logit estimates (:func:`logit_controls`) at the
    method's floats n r + d r (the keys' coordinates and the basis: 16% of the keys' n d at n = 256, d = 64, r = 8)
    and the ablation (a random basis of rank r, kvbounds.battery.random_basis, at the same gamma); a missing real
    model gives a record that says so."""
    from kvbounds.battery import random_basis
    from kvbounds.battery import stream_floats
    rng = np.random.default_rng(seed)
    try:
        Q, K, V, unit_of_stream = _stream(params, seed, rng)
    except LookupError as e:
        return [missing_record(claim, params, source, e, gamma_choice=str(g)) for g in GAMMAS]
    n, d = K.shape
    qs = Q[rng.choice(len(Q), 8, replace=False)]
    unit = np.linalg.norm(qs, axis=1) * float(np.linalg.norm(K, axis=1).max()) / math.sqrt(d)
    exact = qs @ K.T / math.sqrt(d)                                        # (8, n)
    held = n * POWER_R + d * POWER_R
    ests, floats = logit_controls(qs, K, held, np.random.default_rng(seed + 3))
    U = random_basis(d, POWER_R, np.random.default_rng(seed + 4))
    E = random_basis(V.shape[1], POWER_R, np.random.default_rng(seed + 5))
    worst = lambda lhat: float((np.abs(exact - lhat).max(axis=1) / unit).max())
    recs = []
    for g in GAMMAS:
        att = StaticSubspaceAttention.from_calibration(K[: n // 2], V[: n // 2], r=POWER_R, r_v=POWER_R,
                                                       gamma=g).extend(K, V)
        coin = StaticSubspaceAttention(U, E, gamma=g).extend(K, V)
        controls = {k: worst(v) for k, v in ests.items()}
        controls["ablation"] = worst(to_numpy(coin.logits(qs)))
        recs.append(battery_record(claim, params, source, worst(to_numpy(att.logits(qs))), controls,
                                   method_floats=held, stream_floats=stream_floats(n, d),
                                   controls_floats=dict(floats, ablation=held), gamma=float(att.gamma),
                                   gamma_choice=str(g), unit=unit_of_stream))
    return recs


def setting(r) -> str:
    g = r.extra.get("gamma_choice", "?")
    return f"{r.params['family']} | gamma={'1' if g == '1.0' else g}"

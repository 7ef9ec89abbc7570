"""SG.decode: SubGen's guarantee where it is meant to hold, while a real model generates (SubGen Thm 1, Alg. 1;
ClusterGen Thm 2.4).

SmolLM2 generates greedily with :class:`kvbounds.presses.StreamingSubGenPress` (online centres with per-cluster
reservoirs for the denominator, l2 samples of the values for the numerator, every layer kept at ``target``). At
checkpoints, each layer's output against exact attention over the layer's whole history at the current query, in
SubGen's units ``||z/tau - Attn|| / (||softmax(K q)||_2 ||V||_op)`` (:mod:`proofs_checks.decode_stream`; the softmax
is the model's own, SubGen's logits <q', k> with q' = q / sqrt(d)).

Scale: Thm 1 needs t = Omega(eps^-2 e^{2 delta r} log n) samples per cluster and s = Omega(eps^-2 d) value samples,
so at the press's t and s, eps ~ sqrt(e^{2 delta r} log n / t) + sqrt(d / s) (a shape: constant fitted), delta the
largest distance of a key to its centre, r the query's norm ||q'|| (SubGen Thm 1 and ClusterGen Thm 2.4 assume only
||q_n||_2 <= r; the key norms enter through delta). Records and verdict: :mod:`proofs_checks.decode_verdict`.
"""
from __future__ import annotations

import math

import numpy as np

from .decode_stream import prompt_unit, run_generation, trials  # noqa: F401 - the check's trials
from .decode_verdict import build_records, summarize as _summarize
from .decode_verdict import decode_rows as leaderboard_rows  # noqa: F401 - its leaderboard table

CLAIM = "SG.decode"
SOURCE = "SubGen Thm 1, Alg. 1; ClusterGen Thm 2.4 (streaming, inside generation)"
SCALE = "sqrt(e^{2 delta r} log n / t) + sqrt(d / s)"


def ablation(press, K, V, rng, floats: int):
    """SubGen's ablation at the press's floats and split: its sink and window exact, the rest of the floats split
    between the denominator and the numerator as the press splits its middle (clusters x per-cluster slots against
    value-sample slots), each side filled with uniform draws from the layer's history in place of the clusters'
    samples and the l2 samples (kvbounds.battery.split_uniform)."""
    from kvbounds.battery import split_uniform
    st, d, dv = press.state, K.shape[-1], V.shape[-1]
    exact = min(press.sink + press.window, K.shape[0]) * (d + dv)
    mid = max(floats - exact, 0)
    den = mid * st.m * st.t // (st.m * st.t + st.s)
    return split_uniform(K, V, den, mid - den, rng, sink=press.sink, window=press.window)


def run_trial(params: dict, seed: int, backend: str):
    from kvbounds.presses import StreamingSubGenPress
    rows, press = run_generation(StreamingSubGenPress, params, seed, ablation=ablation)
    st = press.state
    if st is None or not rows:        # too short to compress: one record that says so
        return build_records(CLAIM, SOURCE, params, [], "op", None)
    L = press.n_layers
    radius = st.radius.reshape(L, -1).max(-1).values.numpy()
    scale = 1.0 / math.sqrt(rows[0]["d"]) if rows else 1.0

    def query_norm(h):                # ||q'|| = ||q|| / sqrt(d): the only norm SubGen Thm 1 bounds by r
        return h["qnorm"] * scale

    def log_scale(row, h):
        a = 0.5 * (2 * float(radius[row["layer"]]) * query_norm(h) + math.log(math.log(row["n"])) - math.log(st.t))
        return float(np.logaddexp(a, 0.5 * math.log(row["d"] / st.s)))

    return build_records(CLAIM, SOURCE, params, rows, "op", log_scale, norm=query_norm, unit=prompt_unit(params, seed),
                         norm_free=lambda row: norm_free(row["n"], row["d"], st.t, st.s), clusters=st.m,
                         per_cluster=st.t, samples=st.s, radius=[float(x) for x in radius], reductions=press.reductions)


def norm_free(n: int, d: int, t: int, s: int) -> dict:
    """The part of SG.decode's scale no norm lowers, against the most doing nothing can err in SubGen's units
    (:mod:`kvbounds.verdict._vacuity`). The scale sqrt(e^{2 delta r} log n / t) + sqrt(d / s) has e^{2 delta r} >= 1
    (delta, r >= 0), so it is at least sqrt(log n / t) + sqrt(d / s) on every input; returning zeros errs
    ||Attn|| / (||softmax(K q)||_2 ||V||_op) = ||V^T p|| / (||p||_2 ||V||_op) <= 1 (p the softmax weights), with
    equality for V = u w^T, u parallel to p. So the statement is vacuous at any norm once that sum is >= 1; at the
    quick setting (d = 64, s = 20, t = 1) either term alone is: sqrt(d / s) = 1.79, sqrt(log n / t) >= 1 for n >= 3."""
    terms = {"sqrt(d/s)": math.sqrt(d / s), "sqrt(log n / t)": math.sqrt(math.log(n) / t)}
    return dict(terms=terms, log_scale=math.log(sum(terms.values())), zeros_at_most=1.0,
                where=f"d = {d}, s = {s}, t = {t}, n = {n}")


def summarize(records):
    return _summarize(CLAIM, records, scale_text=SCALE,
                      certificate_kind="an estimate, not a bound: 3 sampling standard errors of the two sums from "
                                       "the press's own samples, (se_num + R_v se_den) / Z_hat")

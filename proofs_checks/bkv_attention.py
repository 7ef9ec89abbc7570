"""BKV.attention: BalanceKV's per-step guarantee (BalanceKV-NeurIPS Thm 3.1, Alg. 1; BalanceKV-preprint Thm 3.1).

Stated: with ||q||, ||k|| <= r, t = O~(sqrt(d) e^{2r^2/sqrt d}/eps) (BalanceKV-NeurIPS; BalanceKV-preprint: O*(e^{2r^2/sqrt d}/eps)) and
T = log(n/t), at every step j with probability >= 1 - 1/poly(n)

    ||z_j - Attn(q_j, K_j, V_j)|| <= eps ||softmax(K_j q_j / sqrt d)||_2 ||V_j||_F.

We stream n tokens and evaluate at checkpoints j; ``eps_hat`` = max_j of the left side divided by
||softmax|| ||V_j||_F. Sub-checks:
  * ``t from formula (C=1)``  t = sqrt(d) e^{2r^2/sqrt d}/eps rounded up to even: does eps_hat <= eps?
                              (the O~ read with constant 1 and no log factors; a reading, not a proven constant)
  * ``BalanceKV-NeurIPS shape``/``BalanceKV-preprint shape``  eps_hat against each version's eps(t) shape; fitted constant, growth in t, d, r.
Values have norms spread over six decades so that several value-norm buckets (and erasures) occur.

Under the shared rules (kvbounds.verdict): the formula records are a *reading* of the O~ (constant 1, no log
factors), never a counterexample; the statement is ``holds-fitted`` with the BalanceKV-NeurIPS fitted constant. When the
formula's t is so small that SoftmaxBalance empties one-token cells, z_j is undefined (measured = inf): a finding
about small t, kept in the verdict.
"""
from __future__ import annotations

import math

import numpy as np

from kvbounds.algorithms.attention import attention_weights, exact_attention
from kvbounds.algorithms.balance_kv import BalanceKV, DegenerateEstimate
from kvbounds.algorithms.arrays import asarray, to_numpy
from kvbounds.verdict import (FigureSpec, Finding, Verdict, decide, decide_rate, fitted_constant, growth, mark,
                              spread_words)

from kvbounds.battery import walk_probe
from kvbounds.battery import method_floats, stream_floats
from kvbounds.battery import power_on_both_metrics

from .common import dispatch, make_record, pick, unit_directions
from .mr_error import checkpoints
from kvbounds.streams import POWER_CHECK, StreamBattery, battery_record, held_out_errors, missing_record, power_trials
from kvbounds.streams import stream as power_stream
from . import walk_cause

__all__ = ["CLAIM", "SOURCE", "FORMULA", "READING", "formula_t", "trials", "spread_values", "statement_trial",
           "summarize", "POWER_T", "power_trial", "power_summary", "power_trial_with_walk_cause"]

CLAIM = "BKV.attention"
SOURCE = "BalanceKV-NeurIPS Thm 3.1, Alg. 1"
FORMULA = "t from formula (C=1)"
READING = "O~ of Thm 3.1 read with constant 1 and without its polylog factors"


def formula_t(d: int, r: float, eps: float) -> int:
    t = math.sqrt(d) * math.exp(2 * r**2 / math.sqrt(d)) / eps
    return max(2, 2 * math.ceil(t / 2))


def trials(profile: str) -> list[dict]:
    n = pick(profile, smoke=256, quick=2048, full=8192)
    base = dict(n=n, d=8, r=1.0, eps=0.5, delta=0.01, values="spread")
    if profile == "smoke":
        return [dict(base, t=16, sweep="t"), dict(base, t=formula_t(8, 1.0, 0.5), eps=0.5, sweep="formula")] + \
            power_trials(profile, dict(base, n=128, t=POWER_T, values="gaussian"))
    out = [dict(base, t=t, sweep="t") for t in (16, 32, 64, 128)]
    out += [dict(base, d=d, t=32, sweep="d") for d in (4, 8, 16, 32)]
    out += [dict(base, r=r, t=32, sweep="r") for r in (0.5, 1.0, 1.5, 2.0)]
    out += [dict(base, eps=e, t=formula_t(8, 1.0, e), sweep="formula") for e in (1.0, 0.5, 0.25)]
    return out + power_trials(profile, dict(base, n=pick(profile, smoke=128, quick=256, full=512), t=POWER_T,
                                            values="gaussian"))


def spread_values(rng, n, s):
    dirs = unit_directions(rng, n, s)
    return dirs * (10.0 ** rng.uniform(-6, 0, n))[:, None]


def statement_trial(params: dict, seed: int, backend: str):
    n, d, r, t, eps, delta = (params[k] for k in ("n", "d", "r", "t", "eps", "delta"))
    rng = np.random.default_rng(seed)
    Q, K = unit_directions(rng, n, d) * r, unit_directions(rng, n, d) * r
    V = spread_values(rng, n, d) if params["values"] == "spread" else rng.standard_normal((n, d)) / math.sqrt(d)
    T = max(int(math.log2(n / t)), 0)
    bkv = BalanceKV(d, batch_size=t, levels=T, eps=eps, r=r * (1 + 1e-9), delta=delta, seed=seed + 1, n=n)
    Kb, Vb, Qb = asarray(K, backend), asarray(V, backend), asarray(Q, backend)
    cps = set(checkpoints(n, t, np.random.default_rng(seed + 2)))
    worst, worst_j, degenerate, zeros = 0.0, 0, None, 0.0
    for j in range(1, n + 1):
        bkv.update(Kb[j - 1], Vb[j - 1])
        if j not in cps:
            continue
        exact = exact_attention(Q[j - 1], K[:j], V[:j])
        scale = np.linalg.norm(attention_weights(Q[j - 1], K[:j])) * np.linalg.norm(V[:j])
        zeros = max(zeros, float(np.linalg.norm(exact) / scale))
        try:
            z = to_numpy(bkv.query(Qb[j - 1]))
        except DegenerateEstimate as e:
            degenerate = degenerate or str(e)
            worst, worst_j = math.inf, (worst_j if worst == math.inf else j)
            continue
        e = float(np.linalg.norm(z - exact) / scale)
        if e >= worst:
            worst, worst_j = e, j
    # zeros' error in the theorem's units (doing nothing; at most 1): the bar a vacuous bound meets (verdict.decide_vacuity)
    common = dict(worst_j=worst_j, T=T, stored=bkv.num_stored(), buckets=bkv.num_buckets(), degenerate=degenerate,
                  controls_eps=dict(zeros=zeros))
    if params["sweep"] == "formula":
        return [make_record(CLAIM, params, measured=worst, bound=eps, check=FORMULA,
                            source=SOURCE + " (O~ read with constant 1)", reading=READING, **common)]
    e2 = math.exp(2 * r**2 / math.sqrt(d))
    return [make_record(CLAIM, params, measured=worst, bound=math.sqrt(d) * e2 / t, holds=True, bound_kind="shape",
                        check="BalanceKV-NeurIPS shape", source=SOURCE, **common),
            make_record(CLAIM, params, measured=worst, bound=e2 / t, holds=True, bound_kind="shape",
                        check="BalanceKV-preprint shape", source="BalanceKV-preprint Thm 3.1", **common)]


def summarize(records) -> Verdict:
    figs = [FigureSpec("eps_hat vs t (bound: each version's eps(t) shape)", x="t", hue="check", y="ratio"),
            FigureSpec("eps_hat vs eps with t from the formula", x="eps", check=FORMULA)]
    n_all = len(records)
    causes = walk_cause.per_setting(records, lambda r: r.params["family"])
    trivial, records = power_summary(records)
    records = mark(records, lambda r: r.check == FORMULA and "reading" not in r.extra, reading=READING)
    parts, findings = [], []
    gs = {}
    for check in ("BalanceKV-NeurIPS shape", "BalanceKV-preprint shape"):
        rs = [r for r in records if r.check == check]
        if rs:
            c = fitted_constant(rs)
            parts.append(f"[{check}] fitted constant C = {c.value:.3g} ({spread_words(c)})")
        # an undefined estimate (the denominator vanished: ratio inf, the small-t finding below) has no place on a
        # log-log line: the growth is fitted on the defined ones, and the summary says how many were left out
        defined = [r for r in rs if math.isfinite(r.ratio)]
        if len(defined) < len(rs):
            parts.append(f"[{check}] {len(rs) - len(defined)} undefined estimate(s) left out of the growth fits "
                         f"(t = {', '.join(sorted({str(r.params['t']) for r in rs if not math.isfinite(r.ratio)}))})")
        for key in ("t", "d", "r"):
            for g in growth(defined, key, swept_only=True):
                gs[(check, key)] = g
                parts.append(g.text())
                if g.grows and key != "t":
                    findings.append(Finding(CLAIM, f"[{check}] fitted constant grows with {key} in the tested range",
                                            g.text(), g.smallest, kind="rate"))
    form = [r for r in records if r.check == FORMULA]
    ok = [r for r in form if r.holds]
    if form:
        parts.append(f"t from the formula with constant 1: eps_hat <= eps in {len(ok)}/{len(form)} trials (t = "
                     f"{', '.join(str(r.params['t']) for r in sorted(form, key=lambda r: r.params['t']))}; a reading of "
                     f"the O~, not a counterexample)")
    degen = [r for r in records if r.extra.get("degenerate")]
    if degen:
        r = min(degen, key=lambda r: (r.params["t"], r.extra["worst_j"]))
        findings.append(Finding(
            CLAIM, f"small t: z_j undefined (the denominator estimate vanishes) for t <= "
                   f"{max(x.params['t'] for x in degen)}",
            f"{len(degen)} trial(s); first at t = {r.params['t']}, step j = {r.extra['worst_j']}: {r.extra['degenerate']}. "
            f"Alg. 2 lines 12-16 return the smaller sign class, so |C'| < |C|/2 whenever the classes differ and a "
            f"one-token cell reduces to nothing, while Alg. 4 weights level i by exactly 2^i: mass drains from the "
            f"top levels and can vanish entirely. The theorem's t = O~(.) hides a constant and log factors, so this "
            f"is a property of small t, not a counterexample.",
            r.params, kind="finding"))
    g = gs.get(("BalanceKV-NeurIPS shape", "t"))
    rate = decide_rate(g, stated_exponent=-1.0) if g else ("n/a", None)
    fitted = fitted_constant([r for r in records if r.check == "BalanceKV-NeurIPS shape"],
                             "max eps_hat / (sqrt(d) e^{2r^2/sqrt d}/t) (BalanceKV-NeurIPS's t solved for eps; polylog factors in C)")
    parts.append(trivial.detail)
    if causes:
        parts.append("what the walk has to balance (Alg. 1's walks on the power streams, per family): "
                     + walk_cause.settings_text(causes))
        findings += filter(None, [walk_cause.cause_finding(CLAIM, causes, what="Alg. 1's MergeAndReduce walks "
                                                           "(numerator and denominator, every level) on the power "
                                                           "streams, per family")])
    v = decide(CLAIM, records, summary="; ".join(parts), figures=figs, findings=findings, rate=rate, fitted=fitted,
               trivial=trivial)
    v.n_records = n_all
    return v


# ------------------------------------------------------------------ power against the battery of controls
# t = 16, T = log2(n/t) = 4 at n = 256: BalanceKV holds 13-27% of the stream's floats on every family (t = 32 held
# 30-60%). Gaussian values on every family: the statement sweep's spread values fill ~20 value-norm buckets, each its
# own MergeAndReduce, so BalanceKV would hold 40-50% of the stream at t = 16 (and at t = 8 its estimate is undefined
# on some streams)
POWER_T = 16


def power_trial(params: dict, seed: int, backend: str):
    """eps_hat of BalanceKV (Alg. 1 at the theorem's walk constant) and of each control of the battery
    (kvbounds.battery: zeros, the mean, StreamingLLM, uniform) on one stream of a family, at the same checkpoints
    and in the theorem's units ||z - Attn|| / (||softmax|| ||V_j||_F); every control holds the floats BalanceKV
    holds at that step (kvbounds.battery.method_floats: keys, values, one weight per cell, its unreduced batches).
    The ablation: BalanceKV with fair coins for the walk (signs="random", the same seed: the walk's own uniforms)."""
    n, t, eps, delta = (params[k] for k in ("n", "t", "eps", "delta"))
    try:
        ps = power_stream(params, seed, scale_of_d=lambda d: 1 / math.sqrt(d))
    except LookupError as e:
        return [missing_record(CLAIM, params, SOURCE, e)]
    Q, K, V, r = ps.Q, ps.K, ps.V, ps.r
    d = K.shape[1]
    T = max(int(math.log2(n / t)), 0)
    make = lambda signs: BalanceKV(d, batch_size=t, levels=T, eps=eps, r=r * (1 + 1e-9), delta=delta,
                                   seed=seed + 1, n=n, signs=signs)
    bkv, coin = make("walk"), make("random")
    Kb, Vb, Qb = asarray(K, backend), asarray(V, backend), asarray(Q, backend)
    cps = set(checkpoints(n, t, np.random.default_rng(seed + 2)))
    bat = StreamBattery(np.random.default_rng(seed + 3))
    worst, degenerate = 0.0, None
    for j in range(1, n + 1):
        bkv.update(Kb[j - 1], Vb[j - 1])
        coin.update(Kb[j - 1], Vb[j - 1])
        if j not in cps:
            continue
        exact = exact_attention(Q[j - 1], K[:j], V[:j])
        scale = np.linalg.norm(attention_weights(Q[j - 1], K[:j])) * np.linalg.norm(V[:j])
        bat.attention(Q[j - 1], K[:j], V[:j], method_floats(bkv), 1 / math.sqrt(d), exact, scale)
        for est, name in ((bkv, "method"), (coin, "ablation")):
            try:
                e = float(np.linalg.norm(to_numpy(est.query(Qb[j - 1])) - exact) / scale)
            except DegenerateEstimate as err:
                e = math.inf
                if name == "method":
                    degenerate = degenerate or str(err)
            if name == "method":
                worst = max(worst, e)
            else:
                bat.add("ablation", e)
    held = method_floats(bkv)
    practitioner = held_out_errors("attention", lambda qs: _answers(bkv, qs, backend), K, V, ps.later, held,
                                   np.random.default_rng(seed + 4), scale=1 / math.sqrt(d),
                                   ablation_estimate=lambda qs: _answers(coin, qs, backend))
    return [battery_record(CLAIM, params, SOURCE, worst, bat.values(), method_floats=held,
                           stream_floats=stream_floats(n, d, V.shape[1]),
                           controls_floats=dict(bat.floats, ablation=method_floats(coin)), stream=ps.note,
                           stored=bkv.num_stored(), r_stream=r, degenerate=degenerate, unit=ps.unit,
                           practitioner=practitioner)]


def _answers(est, qs, backend) -> np.ndarray:
    """The estimator's attention output for each query of ``qs`` (m, d); inf where its estimate is undefined."""
    out = []
    for q in qs:
        try:
            out.append(np.asarray(to_numpy(est.query(asarray(np.ascontiguousarray(q), backend))), np.float64))
        except DegenerateEstimate:
            out.append(None)
    dv = next((len(o) for o in out if o is not None), 1)
    return np.stack([o if o is not None else np.full(dv, math.inf) for o in out])


def power_summary(records):
    """(TrivialPower, the records without the power sweep's) for :func:`summarize`."""
    pw = [r for r in records if r.check == POWER_CHECK]
    return power_on_both_metrics(pw, setting=lambda r: r.params["family"], metric="eps_hat"), \
        [r for r in records if r.check != POWER_CHECK]


def power_trial_with_walk_cause(params: dict, seed: int, backend: str):
    """:func:`power_trial` with every walk of its MergeAndReduce recorded and measured
    (:mod:`kvbounds.battery.walk_probe`):
    each record's ``extra["walk_cause"]`` (raw and with the block's keys centred; :mod:`.walk_cause`). The walks run
    exactly as without the probe (its signs are replayed from the recorded uniforms: ``replayed``)."""
    with walk_probe.record_merge_and_reduce() as calls:
        recs = power_trial(params, seed, backend)
    if calls:
        cause = walk_probe.summary(walk_probe.merge_and_reduce_diagnostics(calls))
        for r in recs:
            r.extra["walk_cause"] = cause
    return recs


run_trial = dispatch("sweep", {"power": power_trial_with_walk_cause}, default=statement_trial)

"""SUB.logit-error: ||l - l^||_inf <= (gamma_B/sqrt d) ||Delta K||_op ||q|| for l^_i = gamma_B q^T P_B k_i / sqrt d (Subspace-FD-draft Sec. 8).

For each gamma_B choice (the draft's default sqrt(r/d), 1, and a scalar calibrated on held-out data) and each
setting, with the worst query of the trial (largest measured/bound):
  * ``draft <gamma> <mode>``      the draft's bound, multi-chunk form max_j ||K_j (I - P_Bj)||_op [stated],
  * ``corrected <gamma> <mode>``  (||q||/sqrt d) max_j max_{i in j} ||(I - gamma P_Bj) k_i|| [proven, tight: the
                                  adversarial queries q along the worst (I - gamma P) k_i attain it].
Modes: ``single`` (static basis from the calibration half of the trace, Sec. 4/10) and ``multi`` (the adaptive
variant of Sec. 5 on RoPE traces: residual-triggered chunks, FD-sketched bases). ``minimal``: d = 2, r = 1,
K = [e1; -e1] inside the subspace (Delta K = 0), the smallest input on which the stated bound can fail.
A floating tolerance 1e-10 ||q|| max||k|| / sqrt d is added to every bound (Delta K = 0 in exact arithmetic
is ~1e-16 in float64).
"""
from __future__ import annotations

import math

import numpy as np

from kvbounds.algorithms.attention import exact_attention
from kvbounds.algorithms.subspace_attention import (GAMMA_CHOICES, AdaptiveSubspaceAttention, StaticSubspaceAttention,
                                           calibrate_gamma, resolve_gamma, top_basis)
from kvbounds.algorithms.arrays import asarray, to_numpy
from kvbounds.verdict import FigureSpec, Finding, Verdict, canonical_order, standard_verdict
from kvbounds.theory.subspace import logit_error_bound, output_error_bound, \
    output_error_bound_corrected, output_error_bound_multichunk, softmax_sensitivity_bound
from kvbounds.traces.rope import rope_trace
from kvbounds.traces.synthetic import make_trace

from kvbounds.battery import power_on_both_metrics

from .common import make_record, pick
from kvbounds.streams import POWER_CHECK
from .sub_logit_power import power_trial, power_trials, setting as power_setting

CLAIM = "SUB.logit-error"
SOURCE = "Subspace-FD-draft Sec. 8 (logit error)"
TOL = 1e-10


def settings(profile: str) -> list[dict]:
    """The shared parameter grid of SUB.logit-error and SUB.output-error."""
    out = [dict(mode="minimal", kind="minimal", n=2, d=2, r=1, r_v=1)]
    single_kinds = pick(profile, smoke=("low_rank", "exact_subspace"), quick=("low_rank", "exact_subspace", "gaussian", "rope"),
                        full=("low_rank", "exact_subspace", "gaussian", "rope"))
    rs = pick(profile, smoke=[4], quick=[4, 16], full=[4, 8, 16, 32])
    n = pick(profile, smoke=128, quick=512, full=2048)
    out += [dict(mode="single", kind=k, n=n, d=64, r=r, r_v=r) for k in single_kinds for r in rs]
    # (freq_bias, tau / median norm, L, theta): RoPE keys tilted to slow pairs or not; residual- or length-triggered
    multi = pick(profile, smoke=[(8.0, 0.25, 64, 1e4)],
                 quick=[(8.0, 0.25, 128, 1e4), (8.0, 0.5, 128, 1e4), (8.0, 0.25, 128, 1e5), (0.0, 0.25, 128, 1e4),
                        (0.0, math.inf, 128, 1e4)],
                 full=[(8.0, 0.25, 128, 1e4), (8.0, 0.5, 128, 1e4), (4.0, 0.25, 128, 1e4), (8.0, 0.25, 128, 1e5),
                       (0.0, 0.25, 128, 1e4), (0.0, 0.25, 128, 1e5), (0.0, math.inf, 128, 1e4), (8.0, 0.25, 512, 1e4)])
    nm = pick(profile, smoke=256, quick=1024, full=4096)
    out += [dict(mode="multi", kind="rope", n=nm, d=64, r=8, r_v=8, freq_bias=fb, tau=tau, L=L, theta=th)
            for fb, tau, L, th in multi]
    return out


def trials(profile: str) -> list[dict]:
    return settings(profile) + power_trials(profile)


def _minimal():
    K = np.array([[1.0, 0.0], [-1.0, 0.0]])
    V = np.array([[1.0, 0.0], [0.0, 0.0]])
    Q = np.array([[2.0, 0.0]])
    return K, V, Q, K, V, Q, Q, K


def _data(params: dict, seed: int):
    """(K_cal, V_cal, Q_cal, K, V, Q, Q_gam, K_gam): three thirds of one trace: the calibration part (bases), the
    test part, and a held-out part for the calibrated gamma. (On the basis's own calibration keys the
    least-squares gamma is exactly 1, since P K^T K (I - P) = 0 for an SVD basis.)"""
    kind, n, d = params["kind"], params["n"], params["d"]
    if kind == "minimal":
        return _minimal()
    if kind == "rope":
        tr = rope_trace(3 * n, d, rank=4, value_rank=8, theta=params.get("theta", 1e4),
                        freq_bias=params.get("freq_bias", 8.0), seed=seed)
    elif kind == "gaussian":
        tr = make_trace("gaussian", n=3 * n, d=d, seed=seed)
    else:
        tr = make_trace("low_rank", n=3 * n, d=d, seed=seed, rank=4, noise=0.0 if kind == "exact_subspace" else 0.05)
    K, V, Q = tr.K, tr.V, tr.Q
    return K[:n], V[:n], Q[:n], K[n:2 * n], V[n:2 * n], Q[n:2 * n], Q[2 * n:], K[2 * n:]


def _queries(Q: np.ndarray, rng, m: int = 16) -> np.ndarray:
    idx = rng.choice(Q.shape[0], size=min(m, Q.shape[0]), replace=False)
    return Q[np.sort(idx)]


def _model(params, Kc, Vc, Qg, Kg, K, V, backend):
    d, r, r_v = params["d"], params["r"], params["r_v"]
    B = top_basis(asarray(Kc, backend), r)
    cal = calibrate_gamma(asarray(Qg, backend), asarray(Kg, backend), B)
    if params["mode"] == "minimal":
        e1 = asarray(np.array([[1.0, 0.0]]), backend)
        return StaticSubspaceAttention(e1, e1, gamma=1.0).extend(asarray(K, backend), asarray(V, backend)), 1.0
    if params["mode"] == "single":
        E = top_basis(asarray(Vc, backend), r_v)
        return StaticSubspaceAttention(B, E, gamma=1.0).extend(asarray(K, backend), asarray(V, backend)), cal
    nk, nv = float(np.median(np.linalg.norm(Kc, axis=1))), float(np.median(np.linalg.norm(Vc, axis=1)))
    tau = params["tau"]
    model = AdaptiveSubspaceAttention(d, r, r_v, ell_k=2 * r, ell_v=2 * r_v, tau_k=tau * nk, tau_v=tau * nv,
                                      L=params["L"], gamma=1.0)
    return model.extend(asarray(K, backend), asarray(V, backend)), cal


def evaluate(params: dict, seed: int, backend: str) -> dict:
    """Everything both checks need: per gamma choice, per query, the measured and bounded quantities."""
    Kc, Vc, Qc, K, V, Q, Qg, Kg = _data(params, seed)
    d = params["d"]
    model, cal = _model(params, Kc, Vc, Qg, Kg, K, V, backend)
    chunks = [(int(c.start), int(c.stop), to_numpy(c.B), to_numpy(c.E)) for c in model.chunks]
    # per chunk: Delta K_j, Delta V_j operator norms; per token: ||Delta k_i||, ||Delta v_i||, ||P k_i||
    dK_ops, dV_ops, KP_ops = [], [], []
    for s, e, B, E in chunks:
        Kj, Vj = K[s:e], V[s:e]
        dK_ops.append(float(np.linalg.norm(Kj - Kj @ B.T @ B, 2)))
        dV_ops.append(float(np.linalg.norm(Vj - Vj @ E.T @ E, 2)))
        KP_ops.append(float(np.linalg.norm(Kj @ B.T @ B, 2)))
    dv_max = max(float(np.linalg.norm(V[s:e] - V[s:e] @ E.T @ E, axis=1).max()) for s, e, B, E in chunks)
    vmax = float(np.linalg.norm(V, axis=1).max())
    kmax = float(np.linalg.norm(K, axis=1).max())
    rng = np.random.default_rng(seed + 3)
    Qt = _queries(Q, rng) if params["mode"] != "minimal" else Q
    mem = model.memory_floats() if hasattr(model, "memory_floats") else dict(bases=(params["r"] + params["r_v"]) * d,
                                                                             coefficients=K.shape[0] * (params["r"] + params["r_v"]))
    out = dict(J=len(chunks), memory_vs_full_cache=(mem["bases"] + mem["coefficients"]) / (2 * K.shape[0] * d),
               dK_op=max(dK_ops), dV_op=max(dV_ops), KP_op=max(KP_ops), dv_max=dv_max, vmax=vmax,
               gamma_calibrated=cal, per_gamma={})
    qn_typ = float(np.median(np.linalg.norm(Qt, axis=1)))
    for g in GAMMA_CHOICES:
        gamma = resolve_gamma(g, params["r"], d, cal)
        model.gamma = gamma
        # the worst direction for the corrected bound: q along max_i ||(I - gamma P_j) k_i||, scaled to a typical ||q||
        worst_rows = []
        for s, e, B, E in chunks:
            R = K[s:e] - gamma * (K[s:e] @ B.T @ B)
            i = int(np.argmax(np.linalg.norm(R, axis=1)))
            worst_rows.append((float(np.linalg.norm(R[i])), R[i], s, e, B))
        wn, wr, *_ = max(worst_rows, key=lambda x: x[0])
        adv = wr / (np.linalg.norm(wr) or 1.0) * qn_typ
        Qall = np.vstack([Qt, adv[None, :]]) if params["mode"] != "minimal" else Qt
        lhat = to_numpy(model.logits(asarray(Qall, backend)))
        l = Qall @ K.T / math.sqrt(d)
        o = exact_attention(Qall, K, V)
        ohat = to_numpy(model.attend(asarray(Qall, backend)))
        rows = []
        for a, q in enumerate(Qall):
            qn = float(np.linalg.norm(q))
            linf = float(np.abs(l[a] - lhat[a]).max())
            tol = TOL * qn * kmax / math.sqrt(d)
            corr = qn / math.sqrt(d) * wn
            rows.append(dict(query=a, adversarial=params["mode"] != "minimal" and a == len(Qall) - 1, q_norm=qn,
                             linf=linf, tol=tol,
                             draft=logit_error_bound(qn, max(dK_ops), d, gamma),
                             corrected=corr,
                             out_err=float(np.linalg.norm(o[a] - ohat[a])),
                             out_draft_measured=output_error_bound(linf, vmax, max(dV_ops)),
                             out_draft_chained=output_error_bound_multichunk(qn, d, gamma, dK_ops, vmax, dV_ops),
                             out_corrected=output_error_bound_corrected(corr, vmax, dv_max),
                             out_tol=TOL * max(vmax, 1.0) * (1 + softmax_sensitivity_bound(linf))))
        out["per_gamma"][g] = dict(gamma=gamma, rows=rows)
    return out


def worst(rows, key, tol_key="tol", measured="linf"):
    """The row with the largest measured / (bound + tol)."""
    return max(rows, key=lambda x: x[measured] / (x[key] + x[tol_key]) if x[key] + x[tol_key] > 0 else math.inf)


def run_trial(params: dict, seed: int, backend: str):
    if params["mode"] == "power":
        return power_trial(CLAIM, SOURCE, params, seed)
    ev = evaluate(params, seed, backend)
    recs = []
    for g, res in ev["per_gamma"].items():
        mode = params["mode"]
        common = dict(gamma=res["gamma"], gamma_choice=g, J=ev["J"], dK_op=ev["dK_op"], KP_op=ev["KP_op"],
                      gamma_calibrated=ev["gamma_calibrated"])
        w = worst(res["rows"], "draft")
        recs.append(make_record(CLAIM, params, measured=w["linf"], bound=w["draft"] + w["tol"],
                                check=f"draft {g} {mode}", source=SOURCE + " [stated]", q_norm=w["q_norm"],
                                adversarial=w["adversarial"], **common))
        w = worst(res["rows"], "corrected")
        adv = [x for x in res["rows"] if x["adversarial"]]
        recs.append(make_record(CLAIM, params, measured=w["linf"], bound=w["corrected"] + w["tol"],
                                check=f"corrected {g} {mode}", source="theory/subspace.py (corrected, tight)",
                                q_norm=w["q_norm"], adversarial_ratio=(adv[0]["linf"] / adv[0]["corrected"]
                                                                       if adv and adv[0]["corrected"] > 0 else None),
                                **common))
        if adv and adv[0]["corrected"] > 1e3 * adv[0]["tol"]:
            # control: the corrected bound with half its constant must fail on the query that attains it
            a = adv[0]
            recs.append(make_record(CLAIM, params, measured=a["linf"], bound=a["corrected"] / 2 + a["tol"],
                                    check="control corrected/2", control=True,
                                    source="the corrected bound with half the constant (control)", **common))
    return recs


CORRECTED = ("||l - l^||_inf <= (||q||/sqrt d) max_j max_(i in chunk j) ||(I - gamma P_Bj) k_i|| <= (||q||/sqrt d) "
             "(max_j ||K_j (I - P_Bj)||_op + |1 - gamma| max_j ||K_j P_Bj||_op) (proven in theory/subspace.py; attained "
             "by q along the worst (I - gamma P) k_i); the draft's bound is this with gamma = 1, and holds only there")


def summarize(records) -> Verdict:
    """Every gamma choice is part of the statement (the draft's default sqrt(r/d) included), so a failing
    draft record at any gamma is a counterexample; the corrected bound and its halved control give power."""
    records = canonical_order(records)
    n_all = len(records)
    # the theorem's metric only: a logit error has no held-out attention output (the calls name their metric)
    trivial = power_on_both_metrics([r for r in records if r.check == POWER_CHECK], setting=power_setting,
                                    metric="||l - l^||_inf / (||q|| max||k|| / sqrt d)")
    records = [r for r in records if r.check != POWER_CHECK]
    figs = [FigureSpec("||l - l^||_inf / stated bound, default gamma = sqrt(r/d), static basis", x="r",
                       check="draft sqrt(r/d) single", hue="kind", y="ratio"),
            FigureSpec("||l - l^||_inf / stated bound, gamma = 1, static basis", x="r", check="draft 1 single", hue="kind",
                       y="ratio")]
    parts, findings = [], []
    main = [r for r in records if not r.control]
    for g in GAMMA_CHOICES:
        for kind in ("draft", "corrected"):
            rs = [r for r in main if r.extra.get("gamma_choice") == g and r.check.startswith(kind)]
            if rs:
                nbad = sum(not r.holds for r in rs)
                parts.append(f"{kind} gamma={g}: {len(rs) - nbad}/{len(rs)} hold, max ratio {max(r.ratio for r in rs):.3g}")
    adv = [r.extra["adversarial_ratio"] for r in records if r.extra.get("adversarial_ratio")]
    if adv:
        parts.append(f"corrected bound attained by the adversarial query: ratio up to {max(adv):.6f}")
    cal = [r.extra["gamma_calibrated"] for r in records if r.extra.get("gamma_choice") == "calibrated"]
    if cal:
        parts.append(f"calibrated gamma in [{min(cal):.4f}, {max(cal):.4f}]")
    for g in GAMMA_CHOICES:
        bad = [r for r in main if r.check.startswith(f"draft {g}") and not r.holds]
        if not bad:
            continue
        w = min(bad, key=lambda r: (r.params["n"], r.params["d"], -r.ratio))
        findings.append(Finding(
            CLAIM, f"the stated logit bound fails for gamma_B = {g}",
            f"{len(bad)}/{sum(r.check.startswith(f'draft {g}') for r in main)} trials. Smallest: {w.params} "
            f"(gamma = {w.extra['gamma']:.4g}, ||Delta K||_op = {w.extra['dK_op']:.3g}): ||l - l^||_inf = {w.measured:.4g} > "
            f"(gamma/sqrt d) ||Delta K|| ||q|| = {w.bound:.4g}. l - l^ = [q^T (I-P) k + (1 - gamma) q^T P k]/sqrt d: the "
            f"(1 - gamma) term is not bounded by Delta K (keys inside the subspace still give error (1-gamma)|l_i|). "
            f"Only gamma = 1 makes the statement true; the correct bound: {CORRECTED}.", w.params))
    cal_recs = [r for r in main if r.extra.get("gamma_choice") == "calibrated" and r.params["mode"] != "minimal"]
    if cal_recs:
        defaults = sorted({round(math.sqrt(r.params["r"] / r.params["d"]), 4) for r in cal_recs})
        w = min(cal_recs, key=lambda r: (abs(r.extra["gamma_calibrated"] - 1.0), r.check))
        findings.append(Finding(
            CLAIM, "gamma_B: the draft's default sqrt(r/d) disagrees with the data-calibrated scalar",
            f"The review proposes gamma_B ~ sqrt(trace(P_B)/d) 'or a data-calibrated scalar'; the draft adopts sqrt(r/d) "
            f"(here {defaults}). The least-squares scalar on held-out logits is in [{min(r.extra['gamma_calibrated'] for r in cal_recs):.4f}, "
            f"{max(r.extra['gamma_calibrated'] for r in cal_recs):.4f}] (near 1 whenever the keys are close to the subspace), and "
            f"on the basis's own calibration keys it is exactly 1 (P K^T K (I - P) = 0 for an SVD basis). sqrt(r/d) also "
            f"shrinks the logits the wrong way for an isotropy argument (that would give sqrt(d/r)).",
            w.params, kind="versions disagree"))
    parts.append(trivial.detail)
    v = standard_verdict(CLAIM, records, figures=figs, findings=findings, corrected=CORRECTED, trivial=trivial)
    if findings:   # the specific findings above name each failing reading; drop the generic one
        v.findings = [f for f in v.findings if f in findings]
    v.summary = "; ".join([v.summary] + parts)
    v.n_records = n_all
    return v

"""SUB.output-error: ||o - o^|| <= 2 tanh(||l - l^||_inf/2) max||v_i|| + ||Delta V||_op, and the multi-chunk version
(004 Sec. 8). Same settings as SUB.logit-error (:func:`kvbounds.proofs_checks.sub_logit_error.settings`): the static basis
(``single``), the adaptive chunked variant on RoPE traces (``multi``), and the minimal input (d = 2, n = 2).

For each gamma_B choice, with the worst query of the trial (largest measured/bound):
  * ``measured-linf <gamma> <mode>``  the stated inequality with the measured ||l - l^||_inf [proven for every gamma],
  * ``chained <gamma> <mode>``        the draft's multi-chunk form, which substitutes the logit bound:
                                      2 tanh((gamma ||q||/(2 sqrt d)) max_j ||K_j(I-P_Bj)||) max||v|| + max_j ||V_j(I-P_Ej)||
                                      [stated; inherits SUB.logit-error's gamma problem],
  * ``corrected <gamma> <mode>``      2 tanh(L/2) max||v_i|| + max_i ||(I - P_E) v_i|| with L the corrected logit bound
                                      [proven].
"""
from __future__ import annotations


from kvbounds.gpu.backend import single_blas_thread
from kvbounds.verdict import FAILS, FigureSpec, Finding, Verdict, standard_verdict
from kvbounds.algorithms.subspace_attention import GAMMA_CHOICES

from .common import make_record
from .sub_logit_error import evaluate, settings, worst

CLAIM = "SUB.output-error"
SOURCE = "004 Sec. 8 (output error)"


def trials(profile: str) -> list[dict]:
    return settings(profile)


@single_blas_thread()
def run_trial(params: dict, seed: int, backend: str):
    ev = evaluate(params, seed, backend)
    recs, mode = [], params["mode"]
    for g, res in ev["per_gamma"].items():
        common = dict(gamma=res["gamma"], gamma_choice=g, J=ev["J"], dV_op=ev["dV_op"], dK_op=ev["dK_op"],
                      vmax=ev["vmax"], memory_vs_full_cache=ev["memory_vs_full_cache"])
        for check, key, src in (("measured-linf", "out_draft_measured", SOURCE + " [stated, with the measured logit error]"),
                                ("chained", "out_draft_chained", SOURCE + " multi-chunk form [stated]"),
                                ("corrected", "out_corrected", "theory/subspace.py (corrected logit bound)")):
            w = worst(res["rows"], key, tol_key="out_tol", measured="out_err")
            recs.append(make_record(CLAIM, params, measured=w["out_err"], bound=w[key] + w["out_tol"],
                                    check=f"{check} {g} {mode}", source=src, linf=w["linf"], q_norm=w["q_norm"],
                                    **common))
    return recs


def summarize(records) -> Verdict:
    figs = [FigureSpec("||o - o^|| / stated bound (measured logit error), gamma = sqrt(r/d), static basis", x="r",
                       check="measured-linf sqrt(r/d) single", hue="kind", y="ratio"),
            FigureSpec("||o - o^|| / chained bound, gamma = sqrt(r/d), static basis", x="r",
                       check="chained sqrt(r/d) single", hue="kind", y="ratio")]
    v = standard_verdict(CLAIM, records, figures=figs)
    v.findings = []
    parts = [v.summary]
    for g in GAMMA_CHOICES:
        for kind in ("measured-linf", "chained", "corrected"):
            rs = [r for r in records if r.check.startswith(f"{kind} {g}")]
            if rs:
                nbad = sum(not r.holds for r in rs)
                parts.append(f"{kind} gamma={g}: {len(rs) - nbad}/{len(rs)} hold, max ratio {max(r.ratio for r in rs):.3g}")
    multi = {}
    for r in records:
        if r.params["mode"] == "multi" and r.check.startswith("measured-linf 1"):
            p = r.params
            key = (float(p["freq_bias"]), float(p["tau"]), float(p["theta"]))     # inf is stored as "inf"
            multi[key] = (r.extra["J"], p["n"], r.extra["memory_vs_full_cache"], r.measured)
    if multi:
        parts.append("adaptive chunking on RoPE traces (freq_bias, tau, theta): " + ", ".join(
            f"({fb:g}, {tau:g}, {th:g}): J = {J}/{n} tokens, memory {mem:.2f}x the full KV cache"
            for (fb, tau, th), (J, n, mem, _) in sorted(multi.items())))
    for g in GAMMA_CHOICES:
        for kind in ("measured-linf", "chained", "corrected"):
            bad = [r for r in records if r.check.startswith(f"{kind} {g}") and not r.holds]
            if not bad:
                continue
            w = min(bad, key=lambda r: (r.params["n"], r.params["d"], -r.ratio))
            why = ("it plugs in the logit bound (gamma/sqrt d)||Delta K|| ||q||, which misses the (1 - gamma) q^T P k "
                   "part of l - l^ (SUB.logit-error); with gamma = 1 it holds" if kind == "chained" else "unexpected")
            v.findings.append(Finding(
                CLAIM, f"the {kind} output bound fails for gamma_B = {g}",
                f"{len(bad)}/{sum(r.check.startswith(f'{kind} {g}') for r in records)} trials. Smallest: {w.params} "
                f"(gamma = {w.extra['gamma']:.4g}, ||Delta K||_op = {w.extra['dK_op']:.3g}, ||Delta V||_op = "
                f"{w.extra['dV_op']:.3g}, measured ||l - l^||_inf = {w.extra['linf']:.3g}): ||o - o^|| = {w.measured:.4g} > "
                f"{w.bound:.4g}: {why}.", w.params))
            v.status = FAILS
    v.summary = "; ".join(parts)
    return v

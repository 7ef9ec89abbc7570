"""SUB.lowrank's falsifier 1 end to end, at equal memory (Subspace-FD-draft Sec. 11 falsifier 1; claim SUB.lowrank).

Falsifier 1 of the draft asks whether a rank r << d keeps perplexity within +1%. Beside the static-basis run of
:mod:`kvbounds.proofs_checks.sub_lowrank` (one window), this part runs the subspace cache through the end-to-end
harness (:mod:`kvbounds.e2e`: every layer's middle keys/values projected on their top-r subspace, r
from the float budget, first/last 32 tokens exact) on independent windows of real text, against uniform sampling
holding the same floats (within 1%). One trial per window; one record per budget: ``measured`` = the subspace's
mean per-token NLL increase over exact attention on that window, ``bound`` = uniform sampling's (``exact``: holds =
measured <= bound). The window is the unit: intervals and tests are over windows, not tokens.

Reproduction row: "the subspace cache beats uniform sampling at equal memory", one cell per budget, the one rule's
call over the windows (:func:`kvbounds.verdict.paired_calls`: the signed-rank test on the paired differences of
NLL increase, 0.01 nats per token the practical threshold, Holm over the budgets),
:func:`kvbounds.verdict.reproduction_status` (test-type). A miss is ``not-reproduced`` only when the paired
interval's half-width (:func:`kvbounds.e2e.falsifiers.window_effects`) is below the memory effect (uniform at the
smallest budget against the largest), else ``not-shown``.
"""
from __future__ import annotations

import numpy as np

from kvbounds.verdict import Comparison, paired_calls
from kvbounds.verdict import MIN_INSTANCES, Reproduction, reproduction_status

from .common import make_record

CHECK = "F1e subspace vs uniform"
ALPHA = 0.05
VARIANT = "falsifier 1e (end to end, equal memory): the subspace cache beats uniform sampling"


def trials(profile: str) -> list[dict]:
    """quick: 8 windows of 512 tokens, 32 held out; full: 30 windows of 1024, 64 held out; budgets 0.25, 0.5."""
    spec = {"quick": (512, 32, 8), "full": (1024, 64, 30)}.get(profile)
    if spec is None:
        return []
    n, cont, windows = spec
    return [dict(kind="ppl-window", trace=f"smollm2:L0-29:{n}", model="smollm2", n=n, cont=cont, index=i,
                 budgets=[0.25, 0.5], window=32, fallback="") for i in range(windows)]


def run_trial(params: dict, claim: str) -> list:
    import torch
    from kvbounds.e2e import trial_model
    from kvbounds.e2e import window_rows
    threads = torch.get_num_threads()
    torch.set_num_threads(1)      # the runner's workers share the cores: one thread each
    try:
        lm = trial_model(params.get("model", "smollm2"), "cpu")
        rows = window_rows(lm, int(params["index"]), n=int(params["n"]), cont=int(params["cont"]),
                           budgets=tuple(params["budgets"]), window=int(params["window"]))
    finally:
        torch.set_num_threads(threads)
    uni = {r["budget"]: r for r in rows if r["method"] == "uniform"}
    out = []
    for r in rows:
        if r["method"] != "subspace":
            continue
        u = uni[r["budget"]]
        out.append(make_record(claim, dict(params, budget=r["budget"]), measured=r["delta_nll"],
                               bound=u["delta_nll"], bound_kind="exact", check=CHECK,
                               source="Subspace-FD-draft Sec. 11 falsifier 1, end to end at equal memory",
                               rank=r["rank"], memory_fraction=r["memory_fraction"],
                               uniform_memory_fraction=u["memory_fraction"], exact_nll=r["exact_nll"],
                               n_tokens=r["n_tokens"], model=lm.name, n=int(params["n"]), fallback=""))
    return out


def _comparison(subspace: dict, uniform: dict, budget: float) -> Comparison:
    """The subspace's NLL increase against uniform's on their shared windows (lower is better; differences)."""
    keys = sorted(set(subspace) & set(uniform))
    return Comparison(f"@{budget:g}", "uniform", [subspace[k] for k in keys], [uniform[k] for k in keys], budget,
                      reason="" if keys else "no shared window", scale="difference", lower_is_better=True,
                      threshold=0.01)


def reproduction(records) -> tuple[Reproduction | None, str]:
    """The row and one summary line, from the F1e records (None, "" when there are none)."""
    from kvbounds.e2e import window_effects
    rs = [r for r in records if r.check == CHECK]
    if not rs:
        return None, ""
    budgets = sorted({float(r.params["budget"]) for r in rs})
    by = {b: ({int(r.params["index"]): r.measured for r in rs if float(r.params["budget"]) == b},
              {int(r.params["index"]): r.bound for r in rs if float(r.params["budget"]) == b}) for b in budgets}
    eff = {b: window_effects(*by[b]) for b in budgets}
    calls = {b: c for b, c in zip(budgets, paired_calls(
        [_comparison(*by[b], b) for b in budgets], unit="windows of real text", metric="practitioner"))}
    better = np.array([calls[b].call == "better" for b in budgets])
    worse = np.array([calls[b].call == "worse" for b in budgets])
    n_min = min(e["n"] for e in eff.values())
    # the memory effect: uniform at the smallest budget against the largest, on shared windows
    lo, hi = by[budgets[0]][1], by[budgets[-1]][1]
    shared = sorted(set(lo) & set(hi))
    memory_effect = abs(float(np.mean([lo[k] - hi[k] for k in shared]))) if len(budgets) > 1 and shared else 0.0
    half = max((c.ci[1] - c.ci[0]) / 2 for c in calls.values())      # inf where n holds no 95% interval
    counted = int(sum(better))
    powered = n_min >= MIN_INSTANCES and half < memory_effect
    status = reproduction_status(counted, int(sum(worse)), len(budgets), kind="test", powered=powered)
    ranks = {float(r.params["budget"]): r.extra.get("rank") for r in rs}
    cells = [f"@{b:g} (rank {ranks[b]}): subspace {e['mean']:+.3g} nats/token [95% {e['ci'][0]:+.3g}, "
             f"{e['ci'][1]:+.3g}] (perplexity {100 * e['ppl_ci'][0]:+.1f}% .. {100 * e['ppl_ci'][1]:+.1f}%), minus "
             f"uniform {calls[b].effect:+.3g} [{calls[b].ci[0]:+.3g}, {calls[b].ci[1]:+.3g}] (n={e['n']} windows); "
             f"the one rule: {calls[b].call} (Holm p {calls[b].p:.2g})" for b, e in eff.items()]
    verdict = ("beats uniform" if status == "reproduced" else "worse than uniform" if status == "reversed"
               else "no significant difference from uniform" if not any(better) and not any(worse) else "mixed")
    note = (f"effect bounded by the paired interval (half-width {half:.3g} < memory effect {memory_effect:.3g})"
            if powered else f"paired half-width {half:.3g} nats vs memory effect {memory_effect:.3g} (or < "
                            f"{MIN_INSTANCES} windows)") if status in ("not-reproduced", "not-shown") else ""
    setup = (f"{rs[0].extra.get('model', 'SmolLM2-135M-Instruct')}, n = {rs[0].extra.get('n')}, "
             f"{n_min} windows of real text (the unit), every layer, first/last 32 tokens exact")
    detail = f"{counted}/{len(budgets)} budgets better, {int(sum(worse))} worse (the one rule, Holm); " + "; ".join(cells)
    line = f"F1e end to end at equal memory, per-window intervals: subspace {verdict} ({status}); " + "; ".join(cells)
    return Reproduction(VARIANT, status, setup, detail, bound_note=note), line

"""SUB.lowrank's falsifier 1 end to end (proofs_checks/sub_lowrank_e2e.py): the window is the unit, and the verdict
says whether the subspace cache beats uniform sampling at equal memory with the per-window interval."""
import numpy as np

from kvbounds.e2e import window_effects
from kvbounds.proofs_checks import sub_lowrank, sub_lowrank_e2e as E2E
from kvbounds.proofs_checks.common import make_record


def _records(sub_shift: float, windows: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(windows):
        u = {0.25: 0.30 + 0.02 * rng.standard_normal(), 0.5: 0.10 + 0.02 * rng.standard_normal()}
        for b, ub in u.items():
            out.append(make_record("SUB.lowrank", dict(kind="ppl-window", index=i, budget=b, n=512), bound_kind="exact",
                                   measured=ub + sub_shift + 0.01 * rng.standard_normal(), bound=ub, check=E2E.CHECK,
                                   rank=8 if b == 0.25 else 24, model="SmolLM2", n=512))
    return out


def test_window_effects_is_a_t_interval_over_windows_and_the_rules_paired_difference():
    e = window_effects({0: 0.1, 1: 0.2, 2: 0.3}, {0: 0.2, 1: 0.3, 2: 0.5})
    assert e["n"] == 3 and abs(e["mean"] - 0.2) < 1e-12 and e["ci"][0] < 0.2 < e["ci"][1]
    assert abs(e["ppl_ci"][0] - np.expm1(e["ci"][0])) < 1e-12
    # differences -0.1, -0.1, -0.2: the Hodges-Lehmann estimate (median of the Walsh averages); 3 windows hold no
    # 95% signed-rank interval (None: unbounded)
    assert abs(e["diff"] + 0.125) < 1e-12 and e["diff_ci"] == (None, None)
    many = window_effects({i: 0.1 * i for i in range(10)}, {i: 0.1 * i + 0.05 for i in range(10)})
    assert abs(many["diff"] + 0.05) < 1e-9 and many["diff_ci"][0] <= -0.05 <= many["diff_ci"][1]


def test_subspace_better_than_uniform_on_every_window_reproduces():
    rep, line = E2E.reproduction(_records(-0.1))
    assert rep.status == "reproduced" and "beats uniform" in line and "n=8 windows" in line


def test_no_difference_is_not_reproduced_when_powered_and_says_so():
    rep, line = E2E.reproduction(_records(0.0))
    assert rep.status in ("not-reproduced", "not-shown") and "no significant difference" in line
    assert rep.status == "not-reproduced" and "memory effect" in rep.bound_note     # 8 windows, tight interval


def test_too_few_windows_count_no_cell():
    rep, _ = E2E.reproduction(_records(-0.1, windows=4))
    assert rep.status == "not-shown"


def test_sub_lowrank_summary_reports_the_end_to_end_falsifier():
    v = sub_lowrank.summarize(_records(0.05))
    assert "F1e end to end at equal memory, per-window intervals" in v.summary and "worse than uniform" in v.summary
    assert any(r.variant == E2E.VARIANT for r in v.reproductions)


def test_quick_profile_has_eight_window_trials():
    tr = [t for t in sub_lowrank.trials("quick") if t["kind"] == "ppl-window"]
    assert len(tr) in (0, 8)        # 0 without the model package


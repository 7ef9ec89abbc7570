"""The end-to-end checks' controls (BKV.e2e, SG.e2e): a null control (an independent uniform draw must not be
found better than uniform) and a sensitivity control (uniform with fewer floats must be found worse), through the
same paired tests and Holm rule as the claims' cells. Synthetic records: no model needed."""
import numpy as np

from kvbounds.e2e import _checks as C
from kvbounds.core import Record


def _records(shift_small: float, null_shift: float, n_inst: int = 6, tokens: int = 40, seed: int = 0):
    """ppl records of exact, uniform at budgets 0.25 / 0.5, uniform_control at both; per-token log-likelihood
    losses ~ N(mean, 0.05^2) per token, the small budget ``shift_small`` nats worse, the control ``null_shift``."""
    rng = np.random.default_rng(seed)
    recs = []
    for i in range(n_inst):
        exact = rng.normal(-2.0, 0.5, tokens)
        params = dict(task="ppl", n=512, index=i)
        rows = [("exact", 1.0, exact)]
        for b, shift in ((0.25, shift_small), (0.5, 0.0)):
            base = exact - 0.2 - shift + rng.normal(0, 0.05, tokens)
            rows.append(("uniform", b, base))
            rows.append(("uniform_control", b, base - null_shift + rng.normal(0, 0.05, tokens)))
        for method, b, ll in rows:
            extra = dict(task="ppl", method=method, budget=b, error="", ll=ll.tolist(), exact_ll=exact.tolist())
            recs.append(Record("BKV.e2e", dict(params), 0, "numpy", 0.0, 0.0, True, bound_kind="exact",
                               check=f"ppl {method} @{b:g}", extra=extra))
    return recs


def test_controls_rejected_when_the_test_sees_the_budget_and_not_the_reseed():
    ctl = C.controls(_records(shift_small=0.1, null_shift=0.0), ("ppl",))
    assert [c.name.split(" (")[-1] for c in ctl] == ["null)", "sensitivity)"]
    assert all(c.rejected for c in ctl)
    assert "detectable at 80% power" in ctl[1].detail


def test_sensitivity_control_fails_without_a_budget_effect():
    ctl = C.controls(_records(shift_small=0.0, null_shift=0.0, n_inst=2, tokens=3), ("ppl",))
    assert ctl[0].rejected and not ctl[1].rejected


def test_null_control_fails_when_the_reseed_looks_better():
    ctl = C.controls(_records(shift_small=0.1, null_shift=-0.05), ("ppl",))    # the control is 0.05 nats better
    assert not ctl[0].rejected


def test_reproduction_verdict_reports_power_from_the_controls():
    recs = _records(shift_small=0.1, null_shift=0.0)
    v = C.reproduction_verdict("BKV.e2e", recs, {"control as a variant": "uniform_control"}, ("uniform",), ("ppl",))
    assert v.power == "shown" and "null" in v.power_detail
    v = C.reproduction_verdict("BKV.e2e", _records(0.0, 0.0, n_inst=2, tokens=3), {"x": "uniform_control"},
                               ("uniform",), ("ppl",))
    assert v.power == "low"

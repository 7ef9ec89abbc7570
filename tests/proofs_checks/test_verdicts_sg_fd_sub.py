"""Issue 9 verdicts of the SubGen/ClusterGen and FD/subspace families: the branches of their summarize()
(a counterexample makes `false`, a proof step failing makes an erratum and never `false`, empirical claims on
another setup are at most `inconclusive`, controls decide power, the verdict is a function of the set of records)."""
import dataclasses
import random

import numpy as np

from kvbounds.proofs_checks import (fd_residual, sg_attention, sg_clusterability, sub_blockwise, sub_cost,
                                    sub_logit_error, sub_output_error)
from kvbounds.proofs_checks.common import make_record


def run(mod, params_list, seed=0):
    out = []
    for p in params_list:
        recs = mod.run_trial(p, seed, "numpy")
        out += recs if isinstance(recs, list) else [recs]
    return out


def test_fd_residual_false_with_the_smallest_generous_counterexample_and_theorem_r():
    trials = [p for p in fd_residual.trials("quick") if p["kind"] == "diag"]
    v = fd_residual.summarize(run(fd_residual, trials))
    assert v.statement == "false" and v.headline.startswith("false as stated")
    cx = v.counterexample
    assert cx["check"] == "draft (DK eta)"            # the most generous reading of eta refutes it
    assert (cx["params"]["n"], cx["params"]["d"], cx["params"]["ell"], cx["params"]["r"], cx["params"]["M"]) == (2, 2, 3, 1, 4)
    assert "sqrt(sigma_(r+1)(S)^2 + Delta)" in v.corrected
    assert v.proven_constant.value == 1.0
    # Theorem R alone (no draft records) holds
    tight = [r for r in run(fd_residual, trials) if not r.check.startswith("draft")]
    assert fd_residual.summarize(tight).statement == "holds"


def test_sub_logit_error_default_gamma_is_refuted_on_d2_r1_and_gamma_1_holds():
    minimal = [p for p in sub_logit_error.trials("smoke") if p["mode"] == "minimal"]
    recs = run(sub_logit_error, minimal)
    v = sub_logit_error.summarize(recs)
    assert v.statement == "false"
    assert v.counterexample["check"] == "draft sqrt(r/d) minimal"
    assert v.counterexample["params"]["d"] == 2 and v.counterexample["params"]["r"] == 1
    assert abs(v.counterexample["measured"] - (1 - 2 ** -0.5) * 2 / 2 ** 0.5) < 1e-12
    assert "(1 - gamma)" in v.corrected or "|1 - gamma|" in v.corrected
    gamma1 = [r for r in recs if r.extra.get("gamma_choice") == "1"]
    assert sub_logit_error.summarize(gamma1).statement == "holds"


def test_sub_output_error_chained_form_false_and_extremal_shows_power():
    ps = [p for p in sub_output_error.trials("smoke") if p["mode"] in ("minimal", "extremal")]
    recs = run(sub_output_error, ps)
    ext = [r for r in recs if r.check == "extremal"]
    assert ext and all(r.holds and r.measured < 1e-12 for r in ext)      # the bound is attained
    v = sub_output_error.summarize(recs)
    assert v.statement == "false" and v.counterexample["check"].startswith("chained sqrt(r/d)")
    assert v.power == "shown"
    measured_form = [r for r in recs if r.check.startswith("measured-linf") or r.check == "extremal" or r.control]
    assert sub_output_error.summarize(measured_form).statement == "holds"


def test_sub_blockwise_nan_on_masked_chunk_is_the_counterexample():
    ps = [p for p in sub_blockwise.trials("smoke") if p["kind"] in ("minimal", "all-masked")]
    recs = run(sub_blockwise, ps)
    v = sub_blockwise.summarize(recs)
    assert v.statement == "false" and v.counterexample["params"]["sizes"] == [1, 1]
    assert "guarded" in v.corrected
    assert sub_blockwise.summarize([r for r in recs if r.check != "draft literal"]).statement == "holds"


def test_sg_attention_eps_above_one_is_an_erratum_never_false():
    comb = [p for p in sg_attention.trials("smoke") if p["kind"] == "combination"]
    recs = run(sg_attention, comb)
    assert any(not r.holds for r in recs)                       # eps > 1 breaks the proof's last step
    v = sg_attention.summarize(recs)
    assert v.statement != "false" and v.proof == "errata" and len(v.errata) == 1
    e = v.errata[0]
    assert e.smallest_input["eps"] == 1.5 and "min(eps, 1)" in e.corrected
    assert "proof has 1 erratum" in v.headline


def _real(model, layer, head, ratio, key_radius, slope=1.0):
    params = dict(source="real", model=model, layer=layer, head=head, n=512,
                  positional=sg_clusterability.POSITIONAL[model])
    return [make_record(sg_clusterability.CLAIM, params, measured=ratio, bound=0.9, check="radius keys vs values",
                        bound_kind="fitted", key_radius=key_radius, value_radius=key_radius / ratio),
            make_record(sg_clusterability.CLAIM, params, measured=slope, bound=0.5, check="cluster growth keys",
                        bound_kind="fitted")]


def test_sg_clusterability_other_setup_is_inconclusive_with_reproduction_rows():
    recs = []
    for i in range(6):
        recs += _real("smollm2", i, 0, 1.3, 0.8 + 0.01 * i)           # keys less clusterable, RoPE radii high
        recs += _real("minilm", i, 0, 0.6, 0.5 + 0.01 * i)
    v = sg_clusterability.summarize(recs)
    st = {(r.variant, r.setup.split(" ")[0]): r.status for r in v.reproductions}
    assert st[("keys more clusterable than values", "MiniLM-L6")] == "reproduced"
    assert st[("keys more clusterable than values", "SmolLM2-135M")] == "reversed"
    assert st[("RoPE keys more clusterable than absolute-position keys", "SmolLM2-135M")] == "reversed"
    assert v.statement == "inconclusive" and v.status != "fails" and v.reproduction == "partial"
    assert "n = 512" in v.headline


def test_sub_cost_missing_factor_j_is_an_erratum_and_constants_are_reported_twice():
    p = dict(kind="decode", T=1024, d=64, R=16, L=512, reps=1)
    recs = [r for r in sub_cost.run_trial(p, 0, "numpy") if r.check != "time ratio"]
    v = sub_cost.summarize(recs)
    assert v.statement == "holds-fitted" and v.proof == "errata"
    assert "factor J" in v.errata[0].what and v.errata[0].smallest_input["J"] == 2
    assert v.proven_constant.kind == "proven" and v.fitted_constant.kind == "fitted"


def test_summaries_are_a_function_of_the_set_of_records():
    trials = [p for p in fd_residual.trials("smoke")]
    recs = run(fd_residual, trials)
    a = fd_residual.summarize(recs)
    shuffled = recs[:]
    random.Random(3).shuffle(shuffled)
    b = fd_residual.summarize(shuffled)
    da, db = dataclasses.asdict(a), dataclasses.asdict(b)
    assert da == db
    comb = run(sg_attention, [p for p in sg_attention.trials("smoke") if p["kind"] != "cost"][:4])
    x = sg_attention.summarize(comb)
    y = sg_attention.summarize(list(reversed(comb)))
    assert dataclasses.asdict(x) == dataclasses.asdict(y) and np.isfinite(len(x.summary))

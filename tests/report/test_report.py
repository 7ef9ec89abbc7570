"""The report end to end on a fake registry: statuses, findings, summary.json, html and figures."""
from __future__ import annotations

import dataclasses
import json
import sys
import textwrap
import types

import pytest

from kvbounds import claims as registry
from kvbounds.report import _report as report
from kvbounds.report import _figures as report_figures
from kvbounds.core import Record, ResultStore
from kvbounds.verdict._rules import (FAILS, HOLDS, HOLDS_FITTED, INCONCLUSIVE, NO_CHECK, NOT_RUN, Constant, Erratum,
                                     FigureSpec, Finding, RateInfo, Reproduction, Verdict)

CHECK_SRC = '''
from kvbounds.core._records import Record
from kvbounds.verdict import FigureSpec, standard_verdict

CLAIM = {claim!r}

def trials(profile):
    return [{{"n": n, "d": 4}} for n in (8, 16, 32)]

def run_trial(params, seed, backend):
    return Record(CLAIM, params, seed, backend, measured=1.0, bound=2.0, holds=True)

def summarize(records):
    {body}
    return standard_verdict(CLAIM, records, figures=[
        FigureSpec("measured vs n", x="n", hue="check"),
        FigureSpec("ratio vs n", x="n", y="ratio", hue="d"),
        FigureSpec("missing x", x="nope"),
    ])
'''


@pytest.fixture
def fake_claims(tmp_path, monkeypatch):
    """A registry of five claims backed by check modules written under tmp_path."""
    pkg = tmp_path / "mods"
    pkg.mkdir()
    mods = {"A.ok": ("fake_report_ok", "pass"), "B.fail": ("fake_report_fail", "pass"),
            "C.notrun": ("fake_report_notrun", "pass"), "F.fitted": ("fake_report_fitted", "pass"),
            "D.raises": ("fake_report_raises", "raise RuntimeError('boom in summarize')")}
    for cid, (mod, body) in mods.items():
        (pkg / f"{mod}.py").write_text(textwrap.dedent(CHECK_SRC.format(claim=cid, body=body)))
        monkeypatch.delitem(sys.modules, mod, raising=False)
    monkeypatch.syspath_prepend(str(pkg))
    claims = {cid: registry.Claim(cid, "Fam", f"statement of {cid} <b>", f"seed {cid}", check=mod)
              for cid, (mod, _) in mods.items()}
    claims["E.nocheck"] = registry.Claim("E.nocheck", "Fam", "no check here", "000 Thm 1")
    monkeypatch.setattr(registry, "CLAIMS", claims)
    yield claims
    for mod, _ in mods.values():
        sys.modules.pop(mod, None)


def _rec(claim, n, measured, bound=2.0, seed=0, check="main", d=4, control=False):
    return Record(claim, {"n": n, "d": d}, seed, "numpy", measured, bound, measured <= bound,
                  check=check, control=control, source="test")


@pytest.fixture
def results(tmp_path, fake_claims):
    out = tmp_path / "results"
    recs = []
    for seed in range(3):
        for n in (8, 16, 32):
            for d in (4, 8):
                recs.append(_rec("A.ok", n, 0.5 + 0.1 * seed + 0.01 * n, bound=0.1 * n, seed=seed, d=d))
                recs.append(_rec("A.ok", n, 0.2 * n, bound=0.1 * n, seed=seed, check="broken", control=True))
    # B.fail: only the n=16 and n=32 trials violate; the smallest failing input is n=16.
    recs += [_rec("B.fail", 8, 1.0), _rec("B.fail", 32, 5.0), _rec("B.fail", 16, 3.0), _rec("B.fail", 16, 1.5)]
    recs += [_rec("D.raises", 8, 1.0)]
    recs += [Record("F.fitted", {"n": n, "d": 4}, 0, "numpy", 0.3 * n, n, True, bound_kind="shape") for n in (8, 16, 32)]
    recs += [_rec("Z.unregistered", 8, 1.0)]
    ResultStore(out).append(recs)
    return out


def test_build_verdicts_statuses(results, fake_claims):
    v = report.build_verdicts(ResultStore(results).load())
    assert list(v) == list(fake_claims)  # registry order, every claim
    assert v["A.ok"].status == HOLDS
    assert v["B.fail"].status == FAILS
    assert v["C.notrun"].status == NOT_RUN
    assert v["D.raises"].status == INCONCLUSIVE and "boom in summarize" in v["D.raises"].summary
    assert v["E.nocheck"].status == NO_CHECK
    assert v["F.fitted"].status == HOLDS_FITTED and v["F.fitted"].constant == pytest.approx(0.3)
    (f,) = v["B.fail"].findings
    assert f.smallest_input == {"n": 16, "d": 4}


def test_write_report(results, fake_claims):
    path = report.write_report(results)
    assert path == results / "report.html" and path.exists()
    raw = (results / "summary.json").read_bytes()
    summary = json.loads(raw)
    unique = summary.pop("findings")
    assert [f["claims"] for f in unique] == [["B.fail"]] and unique[0]["id"] == "F1"
    assert set(summary.pop("papers")) and summary.pop("run")["records"] > 0      # the per-paper answers, the run
    summary.pop("practitioner"), summary.pop("leaderboard")
    assert {k: s["status"] for k, s in summary.items()} == {
        "A.ok": HOLDS, "B.fail": FAILS, "C.notrun": NOT_RUN, "D.raises": INCONCLUSIVE, "E.nocheck": NO_CHECK,
        "F.fitted": HOLDS_FITTED}
    fields = {f.name for f in dataclasses.fields(Verdict)} - {"figures"}
    assert all(set(s) == fields for s in summary.values())
    assert summary["B.fail"]["findings"][0]["smallest_input"] == {"d": 4, "n": 16}
    assert summary["A.ok"]["constant_kind"] == "proven"
    assert summary["F.fitted"]["constant_kind"] == "fitted" and len(summary["F.fitted"]["constant_spread"]) == 2
    report.write_report(results)
    assert (results / "summary.json").read_bytes() == raw          # deterministic: same records, same bytes

    # the committed full-profile curves (docs/e2e_curves.json) are drawn when the run has none of its own
    figs = sorted(p.name for p in (results / "figures").glob("*.png") if p.name != "e2e_curves.png")
    assert figs == ["A.ok_0.png", "A.ok_1.png", "B.fail_0.png", "B.fail_1.png", "F.fitted_0.png", "F.fitted_1.png"]
    assert all((results / "figures" / f).stat().st_size > 1000 for f in figs)

    text = path.read_text()
    for cid in fake_claims:
        assert f">{cid}</a>" in text
    assert 'src="figures/A.ok_0.png"' in text
    assert "statement of A.ok &lt;b&gt;" in text  # escaped
    assert "smallest input: n = 16, d = 4" in text  # the finding's smallest input, in words
    assert "Z.unregistered" in text  # named as ignored in the metadata
    assert "fitted</b> C = 0.3" in text
    assert 'id="matrix"' in text and "totals" in text


def test_missing_or_empty_results_dir_is_an_error(tmp_path, fake_claims):
    with pytest.raises(report.ReportError, match="does not exist"):
        report.write_report(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(report.ReportError, match="no records"):
        report.write_report(tmp_path / "empty")


def test_report_filtered_to_claims(results, fake_claims):
    report.write_report(results, claims=["B.fail"])
    assert list(json.loads((results / "summary.json").read_text())) == ["B.fail", "findings", "leaderboard", "papers",
                                                                        "practitioner", "run"]


def test_render_terminal(results, fake_claims):
    out = report.render_terminal(report.build_verdicts(ResultStore(results).load()))
    for cid in fake_claims:
        assert cid in out
    assert "Findings (1)" in out and "smallest input: n = 16, d = 4" in out
    assert "fitted constant C = 0.3" in out
    assert all(len(line) < 200 for line in out.splitlines() if line.startswith("A.ok"))


def test_planned_but_missing_check_module_is_no_check(tmp_path, monkeypatch):
    # registry entries name their planned check module up front; until it exists the claim has no check
    monkeypatch.setattr(registry, "CLAIMS", {"X": registry.Claim("X", "F", "s", "src", check="no_such_module_xyz")})
    v = report.build_verdicts([_rec("X", 8, 1.0)])
    assert v["X"].status == NO_CHECK


def _full_verdict(cid):
    """A hand-made verdict with every dimension field filled."""
    return Verdict(
        cid, FAILS, "3/10 trials within bound; max measured/bound 2.5; more detail after the first clause",
        constant=1.5, constant_kind="fitted", constant_spread=(0.5, 1.0),
        findings=[Finding(cid, "bound violated", "measured 2.5 > bound 1", {"n": 8}),
                  Finding(cid, "proof step wrong", "001 Lemma C.3 step 2", {}, kind="erratum")],
        figures=[FigureSpec("measured vs n", x="n")], n_records=10, kind="theorem", statement="false",
        proof="errata", rate="not-reached", reproduction="partial", power="shown",
        headline="false as stated", counterexample={"n": 8, "measured": 2.5, "bound": 1.0},
        corrected="holds with constant 3 instead of 1",
        errata=[Erratum("001 Lemma C.3, step 2", "sign error", {"d": 2}, "flip the sign")],
        rate_info=RateInfo("t", (8.0, 64.0), -1.0, -0.5, (-0.6, -0.4), "sets in beyond t = 1e4 (extrapolated)"),
        reproductions=[Reproduction("released", "not-reproduced", "SmolLM2, 4 layers, n = 512", "2/8 cells")],
        power_detail="controls rejected 4/4", proven_constant=Constant(30.0, "proven", "c = 30 log(n/delta)"),
        fitted_constant=Constant(1.5, "fitted", "max measured/shape", (0.5, 1.0)))


def test_every_dimension_field_rendered(results, fake_claims, tmp_path):
    recs = ResultStore(results).load()
    verdicts = report.build_verdicts(recs)
    verdicts["B.fail"] = _full_verdict("B.fail")
    html = report.render_html(verdicts, recs, {})
    for text in ("false as stated", "statement: false", "proof: errata", "rate: not-reached",
                 "reproduction: partial", "power: shown", "counterexample",
                 "the smallest input: n = 8: measured 2.5 against the bound 1",
                 "holds with constant 3 instead of 1", "BalanceKV-NeurIPS Lemma C.3, step 2", "sign error",
                 "flip the sign", "stated exponent -1.0", "sets in beyond t = 1e4", "released: not-reproduced",
                 "SmolLM2, 4 layers", "controls rejected 4/4", "<b>proven</b> C = 30", "c = 30 log(n/delta)",
                 "<b>fitted</b> C = 1.5", "3/10 trials within bound",
                 "erratum</b> (1)", "bound violated"):
        assert text in html, text
    # legacy verdicts (no dimensions) fall back to their status
    assert report.dimensions(verdicts["A.ok"])["statement"] == "holds"
    s = json.loads(report.summary_json({"B.fail": verdicts["B.fail"]}))["B.fail"]
    assert s["rate_info"]["stated_exponent"] == -1.0 and s["errata"][0]["corrected"] == "flip the sign"
    assert s["proven_constant"]["value"] == 30.0 and "figures" not in s


def test_error_records_and_leaderboard_rendered(results, fake_claims, monkeypatch):
    ResultStore(results).append([Record.failed("A.ok", {"n": 8}, 0, "numpy", "ValueError: boom in trial",
                                               "Traceback ...\nValueError: boom in trial")])
    rows = [dict(method=m, source=src, budget=b, memory_floats=int(1000 * b), metric=metric, value=v * b,
                 ci_low=v * b - 0.1, ci_high=v * b + 0.1, n=20, note="")
            for (m, src, v) in (("balancekv", "kvbounds", 1.0), ("snapkv", "kvpress", 0.8))
            for b in (0.25, 0.5) for metric in ("passkey accuracy", "perplexity")]
    fake = types.ModuleType("kvbounds.e2e._leaderboard")
    fake.leaderboard_rows = lambda records: rows
    monkeypatch.setitem(sys.modules, "kvbounds.e2e", types.ModuleType("kvbounds.e2e"))
    monkeypatch.setitem(sys.modules, "kvbounds.e2e._leaderboard", fake)
    text = report.write_report(results).read_text()
    assert "Trials that raised (1)" in text and "boom in trial" in text
    assert "End-to-end leaderboard" in text and "snapkv" in text and "kvpress" in text and "budget 0.25" in text
    assert (results / "figures" / "leaderboard.png").stat().st_size > 1000
    only_b = report.write_report(results, ["B.fail"]).read_text()     # `report CLAIM`: that claim's errors only
    assert "Trials that raised" not in only_b and "boom in trial" not in only_b


def test_deferred_records_listed_not_summarized(results, fake_claims):
    deferred = Record("F.fitted", {"n": 64, "d": 4, "sweep": "n"}, 0, "numpy", 0.0, 0.0, True, bound_kind="shape",
                      check="deferred", extra={"deferred": "too large for numpy"})
    ResultStore(results).append([deferred])
    v = report.build_verdicts(ResultStore(results).load())["F.fitted"]
    assert v.n_records == 3 and v.constant == pytest.approx(0.3)
    assert v.deferred == "1 trial(s) of the n sweep deferred on numpy: n = 64 (too large for numpy)"
    assert "not yet measured: 1 trial(s) of the n sweep" in report.write_report(results).read_text()


def test_figure_sweep_filter_and_fitted_bound(tmp_path):
    recs = [Record("X", {"sweep": sw, "n": n, "t": t}, 0, "numpy", 2.0 * n, n, True, bound_kind="shape", check="c")
            for sw, ns, ts in (("n", (8, 16, 32), (4,)), ("t", (16,), (2, 4, 8))) for n in ns for t in ts]
    spec = FigureSpec("measured vs n", x="n")
    sel = report_figures.select_records(spec, recs)
    assert {r.params["sweep"] for r in sel} == {"n"} and len(sel) == 3       # the t sweep is not pooled in
    assert report_figures.fitted_constants(recs) == {"c": pytest.approx(2.0)}
    note, _ = report_figures.draw_figure(spec, recs, tmp_path / "f.png")
    assert note is None and (tmp_path / "f.png").exists()
    many = [Record("X", {"n": n, "l": l}, 0, "numpy", 1.0, 2.0, True) for n in (8, 16) for l in range(9)]
    note, caption = report_figures.draw_figure(FigureSpec("x", x="n", hue="l"), many, tmp_path / "g.png")
    assert note is None and caption == "6 of 9 values of l shown"
    inf = [Record("X", {"n": n}, 0, "numpy", float("inf"), 1.0, False) for n in (8, 16)]
    assert "non-finite" in report_figures.draw_figure(FigureSpec("x", x="n"), inf, tmp_path / "h.png")[0]


def test_figure_keeps_to_the_checks_listed_in_its_title_and_its_params_filter():
    recs = [Record("X", {"n": n, "d": d, "sweep": "n-large"}, 0, "numpy", 1.0, 2.0, True, check=c)
            for n in (8, 16) for d in (2, 4) for c in ("paper c", "random-signs", "half")]
    spec = FigureSpec("discrepancy / shape vs n (paper c, random signs), d = 2", x="n", hue="check", y="ratio",
                      sweep="n-large", where={"d": 2})
    sel = report_figures.select_records(spec, recs)
    assert {r.check for r in sel} == {"paper c", "random-signs"} and {r.params["d"] for r in sel} == {2}


def test_figure_keeps_to_the_quantity_its_title_names():
    checks = {"time gram", "time rows", "memory gram", "memory rows"}
    spec = FigureSpec("peak memory / (8 (d+s) n bytes) vs n", x="n", hue="check", y="ratio")
    assert report_figures.title_checks(spec, checks) == {"memory gram", "memory rows"}
    assert report_figures.title_checks(FigureSpec("eps_hat vs t", x="t", hue="check"), checks) == checks


def test_a_finding_several_checks_report_is_one_finding_with_its_claims(results, fake_claims):
    """BalanceKV-NeurIPS App. B vs the released code is reported by BKV.vs-uniform and BKV.ablation: the
    terminal, the html and summary.json list it once, attached to both claims, and count unique findings."""
    recs = ResultStore(results).load()
    verdicts = report.build_verdicts(recs)
    shared = [Finding(c, "App. B vs released code: GQA", "001 treats one attention head", {}, kind="versions disagree")
              for c in ("A.ok", "F.fitted")]
    verdicts["A.ok"].findings.append(shared[0])
    verdicts["F.fitted"].findings.append(shared[1])
    unique = report.unique_findings(verdicts)
    (gqa,) = [f for f in unique if f["title"].endswith("GQA")]
    assert len(unique) == 2 and gqa["claims"] == ["A.ok", "F.fitted"]
    assert gqa["detail"] == "BalanceKV-NeurIPS treats one attention head"
    term = report.render_terminal(verdicts)
    assert "Findings (2)" in term and term.count("App. B vs released code: GQA") == 1 and "[A.ok, F.fitted]" in term
    html = report.render_html(verdicts, recs, {})
    assert "Findings (2)" in html and html.count("treats one attention head") == 3     # once + each claim's card
    s = json.loads(report.summary_json(verdicts))
    assert len(s["findings"]) == 2 and gqa in s["findings"]
    assert s["A.ok"]["findings"][-1]["id"] == s["F.fitted"]["findings"][-1]["id"] == gqa["id"]


def test_beat_nothing_table_and_power_table_rendered(results, fake_claims):
    """Issue 20: the report's 'does it beat doing nothing' table, the card's power table and the glance count come
    from the verdict's power fields."""
    from kvbounds.battery import power_vs_controls
    recs = ResultStore(results).load()
    verdicts = report.build_verdicts(recs)
    ctl = [Record("B.fail", dict(family=f, rep=i), 0, "numpy", 1.0 + i / 100, 0.5, False, bound_kind="shape",
                  check="trivial controls", extra=dict(controls=dict(zeros=0.5 + i / 100, mean_values=2.0)))
           for f in ("synthetic benign", "real MiniLM") for i in range(10)]
    p = power_vs_controls(ctl, setting=lambda r: r.params["family"])
    v = _full_verdict("B.fail")
    v.power, v.power_note, v.power_table, v.power_calls, v.headline = "low", p.note, p.table(), p.calls, ""
    from kvbounds.verdict import finalize
    verdicts["B.fail"] = finalize(v)
    html = report.render_html(verdicts, recs, {})
    for text in ("baselines at equal memory?", "synthetic benign", "real MiniLM",
                 "worse than zeros (real MiniLM: 1.92 [", "mean of values", "worse 1.92",
                 "worse than doing nothing somewhere"):
        assert text in html, text
    assert html.index("baselines at equal memory?") < html.index('id="matrix"')
    s = json.loads(report.summary_json({"B.fail": verdicts["B.fail"]}))["B.fail"]
    assert s["power_table"][0]["setting"] == "real MiniLM"
    assert {(c["family"], c["control"], c["call"]) for c in s["power_calls"]} == {
        (f, "zeros", "worse") for f in ("real MiniLM", "synthetic benign")} | {
        (f, "mean_values", "better") for f in ("real MiniLM", "synthetic benign")}

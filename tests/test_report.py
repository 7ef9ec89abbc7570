"""The report end to end on a fake registry: statuses, findings, summary.json, html and figures."""
from __future__ import annotations

import json
import sys
import textwrap

import pytest

from kvbounds import registry, report
from kvbounds.records import Record, ResultStore
from kvbounds.verdict import FAILS, HOLDS, HOLDS_FITTED, INCONCLUSIVE, NO_CHECK, NOT_RUN

CHECK_SRC = '''
from kvbounds.records import Record
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
    summary = json.loads((results / "summary.json").read_text())
    assert {k: s["status"] for k, s in summary.items()} == {
        "A.ok": HOLDS, "B.fail": FAILS, "C.notrun": NOT_RUN, "D.raises": INCONCLUSIVE, "E.nocheck": NO_CHECK,
        "F.fitted": HOLDS_FITTED}
    assert summary["B.fail"]["findings"][0]["smallest_input"] == {"n": 16, "d": 4}
    assert summary["A.ok"]["constant_kind"] == "proven"
    assert summary["F.fitted"]["constant_kind"] == "fitted" and len(summary["F.fitted"]["constant_spread"]) == 2

    figs = sorted(p.name for p in (results / "figures").glob("*.png"))
    assert figs == ["A.ok_0.png", "A.ok_1.png", "B.fail_0.png", "B.fail_1.png", "F.fitted_0.png", "F.fitted_1.png"]
    assert all((results / "figures" / f).stat().st_size > 1000 for f in figs)

    text = path.read_text()
    for cid in fake_claims:
        assert f">{cid}<" in text
    assert 'src="figures/A.ok_0.png"' in text
    assert "skipped: x key &#x27;nope&#x27;" in text
    assert "statement of A.ok &lt;b&gt;" in text  # escaped
    assert "{&quot;d&quot;:4,&quot;n&quot;:16}" in text  # the finding's smallest input, compact JSON
    assert "Z.unregistered" in text  # named as ignored in the metadata
    assert "0.3 (fitted)" in text


def test_empty_results_dir(tmp_path, fake_claims):
    path = report.write_report(tmp_path / "empty")
    summary = json.loads((tmp_path / "empty" / "summary.json").read_text())
    assert path.exists() and summary["A.ok"]["status"] == NOT_RUN and summary["E.nocheck"]["status"] == NO_CHECK


def test_render_terminal(results, fake_claims):
    out = report.render_terminal(report.build_verdicts(ResultStore(results).load()))
    for cid in fake_claims:
        assert cid in out
    assert "Findings (1)" in out and '{"d":4,"n":16}' in out
    assert "C=0.3 (fitted)" in out
    assert all(len(line) < 200 for line in out.splitlines() if line.startswith("A.ok"))


def test_planned_but_missing_check_module_is_no_check(tmp_path, monkeypatch):
    # registry entries name their planned check module up front; until it exists the claim has no check
    monkeypatch.setattr(registry, "CLAIMS", {"X": registry.Claim("X", "F", "s", "src", check="no_such_module_xyz")})
    v = report.build_verdicts([_rec("X", 8, 1.0)])
    assert v["X"].status == NO_CHECK

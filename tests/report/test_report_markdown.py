"""`kvbounds report --markdown` (docs/RESULTS.md, `make results-md`) and the README's generated "What we found"."""
import re
from pathlib import Path

import pytest

from kvbounds import claims as registry
from kvbounds.core import Record, ResultStore
from kvbounds.report import build_verdicts
from kvbounds.report.markdown import FOUND_BEGIN, FOUND_END, anchor, found_block, render_markdown, splice
from kvbounds.verdict._rules import Finding

ROOT = Path(__file__).resolve().parents[2]
META = {"version": "0", "profile": "quick", "records": 0, "duration": "", "trial_time": ""}


def _claims_in(text: str) -> set[str]:
    rows = set(re.findall(r"^\| \[([^\]]+)\]\(#claim-", text, re.M))
    sections = set(re.findall(r"^### ([^:]+):", text, re.M))
    return rows & sections


def test_every_registry_claim_is_in_the_markdown_with_its_fields():
    verdicts = build_verdicts([])
    v = verdicts["BKV.vs-uniform"]
    v.findings = [Finding(c, "App. B vs released code: GQA", "001 treats one head", {}, kind="versions disagree")
                  for c in ("BKV.vs-uniform",)]
    verdicts["BKV.ablation"].findings = [Finding("BKV.ablation", "App. B vs released code: GQA", "001 treats one head",
                                                 {}, kind="versions disagree")]
    v.power_detail = "controls rejected 3/3"
    text = render_markdown(verdicts, [], META)
    assert _claims_in(text) == set(registry.CLAIMS)
    assert "## Findings (1 unique)" in text and "BalanceKV-NeurIPS treats one head" in text
    assert "[BKV.vs-uniform](#claim-BKV-vs-uniform), [BKV.ablation](#claim-BKV-ablation)" in text
    assert "**power detail**: controls rejected 3/3" in text                  # verdict fields rendered generically
    assert not re.search(r"\b00[0-4] ", text)


def test_cli_writes_markdown(tmp_path, capsys):
    from kvbounds.cli import main
    out = tmp_path / "results"
    ResultStore(out).append([Record("SG.reservoir", {"n": 8}, 0, "numpy", 1.0, 2.0, True, key="k")])
    assert main(["report", "--out", str(out), "--markdown", str(tmp_path / "docs" / "RESULTS.md")]) == 0
    text = (tmp_path / "docs" / "RESULTS.md").read_text()
    assert _claims_in(text) == set(registry.CLAIMS) and "markdown:" in capsys.readouterr().out


def test_committed_results_md_names_every_claim():
    path = ROOT / "docs" / "RESULTS.md"
    if not path.exists():
        pytest.skip("docs/RESULTS.md not generated yet (`make report && make results-md`)")
    assert _claims_in(path.read_text()) == set(registry.CLAIMS)


def test_readme_what_we_found_block_is_generated_and_spliced():
    readme = (ROOT / "README.md").read_text()
    assert readme.index(FOUND_BEGIN) < readme.index(FOUND_END) < readme.index("## The papers")
    assert readme.index("## What we found") < readme.index("## Installing")
    verdicts = build_verdicts([])
    verdicts["FD.residual"].headline = "false as stated; corrected bound given"
    block = found_block(verdicts)
    assert f"[FD.residual](docs/RESULTS.md#{anchor('FD.residual')})" in block and "SG.reservoir" not in block
    assert splice(f"a\n{FOUND_BEGIN}\nold\n{FOUND_END}\nb", block) == f"a\n{block}\nb"


def test_leaderboard_in_markdown_is_ranked_with_intervals_and_floats():
    """The e2e leaderboard's tables (kvbounds.report.board_table) as markdown: rank, interval, floats,
    best/tied marks, exact attention as a reference and uninformative tables collapsed."""
    board = [dict(metric="passkey log-likelihood", method="h2o", source="kvbounds", budget=0.25,
                  budget_label="25% of the cache", value=-12.5, ci_low=-15.2, ci_high=-9.7, n=8, rank=1, best=True,
                  memory_floats=1474560),
             dict(metric="passkey log-likelihood", method="uniform", source="kvbounds", budget=0.25,
                  budget_label="25% of the cache", value=-14.6, ci_low=-16.0, ci_high=-13.1, n=8, rank=2, tied=True,
                  memory_floats=1470000),
             dict(metric="passkey log-likelihood", method="exact", source="kvbounds", value=-1.4, n=8),
             dict(metric="lines exact match", method="all methods", budget=0.25, budget_label="25% of the cache",
                  note="every method at 0")]
    text = render_markdown(build_verdicts([]), [], META, board)
    assert "**passkey log-likelihood - 25% of the cache**" in text
    assert "| 1 | h2o | kvbounds | -12.5 [-15.2, -9.7] | 8 | 1,474,560 | best |" in text
    assert "| 2 | uniform | kvbounds | -14.6 [-16, -13.1] | 8 | 1,470,000 | tied with best |" in text
    assert "exact attention -1.4" in text and "lines exact match at 25% of the cache: every method at 0" in text

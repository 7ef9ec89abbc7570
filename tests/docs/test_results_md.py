"""The committed README's "What we found" and docs/RESULTS.md are what `make results-md` generates.

* Cheap (in `make test`): both are exactly what the committed docs/summary.json (the run's summary.json, copied by
  `make results-md`) renders to: no hand edit inside the generated parts, no stale document after a renderer change.
* Slow (``-m slow``; not in CI's required path: a fresh run on another CPU may flip a test on its edge, e.g. a slope's
  interval, so the comparison is for a person to read): the quick profile run afresh into a temporary directory
  renders what the committed quick summary (docs/summary-quick.json) renders to, timing lines aside; a unified diff
  is printed on a mismatch. (The committed documents come from the full profile, whose run took 1 h 34 min on 2 cores.)
"""
from __future__ import annotations

import difflib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvbounds.report.markdown import FOUND_BEGIN, FOUND_END, render_from_summary
from kvbounds.report.summary_read import load_summary

ROOT = Path(__file__).resolve().parents[2]
SUMMARY, RESULTS, README = ROOT / "docs" / "summary.json", ROOT / "docs" / "RESULTS.md", ROOT / "README.md"
QUICK_SUMMARY = ROOT / "docs" / "summary-quick.json"


def found(text: str) -> str:
    i, j = text.index(FOUND_BEGIN), text.index(FOUND_END)
    return text[i:j + len(FOUND_END)]


def diff(want: str, got: str, name: str) -> str:
    lines = list(difflib.unified_diff(want.splitlines(True), got.splitlines(True), f"{name} (committed)",
                                      f"{name} (generated)", n=1))
    return "".join(lines[:200]) + (f"\n... {len(lines) - 200} more diff lines" if len(lines) > 200 else "")


def test_committed_documents_are_what_the_committed_summary_renders_to():
    results, block = render_from_summary(load_summary(SUMMARY))
    committed = RESULTS.read_text(encoding="utf-8")
    assert results == committed, "docs/RESULTS.md differs from what docs/summary.json renders to; run " \
                                 "`make results-md`:\n" + diff(committed, results, "docs/RESULTS.md")
    readme = found(README.read_text(encoding="utf-8"))
    assert block == readme, "README.md's What we found differs from what docs/summary.json renders to; run " \
                            "`make results-md`:\n" + diff(readme, block, "README.md")


# what a fresh run changes besides the findings: its time, its commit, the practitioner's time column, and the lines
# that report a measured time or a peak allocation (the cost claims' summaries and constants: wall clock and allocator)
TIMING = re.compile(r"wall clock|CPU time|^- duration:|^- kvbounds .*, commit |\btime\b|\bns per\b|seconds|peak bytes"
                    r"|\bus\b|ms per")
TIME_CELL = re.compile(r"\| [-+.\de]+ / [-+.\de]+ \|$")


def without_timing(text: str) -> str:
    lines = [TIME_CELL.sub("| (time) |", line) for line in text.splitlines() if not TIMING.search(line)]
    return "\n".join(lines)


@pytest.mark.slow
def test_a_fresh_quick_run_renders_the_committed_documents(tmp_path):
    out = tmp_path / "results"
    for args in (["check", "--profile", "quick", "--out", str(out)], ["report", "--out", str(out)]):
        subprocess.run([sys.executable, "-m", "kvbounds", *args], check=True, cwd=ROOT, timeout=3600,
                       stdout=subprocess.DEVNULL)
    results, block = render_from_summary(load_summary(out / "summary.json"))
    want_results, want_block = render_from_summary(load_summary(QUICK_SUMMARY))
    for got, want, name in ((results, want_results, "docs/RESULTS.md"), (block, want_block, "README.md")):
        got, want = without_timing(got), without_timing(want)
        assert got == want, f"a fresh quick run differs from the committed {name}:\n" + diff(want, got, name)

"""Nothing a reader sees carries an issue number, a LaTeX label or an internal label: the report (html, markdown,
summary.json, the terminal's table, the README's what-we-found block) built from the session's smoke records, the
claim registry's statements and sources (``kvbounds list`` / ``show``), README.md, docs/*.md, the notebooks (cells
and their saved outputs) and the docstrings of the package's modules, classes and functions (what ``help()``
shows). CHANGELOG.md keeps its issue numbers: it is the project's history.
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from kvbounds import claims as registry

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIRS = ("kvbounds", "theory", "algorithms", "proofs_checks", "gpu", "traces")   # kvbounds/<dir> link to these

ISSUE = re.compile(r"\(issues? #?\d+|\bissues? #?\d+\b", re.IGNORECASE)
LATEX = re.compile(r"\b(?:thm|lem|lemma|alg|cor|eq|sec|def|prop|fig|app|tab):[A-Za-z][\w-]*")
# the erase rule's internal value as a report line shows a params dict, the papers' seed labels and file names
INTERNAL = re.compile(r"\brule: proof\d+|\bproof00\d\b|\b00[0-4] (?:Thm|Lemma|Alg|Sec|App|Cor|Fig|Eq|shape|proof)\b"
                      r"|\b00[0-4]_[0-9a-f]{16}\b|/work/shared")
ALWAYS = {"an issue number": ISSUE, "a LaTeX label": LATEX}
GENERATED = dict(ALWAYS, **{"an internal label": INTERNAL})


def offences(text: str, where: str, patterns=GENERATED) -> list[str]:
    out = []
    for what, pat in patterns.items():
        for m in pat.finditer(text):
            out.append(f"{where}: {what} {m.group(0)!r} in ...{text[max(0, m.start() - 60):m.end() + 30]!r}")
    return out


def test_the_patterns_catch_what_they_are_for():
    bad = ["(issue 10)", "as issue 23 says", "thm:main-theorem", "alg:BALANCE-V", "rule: proof001",
           "001 Thm 3.3", "000_54b4e1352ae92379.txt"]
    assert all(offences(t, "x") for t in bad)
    fine = ["BalanceKV-preprint Thm 3.1", "Alg. 4", "an issue of numbers", "the erase rule: the proof's threshold",
            "t = 0.001", "ratio: 1.03", "https://arxiv.org/abs/2502.07861"]
    assert not [o for t in fine for o in offences(t, "x")]


def docstrings(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                     ast.ClassDef))]:
        doc = ast.get_docstring(node, clean=False)
        if doc:
            yield getattr(node, "name", "<module>"), doc


def test_no_docstring_of_the_package_cites_an_issue_or_a_latex_label():
    found = []
    for d in PACKAGE_DIRS:
        for path in sorted((ROOT / d).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if d == "kvbounds" and rel.parts[1] in PACKAGE_DIRS:      # the links: scanned as the folders they name
                continue
            for name, doc in docstrings(path):
                found += offences(doc, f"{rel}: {name}", dict(ALWAYS, **{"an internal label": re.compile(
                    r"\brule: proof\d+|\b00[0-4] (?:Thm|Lemma|Alg|Sec|App|Cor|shape)\b|/work/shared")}))
    assert not found, "\n".join(found[:20])


def test_no_document_or_notebook_a_reader_opens_cites_one():
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        found += offences(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
            text = "".join(cell.get("source", []))
            text += "".join("".join(o.get("text", [])) + "".join(o.get("data", {}).get("text/plain", []))
                            for o in cell.get("outputs", []))
            found += offences(text, f"{path.name} cell {i}")
    for c in registry.CLAIMS.values():
        found += offences(f"{c.statement} {c.source}", f"registry {c.id}")
    assert not found, "\n".join(found[:20])


def test_no_report_of_the_smoke_records_cites_one(tmp_path, smoke_store):
    """Every claim's smoke verdict, as each of the report's forms shows it."""
    from kvbounds.core import ResultStore
    from kvbounds.report._report import build_verdicts, render_html, render_terminal, summary_json
    from kvbounds.report.markdown import found_block, render_markdown
    from kvbounds.report._meta import leaderboard, run_metadata
    claims = [c.id for c in registry.CLAIMS.values() if c.has_check]
    smoke_store.copy_into(tmp_path, claims)
    records = ResultStore(tmp_path).load()
    verdicts = build_verdicts(records)
    meta = run_metadata(records, verdicts, tmp_path)
    texts = {"report.html": render_html(verdicts, records, {}, meta=meta, glossary_links=True),
             "summary.json": summary_json(verdicts), "the terminal": render_terminal(verdicts),
             "RESULTS.md": render_markdown(verdicts, records, meta, leaderboard(records)),
             "README's what-we-found": found_block(verdicts)}
    found = [o for where, text in texts.items() for o in offences(text, where)]
    assert not found, "\n".join(found[:20])

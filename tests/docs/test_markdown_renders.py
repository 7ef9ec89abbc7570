"""README.md and docs/*.md render as written: a formula keeps every character after a CommonMark + GFM-tables render
(markdown-it-py, as GitHub renders), so underscores and asterisks in math are in code spans or escaped; every relative
link points at a file (and an anchor at a heading or an ``<a id>`` there)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

markdown_it = pytest.importorskip("markdown_it", reason="markdown-it-py (the dev extra) renders the markdown")

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


def _emphasis_in_math(text: str) -> list[str]:
    """The emphases a formula made: any made by ``_`` (the docs emphasise with ``*`` only; an underscore emphasis is
    a subscript that lost its characters), and any made by ``*`` around math (<=, ||, ^, sqrt)."""
    md = markdown_it.MarkdownIt("commonmark").enable("table").enable("strikethrough")
    bad = []
    for block in md.parse(text):
        kids = block.children or []
        for i, tok in enumerate(kids):
            if tok.type not in ("em_open", "strong_open"):
                continue
            close = tok.type.replace("_open", "_close")
            j = next((j for j in range(i + 1, len(kids)) if kids[j].type == close), len(kids))
            inner = "".join(k.content for k in kids[i + 1:j] if k.type == "text")
            if tok.markup.startswith("_") or (tok.markup == "*" and re.search(r"<=|>=|\|\||\^|sqrt\(", inner)):
                bad.append(f"{tok.markup}{inner[:40]}")
    return bad


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_formula_loses_characters(page):
    bad = _emphasis_in_math(page.read_text(encoding="utf-8"))
    assert not bad, bad[:5]


def test_a_bare_formula_would_be_caught():
    assert _emphasis_in_math("the bound ||A(I-P)||_op <= sqrt(sigma_(r+1)(S)^2 + Delta) holds")
    assert not _emphasis_in_math("the bound `||A(I-P)||_op <= sqrt(sigma_(r+1)(S)^2 + Delta)` holds")
    assert not _emphasis_in_math("*the walk is a coin* and **bold** words")


def _anchors(page: Path) -> set[str]:
    text = page.read_text(encoding="utf-8")
    ids = set(re.findall(r'<a id="([^"]+)"', text))
    for h in re.findall(r"^#+\s+(.*)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
        ids.add(slug)
    return ids


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page):
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, frag = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(target)
        elif frag and dest.suffix == ".md" and frag not in _anchors(dest):
            broken.append(target)
    assert not broken, broken

"""The report's html, finished after the template has rendered it (:func:`finish`), in one pass over its tags:

  * every table not already in a scrolling box gets one of its own (``div.scroll``, a region whose label says it
    scrolls sideways), so that a wide table scrolls inside the page instead of pushing the page wider;
  * the first occurrence of each glossary term (:mod:`kvbounds.report`) in each section (a claim's card, or the
    part under an ``h2``) links to its definition, in running text only: not inside links, code, headings, the
    table of contents, a ``summary`` toggle or the glossary itself.

Tags, text (already escaped by the template) and character references pass through as written.
"""
from __future__ import annotations

import re
from html import escape
from html.parser import HTMLParser

from ._glossary import TERMS, Term

SCROLLS = "scrolls sideways"      # what a scrolling box's label says (the layout test looks for it)
SCROLL_BOX = f'<div class="scroll" role="region" tabindex="0" aria-label="table ({SCROLLS} when wider than the page)">'
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
NO_LINK = {"a", "code", "pre", "style", "script", "title", "h1", "h2", "h3", "h4", "summary", "nav", "button",
           "textarea", "select", "option", "label", "dt", "figcaption"}


def term_pattern(terms=TERMS) -> re.Pattern:
    """One case-insensitive pattern, a named group per term (``t0``, ``t1``, ... in the order of ``terms``); a term
    matches whole words only (not "released" inside ``balancekv_released``, nor "StreamingLLM" in a class name)."""
    return re.compile("|".join(f"(?P<t{i}>(?<!\\w)(?:{'|'.join(t.patterns)})(?!\\w))" for i, t in enumerate(terms)),
                      re.IGNORECASE)


class _Finisher(HTMLParser):
    def __init__(self, terms: tuple[Term, ...]):
        super().__init__(convert_charrefs=False)          # text and character references pass as written
        self.terms, self.pattern = terms, term_pattern(terms) if terms else None
        self.out: list[str] = []
        self.stack: list[tuple[str, str, bool]] = []      # (tag, class, no links inside)
        self.quiet = 0                                     # open elements that take no links
        self.tables: list[bool] = []                       # per open table: wrapped here?
        self.seen: set[str] = set()                        # anchors linked in this section

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("section", "h2"):
            self.seen = set()
        if tag == "table":
            parent = self.stack[-1] if self.stack else ("", "", False)
            wrap = not (parent[0] == "div" and "scroll" in parent[1].split())
            if wrap:
                self.out.append(SCROLL_BOX)
            self.tables.append(wrap)
        if tag == "div" and "scroll" in (a.get("class") or "").split() and "aria-label" not in a:
            self.out.append(SCROLL_BOX)                    # the template's own scrolling boxes say so too
        else:
            self.out.append(self.get_starttag_text())
        if tag in VOID:
            return
        quiet = tag in NO_LINK or a.get("id") == "glossary" or "data-no-gloss" in a
        self.stack.append((tag, a.get("class") or "", quiet))
        self.quiet += quiet

    def handle_startendtag(self, tag, attrs):
        self.out.append(self.get_starttag_text())

    def handle_endtag(self, tag):
        if any(t == tag for t, _, _ in self.stack):      # close what the tag closes (tolerant of omitted end tags)
            while self.stack:
                t, _, quiet = self.stack.pop()
                self.quiet -= quiet
                if t == tag:
                    break
        self.out.append(f"</{tag}>")
        if tag == "table" and self.tables and self.tables.pop():
            self.out.append("</div>")
        if tag == "section":
            self.seen = set()

    def handle_data(self, data):
        if self.quiet or self.pattern is None or (self.stack and self.stack[-1][0] in ("style", "script")):
            self.out.append(data)
        else:
            self.out.append(self.link(data))

    def handle_entityref(self, name):
        self.out.append(f"&{name};")

    def handle_charref(self, name):
        self.out.append(f"&#{name};")

    def handle_comment(self, data):
        self.out.append(f"<!--{data}-->")

    def handle_decl(self, decl):
        self.out.append(f"<!{decl}>")

    def handle_pi(self, data):
        self.out.append(f"<?{data}>")

    def unknown_decl(self, data):
        self.out.append(f"<![{data}]>")

    def link(self, text: str) -> str:
        parts, pos = [], 0
        for m in self.pattern.finditer(text):
            term = self.terms[int(m.lastgroup[1:])]
            if term.anchor in self.seen:
                continue
            self.seen.add(term.anchor)
            parts += [text[pos:m.start()], f'<a class="gloss" href="#{term.anchor}" title="{escape(term.short())}">'
                                           f'{m.group(0)}</a>']
            pos = m.end()
        parts.append(text[pos:])
        return "".join(parts)


def finish(html: str, terms: tuple[Term, ...] = TERMS) -> str:
    """``html`` with its tables in scrolling boxes and the first occurrence of each of ``terms`` per section linked
    (none with ``terms=()``)."""
    f = _Finisher(terms)
    f.feed(html)
    f.close()
    return "".join(f.out)

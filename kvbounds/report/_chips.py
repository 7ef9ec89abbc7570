"""The colours and tooltips of the report's chips. A statement chip is green only where the statement holds, is not
vacuous and the method is not worse than a standard baseline; a headline is never greener than its statement; a
chip's tooltip is the glossary's first sentence for its value (:mod:`kvbounds.report`)."""
from __future__ import annotations

import dataclasses

from ._words import check_text, check_verdict
from kvbounds.verdict import Verdict


def calls_worse(v: Verdict) -> bool:
    """Is the method worse than a standard baseline anywhere in the verdict's power fields: a power value "worse",
    or a structured call (a dict with ``"call": "worse"``, at any depth of a field)?"""
    check_verdict(v)

    def worse(x, depth=0) -> bool:
        if depth > 6:
            return False
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            x = {f.name: getattr(x, f.name) for f in dataclasses.fields(x)}
        if isinstance(x, dict):
            return x.get("call") == "worse" or any(worse(y, depth + 1) for y in x.values())
        if isinstance(x, (list, tuple)):
            return any(worse(y, depth + 1) for y in x)
        return False
    return v.power == "worse" or any(worse(getattr(v, f.name)) for f in dataclasses.fields(v)
                                     if f.name not in ("findings", "figures", "errata", "reproductions"))


HOLDING = ("holds", "holds-fitted")
UNDECIDED = ("n/a", "not-run", "no-check")


def statement_tone(v: Verdict, value: str, value_tone: str) -> str:
    """The statement chip's colour, given the statement's value and that value's own colour: green only where the
    statement holds (as stated or with a fitted constant), is not vacuous and the method is not worse than a
    standard baseline (:func:`calls_worse`); amber where it holds but is worse; any other value ("vacuous"
    included) is never green."""
    check_verdict(v)
    check_text(value, "value")
    check_text(value_tone, "value_tone")
    if value_tone == "good" and (value not in HOLDING or calls_worse(v)):
        return "warn"
    return value_tone


def card_tone(headline_tone: str, statement_tone: str, value: str) -> str:
    """The headline's colour, never greener than its statement's."""
    for name, text in (("headline_tone", headline_tone), ("statement_tone", statement_tone), ("value", value)):
        check_text(text, name)
    return "warn" if headline_tone == "good" and statement_tone != "good" and value not in UNDECIDED else headline_tone


def define(value: str) -> str:
    """A tooltip: the first sentence of the glossary's definition of ``value``, or ""."""
    from ._glossary import term_for
    t = term_for(str(value))
    return t.short() if t else ""

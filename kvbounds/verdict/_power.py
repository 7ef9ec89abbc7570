"""The ``power`` dimension of a verdict (:mod:`kvbounds.verdict`): negative controls and whether each
check's test rejected them. ``low`` when a control passes the check (or meets a bound too loose to tell it
apart), ``shown`` when every control is rejected. Re-exported by :mod:`kvbounds.verdict`."""
from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

from kvbounds.core import Record
from ._statistics import canonical_order


@dataclasses.dataclass
class Control:
    """A negative control and whether the check's test rejected it."""
    name: str
    rejected: bool
    detail: str = ""


def controls_rejected(records: Iterable[Record]) -> tuple[int, int]:
    ctl = [r for r in records if r.control]
    return sum(not r.holds for r in ctl), len(ctl)


def controls_from_records(records: Iterable[Record], *, rule: str = "all") -> list[Control]:
    """One :class:`Control` per control sub-check: rejected when ``all`` (or ``any``) of its records fail."""
    groups: dict[str, list[Record]] = {}
    for r in canonical_order(records):
        if r.control:
            groups.setdefault(r.check, []).append(r)
    agg = all if rule == "all" else any
    return [Control(name, agg(not r.holds for r in rs), f"{sum(not r.holds for r in rs)}/{len(rs)} records rejected")
            for name, rs in sorted(groups.items())]


def decide_power(controls: Sequence[Control]) -> tuple[str, str]:
    """``low`` if any control passes the check (or meets a bound too loose to tell it apart), ``shown`` if
    every control is rejected, ``n/a`` without controls. Returns (power, detail)."""
    if not controls:
        return "n/a", ""
    passed = [c for c in controls if not c.rejected]
    text = "; ".join(f"{c.name}: {'rejected' if c.rejected else 'NOT rejected'}" + (f" ({c.detail})" if c.detail else "")
                     for c in controls)
    return ("low" if passed else "shown"), text

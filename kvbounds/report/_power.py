"""The report's first table (does each method beat the field's baselines at equal memory?) and the glance counts
that read the battery's calls (:mod:`kvbounds.battery`, stored in each verdict's ``power_calls``).

The first table: one row per (claim, family), grouped by claim (its algorithm and variant named), with the unit of
replication (independent streams, layers of one text, layers of one generation) and the memory (% of the stream's
floats), and three cells: the call against StreamingLLM, against the ablation, and against doing nothing (the
stronger of zeros and the mean there). A cell's text is short ("better 0.83"); its title holds the full words
(ratio, 95% interval, wins, smallest detectable ratio). A control a claim has no call against is one grey "-".
"""
from __future__ import annotations

import math
from typing import Sequence

from kvbounds.verdict import DOING_NOTHING
from kvbounds.verdict import call_words, fmt, headline_calls, versus_doing_nothing

COLUMNS = ("StreamingLLM", "ablation", "doing nothing")
TONES = {"better": "good", "leaning better": "good", "tied": "warn", "leaning worse": "bad", "worse": "bad",
         "not attainable": "none", "not tested": "none"}


def _cell(c: dict | None) -> dict:
    if c is None:
        return dict(text="-", tone="none", title="no such control for this claim")
    text = c["call"] + (f" {fmt(c['effect'])}" if c["call"] not in ("not tested", "not attainable") else "")
    title = call_words(c, family=False)
    if c["call"] not in ("not tested", "not attainable") and not math.isnan(c.get("detectable", math.nan)):
        title += f"; smallest detectable ratio at n = {c['n']}: beyond {fmt(c['detectable'])} either way"
    return dict(text=text, tone=TONES[c["call"]], title=title)


def _unit(v, family: str) -> str:
    units = {c.get("unit") for c in getattr(v, "power_table", []) or [] if c.get("setting") == family}
    units.discard(None)
    return units.pop() if units else "independent streams"


def first_table(verdicts: dict) -> dict | None:
    """The first table's data: ``columns`` and ``claims``, each {claim, algorithm, rows}, a row {family, unit,
    n, fraction, cells (3)}; None when no verdict has calls."""
    from kvbounds.claims import CLAIMS
    claims = []
    for cid, v in verdicts.items():
        calls = headline_calls(getattr(v, "power_calls", None) or [])     # the practitioner's metric where present
        if not calls:
            continue
        groups: dict[str, dict[str, list[dict]]] = {}   # a setting "family | variant": one group per variant
        for c in calls:
            fam, _, variant = c["family"].partition(" | ")
            groups.setdefault(variant, {}).setdefault(fam, []).append(c)
        name = CLAIMS[cid].algorithm if cid in CLAIMS and CLAIMS[cid].algorithm else cid
        for variant, fams in groups.items():
            rows = []
            for fam, cs in fams.items():
                by = {c["control"]: c for c in cs}
                n = max((c["n"] for c in cs), default=0)
                frac = next((c["fraction"] for c in cs if not math.isnan(c.get("fraction", math.nan))), math.nan)
                unit = next((c["unit"] for c in cs if c.get("unit")), None) or _unit(v, cs[0]["family"])
                rows.append(dict(family=fam, unit=unit, n=n, fraction="" if math.isnan(frac) else f"{100 * frac:.0f}%",
                                 cells=[_cell(by.get("streaming_llm")), _cell(by.get("ablation")),
                                        _cell(versus_doing_nothing(cs))]))
            claims.append(dict(claim=cid, algorithm=f"{name}: {variant}" if variant else name, rows=rows))
    return dict(columns=COLUMNS, claims=claims) if claims else None


def _status(calls: Sequence[dict], controls: Sequence[str]) -> set[str]:
    return {c["call"] for c in calls if c["control"] in controls and c["call"] != "not tested"}


def nothing_label(v) -> str:
    """The glance category's suffix from the calls against doing nothing (zeros, the mean): ", worse than doing
    nothing" when any is worse, ", not shown better than doing nothing" when none is worse but not all are better,
    "" when all are better or none was tested. Verdicts without calls (older records): their power note, as before."""
    calls = headline_calls(getattr(v, "power_calls", None) or [])
    if not calls:
        return ", no better than doing nothing" if getattr(v, "power_note", "") else ""
    st = _status(calls, DOING_NOTHING)
    if "worse" in st:
        return ", worse than doing nothing"
    if st and st != {"better"}:
        return ", not shown better than doing nothing"
    return ""


def power_glance(verdicts: dict) -> list[tuple[str, int, str]]:
    """The glance counts from the calls: of the claims tested against StreamingLLM, how many are better than it
    somewhere, worse somewhere, neither (tied, leaning or not attainable everywhere); and how many are worse than doing nothing
    somewhere. (label, count, tone) like :func:`kvbounds.report.at_a_glance`'s."""
    with_calls = {cid: headline_calls(v.power_calls) for cid, v in verdicts.items() if getattr(v, "power_calls", None)}
    sl = {cid: _status(cs, ("streaming_llm",)) for cid, cs in with_calls.items()}
    sl = {cid: s for cid, s in sl.items() if s}
    if not with_calls:
        return []
    out = []
    if sl:
        n = len(sl)
        out += [(f"of {n} claims tested against StreamingLLM: better somewhere", sum("better" in s for s in sl.values()),
                 "good"),
                ("worse than StreamingLLM somewhere", sum("worse" in s for s in sl.values()), "bad"),
                ("neither shown against StreamingLLM (tied, leaning or not attainable)",
                 sum(not ({"better", "worse"} & s) for s in sl.values()), "warn")]
    out.append(("worse than doing nothing somewhere",
                sum("worse" in _status(cs, DOING_NOTHING) for cs in with_calls.values()), "bad"))
    return out

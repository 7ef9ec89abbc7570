"""The verdict's dimensions as the report shows them (:func:`dimensions`), and the first screen's counts: each claim in one category (its statement, or for an empirical claim its
reproduction), then the cross-cutting counts (errata, rates not reached, low power, the battery's calls), which
overlap: a claim can count in several. Re-exported by :mod:`kvbounds.report`."""
from __future__ import annotations

from collections import Counter

from ._words import check_verdict, check_verdicts
from kvbounds.verdict import FAILS, HOLDS, HOLDS_FITTED, INCONCLUSIVE, NO_CHECK, NOT_REFUTED, NOT_RUN, VACUOUS, Verdict

DIMENSIONS = ("statement", "proof", "rate", "reproduction", "power")
# legacy single status -> the statement dimension
LEGACY_STATEMENT = {HOLDS: "holds", HOLDS_FITTED: "holds-fitted", FAILS: "fails", INCONCLUSIVE: "inconclusive",
                    NO_CHECK: "no-check", NOT_RUN: "not-run", NOT_REFUTED: "not-refuted", VACUOUS: "vacuous"}


def dimensions(v: Verdict) -> dict[str, str]:
    """The verdict's dimensions; a verdict without them shows its legacy status as the statement."""
    check_verdict(v)
    d = {k: getattr(v, k) or "n/a" for k in DIMENSIONS}
    if not v.statement:
        d["statement"] = LEGACY_STATEMENT.get(v.status, v.status)
    return d

GLANCE_LABELS = {"false": "false as stated", "holds": "hold as stated", "holds-fitted": "hold with a fitted constant",
                 "vacuous": "vacuous at these norms or at any norm (doing nothing meets the bound)",
                 "not-refuted": "not refuted (not refutable by sampling)", "inconclusive": "inconclusive",
                 "not-run": "not run", "no-check": "no check", "reproduced": "empirical: reproduced",
                 "partial": "empirical: partly reproduced", "not-reproduced": "empirical: not reproduced",
                 "not-shown": "empirical: not shown (underpowered)", "reversed": "empirical: reversed"}


def glance_category(v: Verdict) -> str:
    """The first screen's category: the statement dimension, or for an empirical claim its reproduction; a hold
    or a reproduction that a trivial estimator matches says so ("hold as stated, no better than doing nothing")."""
    d = dimensions(v)
    key = d["reproduction"] if v.kind == "empirical" and d["reproduction"] != "n/a" else d["statement"]
    label = GLANCE_LABELS.get(key, key)
    if key in ("holds", "holds-fitted", "reproduced", "partial"):
        from ._power import nothing_label
        label += nothing_label(v)
    return label


def at_a_glance(verdicts: dict[str, Verdict]) -> list[tuple]:
    """Counts by category (statement, or reproduction for empirical claims), then the cross-cutting dimensions."""
    check_verdicts(verdicts)
    tones = {"false as stated": "bad", "empirical: not reproduced": "bad", "empirical: reversed": "bad",
             "hold as stated": "good", "hold with a fitted constant": "good", "empirical: reproduced": "good"}
    cnt = Counter(glance_category(v) for v in verdicts.values())
    order = {"bad": 0, "warn": 1, "good": 2, "none": 3}
    out = sorted(((h, n, tones.get(h, "warn")) for h, n in cnt.items()), key=lambda t: (order[t[2]], -t[1], t[0]))
    extra = [("with errata in a proof step", sum(dimensions(v)["proof"] == "errata" for v in verdicts.values())),
             ("with a stated rate false past its onset", sum(dimensions(v)["rate"] == "false" for v in verdicts.values())),
             ("with a stated rate not reached", sum(dimensions(v)["rate"] == "not-reached" for v in verdicts.values())),
             ("with low power", sum(dimensions(v)["power"] == "low" for v in verdicts.values()))]
    from ._power import power_glance
    return out + [(h, n, "none") for h, n in extra if n] + [(h, n, "none") for h, n, _ in power_glance(verdicts)]


def glance_split(verdicts: dict[str, Verdict]) -> tuple[list[tuple], list[tuple]]:
    """(partition, overlapping): :func:`at_a_glance`'s counts split into the categories that partition the claims
    (each claim counted once) and the cross-cutting ones (a claim can count in several, or in none)."""
    counts = at_a_glance(verdicts)
    k = len({glance_category(v) for v in verdicts.values()})
    return counts[:k], counts[k:]

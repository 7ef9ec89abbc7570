"""The words of the one rule's calls (:func:`kvbounds.verdict.paired_calls`): one call ("worse than StreamingLLM (real SmolLM2:
1.16 [1.04, 1.30], 9/30 wins)"), a claim's headline over its calls, and the call against doing nothing. Every
phrase is symmetric: "leaning better" and "leaning worse" are the same rule in its two directions."""
from __future__ import annotations

import math
from typing import Sequence

from ._calls import ALPHA, DOING_NOTHING, control_order, label

# a headline's order: the calls a reader must not miss first
RANK = {"worse": 0, "leaning worse": 1, "not attainable": 2, "tied": 3, "leaning better": 4, "better": 5}
SHORT_METRIC = {"practitioner": "practitioner's metric", "theorem": "theorem's metric"}


def fmt(x: float) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else "inf" if math.isinf(x) else \
        "-inf" if x == -math.inf else f"{x:.3g}"


def _effect(c: dict, x: float) -> str:
    return f"{x:+.3g}" if c.get("scale") == "difference" and math.isfinite(x) else fmt(x)


def numbers(c: dict, family: bool = True) -> str:
    """"real SmolLM2: 1.16 [1.04, 1.30], 9/30 wins" of a call dict (a difference is signed: "+0.12 [...]")."""
    where = f"{c['family']}: " if family else ""
    if c["call"] == "not tested":
        return where + (c.get("reason") or "not tested")
    lo, hi = c["ci"]
    out = f"{where}{_effect(c, c['effect'])} [{_effect(c, lo)}, {_effect(c, hi)}], {c['wins']}/{c['n']} wins"
    elo, ehi = c.get("equivalence_ci") or (lo, hi)
    if c["call"] == "tied" and c.get("equivalent") and (elo, ehi) != (lo, hi):
        out += f", equivalence judged on [{_effect(c, elo)}, {_effect(c, ehi)}]"    # bounded scores: widened
    return out


def head_words(c: dict) -> str:
    """The call's head: "better than StreamingLLM", "leaning worse than uniform", "tied with the ablation" (the
    interval within the practical threshold) or "not told apart from the ablation" (a tie that is no equivalence),
    "not attainable against zeros with 8 units (smallest p = 0.156)", "not tested against the mean"."""
    name = label(c["control"])
    call = c["call"]
    if call in ("better", "worse", "leaning better", "leaning worse"):
        return f"{call} than {name}"
    if call == "tied":              # equivalent: the whole interval within the threshold; else no difference shown
        return f"tied with {name}" if c.get("equivalent") else f"not told apart from {name}"
    if call == "not attainable":
        n = c["n"]
        return f"not attainable against {name} with {n} unit{'' if n == 1 else 's'} (smallest p = " \
               f"{c.get('smallest_p', 1.0):.2g})"
    return f"not tested against {name}"


def call_words(c: dict, family: bool = True, metric: bool = False) -> str:
    """The words of one call: its head and its numbers in brackets (``metric``: its metric named first)."""
    m = SHORT_METRIC.get(c.get("metric") or "", c.get("metric") or "") if metric else ""
    return f"{head_words(c)} ({m + '; ' if m else ''}{numbers(c, family)})"


def metric_prefix(calls: Sequence[dict]) -> str:
    """"practitioner's metric: " when the calls share one named metric, "" otherwise."""
    ms = {c.get("metric") or "" for c in calls}
    if len(ms) != 1:
        return ""
    m = ms.pop()
    return f"{SHORT_METRIC.get(m, m)}: " if m else ""


def summary_words(calls: Sequence[dict], most: int = 3) -> str:
    """The headline's words for a claim's calls (its metric named first when they share one): "better than every
    control" when every tested call is better; else one clause per (call, control), worse first (:data:`RANK`),
    each with its first family's numbers and how many more families share it; at most ``most`` clauses (then "+k
    more"). "" without a tested call."""
    tested = [c for c in calls if c["call"] != "not tested"]
    if not tested:
        return ""
    prefix = metric_prefix(tested)
    if all(c["call"] == "better" for c in tested):
        return prefix + "better than every control"
    groups: dict[tuple, list[dict]] = {}
    for c in tested:
        groups.setdefault((c["call"], c["control"]), []).append(c)
    clauses = []
    for (call, ctl), cs in sorted(groups.items(), key=lambda kv: (RANK.get(kv[0][0], 9), control_order(kv[0][1]))):
        first = sorted(cs, key=lambda c: (-_size(c), c["family"]))[0]
        more = f"; +{len(cs) - 1} more famil{'y' if len(cs) == 2 else 'ies'}" if len(cs) > 1 else ""
        clauses.append(call_words(first)[:-1] + more + ")")
    out = "; ".join(clauses[:most])
    return prefix + out + (f"; +{len(clauses) - most} more" if len(clauses) > most else "")


def _size(c: dict) -> float:
    x = c.get("effect", math.nan)
    if not isinstance(x, (int, float)) or math.isnan(x):
        return 0.0
    if c.get("scale") == "difference":
        return abs(x)
    return abs(math.log(x)) if x > 0 else 0.0


def versus_doing_nothing(calls: Sequence[dict]) -> dict | None:
    """Of a family's calls against zeros and the mean (doing nothing), the one against the stronger control (the
    larger method / control effect); None when neither ran."""
    cs = [c for c in calls if c["control"] in DOING_NOTHING and c["call"] != "not tested"]
    if not cs:
        cs = [c for c in calls if c["control"] in DOING_NOTHING]
        return cs[0] if cs else None
    return max(cs, key=lambda c: (c["effect"], c["control"]))


def holm_family_words(calls: Sequence[dict], alpha: float = ALPHA) -> str:
    """The rule's one-line statement for a family of calls: "two-sided signed-rank tests on the log-ratios at the
    unit (distinct text windows), Holm over 12 at 0.05; negligible: a ratio within 1.05 either way"."""
    tested = [c for c in calls if c["call"] != "not tested"]
    if not tested:
        return "no comparison tested"
    units = sorted({x["unit"] for x in tested})
    scales = sorted({x.get("scale", "ratio") for x in tested})
    on = " and ".join({"ratio": "the log-ratios (errors)", "difference": "the differences (scores)"}[s]
                      for s in scales) if len(scales) > 1 else \
        {"ratio": "the log-ratios", "difference": "the differences"}[scales[0]]
    neg = "; ".join(sorted({f"a ratio within {c['threshold']:g} either way" if c.get("scale", "ratio") == "ratio"
                            else f"a difference within {c['threshold']:g}" for c in tested}))
    return (f"two-sided signed-rank tests on {on} at the unit ({', '.join(units)}), Holm over {tested[0]['tests']} "
            f"at {alpha:g}; negligible: {neg}")


def headline_calls(calls: Sequence[dict]) -> list[dict]:
    """The calls a headline, a per-paper answer or the practitioner's table states: those on the practitioner's
    metric where the claim has them (the mean error a user of the cache sees), else every call (each naming its own
    metric, the theorem's where that is all there is)."""
    mine = [c for c in calls if c.get("metric") == "practitioner"]
    return mine or list(calls)

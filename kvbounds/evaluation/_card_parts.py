"""What the evaluation card shows besides the calls table: each family's error levels (the method's and every
control's, with intervals), the call's words made to agree with the interval printed beside them, the verdict in
one sentence, and a plot of error vs memory per family (inline SVG: no plotting package needed).

Levels: per (family, memory fraction), the median over streams (the unit: an independent stream) of the relative
attention error over held-out queries, with the distribution-free 95% interval of the median (order statistics of
the binomial(n, 1/2)); the same for each control on the same streams.

The call beside an interval (:func:`card_call`): the one rule's own word (:func:`kvbounds.verdict.paired_calls`),
whose Hodges-Lehmann interval is the one printed beside it; the rule makes them agree ("better" / "worse" only where
the interval excludes no effect and the Holm-adjusted test rejects; "leaning" where the interval excludes it and the
adjusted test does not), so the card never re-words a call.
"""
from __future__ import annotations

import html
import math

import numpy as np

__all__ = ["levels", "card_call", "verdict_sentence", "order_families", "error_plot", "WORDS"]

# the card's words and their tones (symmetric: better / leaning better / tied / leaning worse / worse)
WORDS = {"better": "good", "leaning better": "good", "tied": "none", "leaning worse": "warn", "worse": "bad",
         "not attainable": "none", "not tested": "none"}


def median_interval(x) -> tuple[float, float, float]:
    """(median, lower, upper) of ``x`` with the distribution-free 95% interval of the median (NaN below 6
    values: no such interval holds 95%)."""
    from scipy import stats
    x = np.sort(np.asarray([v for v in x if v is not None and math.isfinite(v)], float))
    n = len(x)
    if n == 0:
        return (math.nan, math.nan, math.nan)
    med = float(np.median(x))
    j = int(stats.binom.ppf(0.025, n, 0.5))       # x[j - 1] .. x[n - j] covers the median with >= 95%
    if j < 1:
        return (med, math.nan, math.nan)
    return (med, float(x[j - 1]), float(x[n - j]))


def levels(records) -> dict:
    """{family: {fraction: {"method" | control: (median, lo, hi, n)}}} over the records' streams (module
    docstring); records not tested there (the method holds the whole stream) or without a measurement left out."""
    acc: dict = {}
    for r in records:
        e = r.extra or {}
        if e.get("not_tested") or e.get("missing") or not math.isfinite(r.measured):
            continue
        cell = acc.setdefault(e["family"], {}).setdefault(float(e["fraction"]), {})
        cell.setdefault("method", []).append(float(r.measured))
        for name, v in (e.get("controls") or {}).items():
            cell.setdefault(name, []).append(float(v))
    return {fam: {f: {k: (*median_interval(v), len(v)) for k, v in cell.items()} for f, cell in sorted(fs.items())}
            for fam, fs in acc.items()}


def card_call(c: dict) -> str:
    """The word the card prints for the call ``c``: the one rule's own (module docstring)."""
    return c["call"]


def order_families(families) -> list[str]:
    """The real-key families first (what a user's model meets), then the synthetic ones, each in the given order."""
    from kvbounds.streams import REAL
    fams = list(families)
    return [f for f in fams if f in REAL] + [f for f in fams if f not in REAL]


def verdict_sentence(name: str, calls: list[dict], fraction: float, families) -> str:
    """One sentence: at the headline memory, per kind of family (real keys first), what the method is against
    every control (better than every control / worse than one / mixed, with the words' counts)."""
    from kvbounds.verdict import label
    from kvbounds.streams import REAL
    head = [dict(c, word=card_call(c)) for c in calls if c["fraction"] == fraction and c["call"] != "not tested"]
    if not head:
        return f"{name}: nothing tested at {100 * fraction:.0f}% of the cache's floats."
    parts = []
    for kind, fams in (("real keys", [f for f in families if f in REAL]),
                       ("synthetic streams", [f for f in families if f not in REAL])):
        cs = [c for c in head if c["family"] in fams]
        if not cs:
            continue
        words = [c["word"] for c in cs]
        if all(w == "better" for w in words):
            parts.append(f"better than every control on {kind} ({', '.join(fams)})")
            continue
        by_family: dict = {}
        for c in cs:
            if c["word"] == "worse":
                by_family.setdefault(c["family"], []).append(label(c["control"]))
        both = lambda xs: xs[0] if len(xs) == 1 else f"{', '.join(xs[:-1])} and {xs[-1]}"
        worse = [f"{both(ctl)} on {fam}" for fam, ctl in sorted(by_family.items(), key=lambda kv: -len(kv[1]))]
        counts = ", ".join(f"{words.count(w)} {w}" for w in WORDS if words.count(w))
        parts.append(f"on {kind}: {counts} of {len(cs)} calls"
                     + (f" (worse than {'; '.join(worse[:3])}{'; ...' if len(worse) > 3 else ''})" if worse else ""))
    return f"At {100 * fraction:.0f}% of the cache's floats, {name} is " + "; ".join(parts) + "."


_COLOURS = ("#1f4e9a", "#c0392b", "#7d8c2a", "#8e44ad", "#d68910", "#17a589", "#555555")


def error_plot(family: str, cells: dict, controls: list[str], width: int = 300, height: int = 190) -> str:
    """An inline SVG: median error (log scale) vs memory fraction for the method (thick) and each control, with
    the medians' 95% intervals as bars. ``cells``: :func:`levels`' {fraction: {name: (median, lo, hi, n)}}."""
    from kvbounds.verdict import label
    names = ["method"] + [c for c in controls if any(c in cell for cell in cells.values())]
    fr = sorted(cells)
    vals = [v for cell in cells.values() for k, t in cell.items() if k in names for v in t[:3]
            if math.isfinite(v) and v > 0]
    if not fr or not vals:
        return ""
    lo, hi = math.log10(min(vals)), math.log10(max(vals))
    lo, hi = (lo - 0.5, hi + 0.5) if hi - lo < 1e-9 else (lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))
    L, R, T, B = 44, 8, 18, 30
    x = (lambda f: L + (width - L - R) * (fr.index(f) + 0.5) / len(fr))
    y = (lambda v: T + (height - T - B) * (hi - math.log10(v)) / (hi - lo))
    out = [f'<svg class="plot" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
           f'aria-label="{html.escape(family)}: error vs memory"><title>{html.escape(family)}</title>',
           f'<text x="{L}" y="12" font-size="11">{html.escape(family)}</text>',
           f'<line x1="{L}" y1="{height - B}" x2="{width - R}" y2="{height - B}" stroke="#999"/>',
           f'<line x1="{L}" y1="{T}" x2="{L}" y2="{height - B}" stroke="#999"/>']
    for e in range(math.ceil(lo), math.floor(hi) + 1):
        out.append(f'<text x="{L - 4}" y="{y(10.0 ** e) + 3:.1f}" font-size="9" text-anchor="end">1e{e}</text>')
    for f in fr:
        out.append(f'<text x="{x(f):.1f}" y="{height - B + 12}" font-size="9" text-anchor="middle">{100 * f:.0f}%'
                   f'</text>')
    out.append(f'<text x="{(L + width - R) / 2}" y="{height - 4}" font-size="9" text-anchor="middle">memory (share '
               f'of the cache\'s floats)</text>')
    for i, name in enumerate(names):
        col = _COLOURS[i % len(_COLOURS)]
        pts = [(f, cells[f][name]) for f in fr if name in cells[f] and math.isfinite(cells[f][name][0])
               and cells[f][name][0] > 0]
        if not pts:
            continue
        path = " ".join(f"{x(f):.1f},{y(t[0]):.1f}" for f, t in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{col}" stroke-width="{3 if i == 0 else 1.2}">'
                   f'<title>{html.escape("the method" if name == "method" else label(name))}</title></polyline>')
        for f, (m, a, b, _) in pts:
            if math.isfinite(a) and math.isfinite(b) and a > 0:
                out.append(f'<line x1="{x(f):.1f}" y1="{y(a):.1f}" x2="{x(f):.1f}" y2="{y(b):.1f}" stroke="{col}"/>')
    words = ["method" if n == "method" else label(n) for n in names]
    legend = "".join(f'<tspan fill="{_COLOURS[i % len(_COLOURS)]}">■ {html.escape(w)}  </tspan>'
                     for i, w in enumerate(words))
    out.append(f'<text x="{L + 2}" y="{T + 8}" font-size="8">{legend}</text></svg>')
    return "".join(out)

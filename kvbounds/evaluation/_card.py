"""``kvbounds evaluate``'s outputs: ``evaluation.json`` and ``evaluation.html``, a card in the report's style (the
report template's own stylesheet, read from it, so the card looks like a claim's card in report.html).

Both are written atomically (:func:`kvbounds.core.write_output`), never onto a file the result store owns.
"""
from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path

__all__ = ["write_outputs", "render_card", "report_style", "tone_of", "JSON_FILE", "CARD_FILE"]

JSON_FILE = "evaluation.json"
CARD_FILE = "evaluation.html"

TONES = {"better": "good", "leaning better": "good", "tied": "none", "leaning worse": "bad", "worse": "bad",
         "not attainable": "warn", "not tested": "none"}


# the one rule (kvbounds.verdict), as the card states it
CALLS_WORDS = ("better / leaning better / tied / leaning worse / worse / not attainable / not tested per (family, "
               "memory, control): the effect method / control (Hodges-Lehmann) [95% interval] and the streams won "
               "(the one rule of kvbounds.verdict: a two-sided signed-rank test on the log-ratios at the unit, "
               "Holm over each memory's pairs; leaning: significant before Holm, not after; tied: no difference "
               "shown, or one within 5%).")


def _version() -> str:
    """The installed kvbounds' version (read from its metadata: this module must not import the package's root,
    which imports evaluation lazily)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("kvbounds")
    except PackageNotFoundError:
        return "unknown"


def report_style() -> str:
    """The ``<style>`` block of the report's template (templates/report.html.j2)."""
    text = (Path(__file__).parents[1] / "report" / "templates" / "report.html.j2").read_text(encoding="utf-8")
    m = re.search(r"<style>.*?</style>", text, re.S)
    return m.group(0) if m else ""


def tone_of(calls: list[dict]) -> str:
    """good: every tested call better; bad: one worse; warn: otherwise; none: nothing tested."""
    tested = [c for c in calls if c["call"] != "not tested"]
    if not tested:
        return "none"
    if all(c["call"] == "better" for c in tested):
        return "good"
    return "bad" if any(c["call"] == "worse" for c in tested) else "warn"


def _num(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return "inf" if isinstance(x, float) and math.isinf(x) else f"{x:.3g}"


def _cell(c: dict) -> str:
    if c["call"] == "not tested":
        return f'<span class="chip none" title="{html.escape(c.get("reason", ""))}">not tested</span>'
    lo, hi = c["ci"]
    title = (f"{c['wins']}/{c['n']} streams won; smallest detectable ratio beyond {_num(c.get('detectable'))} either "
             f"way; Holm-adjusted p {_num(c.get('p'))} (smallest attainable {_num(c.get('smallest_p'))})")
    return (f'<span class="chip {TONES[c["call"]]}" title="{html.escape(title)}">{c["call"]}</span> '
            f'{_num(c["effect"])} <span class="note">[{_num(lo)}, {_num(hi)}] {c["wins"]}/{c["n"]}</span>')


def _calls_table(calls: list[dict], controls: list[str]) -> str:
    from kvbounds.verdict import label
    rows = {}
    for c in calls:
        rows.setdefault((c["family"], c["fraction"]), {})[c["control"]] = c
    head = "".join(f"<th>{html.escape(label(n))}</th>" for n in controls)
    body = []
    for (fam, f), cs in rows.items():
        cells = "".join(f"<td class='v'>{_cell(cs[n]) if n in cs else '-'}</td>" for n in controls)
        body.append(f"<tr><td>{html.escape(fam)}</td><td>{100 * f:.0f}%</td>{cells}</tr>")
    return (f'<div class="scroll"><table class="matrix"><thead><tr><th>family</th><th>memory</th>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def _e2e_block(e2e: dict) -> str:
    if not e2e:
        return ""
    if e2e.get("skipped"):
        return f"<dt>end to end</dt><dd class='note'>{html.escape(e2e['skipped'])}</dd>"
    rows = "".join(
        f"<tr><td>{html.escape(r['title'])}</td><td>{r['rank']}</td><td>{html.escape(r['method'])}</td>"
        f"<td>{html.escape(r['text'])} <span class='note'>{html.escape(r.get('ci', ''))}</span></td>"
        f"<td>{html.escape(r.get('mark', ''))}</td></tr>" for r in e2e.get("rows", []))
    return (f"<dt>end to end</dt><dd>{html.escape(e2e.get('setup', ''))}<div class='scroll'><table class='matrix'>"
            f"<thead><tr><th>task</th><th>#</th><th>method</th><th>value [95% CI]</th><th></th></tr></thead>"
            f"<tbody>{rows}</tbody></table></div></dd>")


def render_card(result: dict) -> str:
    """evaluation.html for evaluation.json's content ``result``."""
    from kvbounds.verdict import label
    __version__ = _version()
    calls = result["calls"]
    head = [c for c in calls if c["fraction"] == result["fraction"]]
    tone = tone_of(head)
    controls = result["battery"]
    fams = "".join(
        f'<span class="chip {tone_of([c for c in head if c["family"] == f])}">{html.escape(f)}: '
        f'{html.escape(result["regime"][f]["text"])}</span>' for f in result["families"])
    decode = result.get("decode") or {}
    dec = ""
    if decode:
        dec = (f"<dt>decode</dt><dd>{html.escape(decode.get('setup', ''))}"
               + (_calls_table(decode["calls"], controls) if decode.get("calls") else
                  f"<div class='note'>{html.escape(decode.get('skipped', ''))}</div>") + "</dd>")
    missing = "".join(f"<div class='note'>not run: {html.escape(m)}</div>" for m in result.get("not_run", []))
    t = result.get("time", {})
    name, headline = html.escape(result["method"]), html.escape(result["headline"])
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>kvbounds evaluate: {name}</title>
{report_style()}
</head><body>
<h1>kvbounds evaluate: {name}</h1>
<div class="meta">kvbounds {__version__} · profile <b>{html.escape(result['profile'])}</b> · seed {result['seed']} ·
{result['streams']} streams · compression ratio {result['ratio']:g} (headline: {100 * result['fraction']:.0f}% of the
cache's floats)</div>
<section class="card t-{tone}">
<div class="card-head"><h3>{name}</h3><span class="chip big {tone}">{headline}</span>
<span class="kind">{html.escape(result['kind'])} · {html.escape(result['spec'])}</span></div>
<div class="statement">Does {name} beat doing nothing and the field's baselines at equal memory?
The battery: {html.escape(', '.join(label(c) for c in controls))}, each given the floats the method's cache holds (keys, values and
weights counted alike). Metric: {html.escape(result['metric'])}.</div>
<dl class="dl">
<dt>method</dt><dd>{html.escape(result['label'])}</dd>
<dt>regime</dt><dd class="dims">{fams}</dd>
<dt>calls</dt><dd>{html.escape(CALLS_WORDS)}{_calls_table(calls, controls)}{missing}</dd>
{dec}{_e2e_block(result.get('e2e') or {})}
<dt>run</dt><dd>wall {t.get('wall_s', '-')} s; stream trials {_num(t.get('trials_cpu_s'))} CPU s on
{t.get('workers', '-')} worker(s)</dd>
</dl>
<div class="paths">records: <code>results.jsonl</code> · summary: <code>evaluation.json</code></div>
</section></body></html>
"""


def write_outputs(out, result: dict) -> tuple[Path, Path]:
    """evaluation.json and evaluation.html in ``out``, each atomically."""
    from kvbounds.core import write_output
    from kvbounds.core import jsonable
    j = write_output(Path(out) / JSON_FILE, json.dumps(jsonable(result), indent=1, sort_keys=True) + "\n",
                     stores=[out])
    h = write_output(Path(out) / CARD_FILE, render_card(result), stores=[out])
    return j, h

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
from kvbounds.core import write_output
from kvbounds.core import jsonable

from ._card_parts import WORDS as WORD_TONES

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
    if not e2e or not (e2e.get("rows") or e2e.get("skipped")):
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


def _level(t) -> str:
    if not t:
        return "-"
    return f"{_num(t['median'])} <span class='note'>[{_num(t['lo'])}, {_num(t['hi'])}]</span>"


def _family_block(result: dict, fam: str, controls: list[str]) -> str:
    """One family: its one line, a table per memory of the method's error level beside each control's with the
    call and its interval, and the plot of error vs memory."""
    from kvbounds.verdict import label
    from kvbounds.streams import FAMILY_WORDS
    from ._card_parts import card_call, error_plot
    lv: dict = {}
    for x in result.get("levels", []):
        if x["family"] == fam:
            lv.setdefault(x["fraction"], {})[x["name"]] = x
    calls = {(c["fraction"], c["control"]): c for c in result["calls"] if c["family"] == fam}
    # the field's baselines (and the ablation) first, then doing nothing
    shown = sorted((n for n in controls if any(n in cell for cell in lv.values())),
                   key=lambda n: (n not in ("streaming_llm", "uniform", "ablation"), controls.index(n)))
    head = "".join(f"<th>{html.escape(label(n))}</th>" for n in shown)
    body = []
    for f in result["fractions"]:
        cell = lv.get(f, {})
        tds = []
        for n in shown:
            c = calls.get((f, n))
            call = ""
            if c is not None:
                word = card_call(c)
                lo, hi = c["ci"]
                call = (f'<br><span class="chip {WORD_TONES.get(word, "none")}" title="{html.escape(_title(c))}">'
                        f'{word}</span>' + ("" if c["call"] == "not tested" else
                                            f' <span class="note">ratio {_num(c["effect"])} [{_num(lo)}, '
                                            f'{_num(hi)}], {c["wins"]}/{c["n"]}</span>'))
            tds.append(f"<td class='v'>{_level(cell.get(n))}{call}</td>")
        n_streams = (cell.get("method") or {}).get("n", 0)
        body.append(f"<tr><td>{100 * f:.0f}%</td><td class='v'><b>{_level(cell.get('method'))}</b> "
                    f"<span class='note'>{n_streams} streams</span></td>{''.join(tds)}</tr>")
    plot = error_plot(fam, {f: {k: (x["median"], x["lo"], x["hi"], x["n"]) for k, x in cell.items()}
                            for f, cell in lv.items()}, controls)
    size = result.get("stream_sizes", {}).get(fam)
    size_words = (f" {size['streams']} streams of {size['n']} context tokens + {size['queries']} held-out queries, "
                  f"d = {size['d']}." if size else "")
    return (f"<h4>{html.escape(fam)}: {html.escape(result['regime'].get(fam, {}).get('text', ''))}</h4>"
            f"<div class='note'>{html.escape(FAMILY_WORDS.get(fam, ''))}.{html.escape(size_words)}</div>"
            f"<div class='scroll'><table class='matrix'><thead><tr><th>memory</th><th>the method: error "
            f"[95% CI]</th>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>{plot}")


def _title(c: dict) -> str:
    if c["call"] == "not tested":
        return c.get("reason", "")
    return (f"the battery's call: {c['call']} (Holm-adjusted p {_num(c.get('p'))}); smallest detectable ratio "
            f"{_num(c.get('detectable_ratio'))}")


def _curves_block(cv: dict) -> str:
    """The RULER-style curves (kvbounds.evaluation._e2e_curves): exact attention's scores, score vs ratio per press
    with the floats each holds, the calls, time per press, the depth sweep."""
    if not cv:
        return ""
    if cv.get("skipped"):
        return f"<dt>RULER-style tasks</dt><dd class='note'>{html.escape(cv['skipped'])}</dd>"
    ex = "".join(f"<tr><td>{html.escape(s['task'])}</td><td>{s['n']}</td><td>{html.escape(s['words'])}</td></tr>"
                 for s in cv.get("exact", []))
    powered = {(s["task"], s["n"]) for s in cv.get("exact", []) if s["powered"]}
    ratios = sorted({round(1 - p["budget"], 6) for p in cv.get("points", [])})
    rows = {}
    for p in cv.get("points", []):
        rows.setdefault((p["task"], p["n"], p["method"]), {})[round(1 - p["budget"], 6)] = p
    body = []
    for (task, n, m), ps in sorted(rows.items()):
        cells = "".join(
            f"<td class='v'>{_num(ps[r]['value'])} <span class='note'>[{_num(ps[r]['ci'][0])}, {_num(ps[r]['ci'][1])}]"
            f" · {100 * ps[r]['memory']:.3g}% floats</span></td>" if r in ps else "<td>-</td>" for r in ratios)
        body.append(f"<tr><td>{html.escape(task)}{'' if (task, n) in powered else ' (no power)'}</td>"
                    f"<td>{html.escape(m)}</td>{cells}</tr>")
    head = "".join(f"<th>ratio {r:g}</th>" for r in ratios)
    calls = "".join(f"<li>{html.escape(c['task'])} at ratio {c['ratio']:g}: {c['call']} vs "
                    f"{html.escape(c['baseline'])} "
                    f"({_num(c['mean'])} [{_num(c['ci'][0])}, {_num(c['ci'][1])}] exact match, {c['n']} instances of {c['length']} tokens, "
                    f"Holm over {c['tests']})</li>" for c in cv.get("calls", []))
    timing = "".join(f"<tr><td>{html.escape(m)}</td><td>{t['compress_s']:.3g}</td><td>{t['score_s']:.3g}</td>"
                     f"<td>{t['records']}</td></tr>" for m, t in cv.get("timing", {}).items())
    pre = "; ".join(f"n = {t['n']}: {t['seconds']:.3g} CPU s per instance, prefill {100 * t['prefill_share']:.0f}%"
                    for t in cv.get("prefill", []))
    sweep = "".join(f"<tr><td>{html.escape(p['method'])}</td><td>{p['n']}</td><td>{p['depth']:g}</td>"
                    f"<td>{'retrieved' if p['hit'] else 'missed'}</td></tr>" for p in cv.get("sweep", []))
    more = "".join(f"<div class='note'>{html.escape(w)}</div>" for w in cv.get("more_floats", []))
    return (f"<dt>RULER-style tasks</dt><dd>{html.escape(cv.get('setup', ''))}"
            f"<div>exact attention (below 90%: no power, no call):</div><table class='matrix'><thead><tr><th>task</th>"
            f"<th>n</th><th>exact attention</th></tr></thead><tbody>{ex}</tbody></table>"
            f"<div>exact match [95% CI] · the floats each press's cache holds (share of exact attention's):</div>"
            f"<div class='scroll'><table class='matrix'><thead><tr><th>task</th><th>press</th>{head}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table></div>{more}<ul>{calls}</ul>"
            f"<div>time per press (mean CPU s per instance and ratio; the prefill is shared: {html.escape(pre)}); memory: the "
            f"floats above (a per-press peak of process memory is not measured)</div><table class='matrix'><thead><tr>"
            f"<th>press</th><th>compress s</th><th>score s</th><th>(instance, ratio) pairs</th></tr></thead><tbody>{timing}</tbody>"
            f"</table>" + (f"<div>needle-depth sweep (single needle):</div><table class='matrix'><thead><tr>"
                           f"<th>press</th><th>n</th><th>depth</th><th>answer</th></tr></thead><tbody>{sweep}</tbody>"
                           f"</table>" if sweep else "") + "</dd>")


def _provenance(result: dict) -> str:
    code = result.get("code") or {}
    vs = " · ".join(f"{k} {v}" for k, v in (code.get("versions") or {}).items())
    return (f"<dt>code</dt><dd>{html.escape(vs)}; method code {html.escape(code.get('method', '-'))} "
            f"({html.escape(', '.join(code.get('method_files', [])))}); stream set "
            f"{html.escape(code.get('streams', '-'))}; "
            f"records keyed on {html.escape(code.get('key', '-'))}{' (rerun forced)' if code.get('forced') else ''}"
            f"</dd>")


def render_card(result: dict) -> str:
    """evaluation.html for evaluation.json's content ``result``: the verdict in one sentence, then per family (real
    keys first) the method's error level beside each control's with the calls and their intervals and a plot,
    then decode and end to end, versions and stream sizes."""
    from kvbounds.verdict import label
    __version__ = _version()
    calls = result["calls"]
    head = [c for c in calls if c["fraction"] == result["fraction"]]
    tone = tone_of(head)
    controls = result["battery"]
    decode = result.get("decode") or {}
    dec = ""
    if decode:
        dec = (f"<dt>decode</dt><dd>{html.escape(decode.get('setup', ''))}"
               + (_calls_table(decode["calls"], controls) if decode.get("calls") else
                  f"<div class='note'>{html.escape(decode.get('skipped', ''))}</div>") + "</dd>")
    missing = "".join(f"<div class='note'>not run: {html.escape(m)}</div>" for m in result.get("not_run", []))
    t = result.get("time", {})
    e2e = result.get("e2e") or {}
    name = html.escape(result["method"])
    verdict = html.escape(result.get("verdict") or result["headline"])
    fams = "".join(_family_block(result, f, controls) for f in result["families"])
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>kvbounds evaluate: {name}</title>
{report_style()}
</head><body>
<h1>kvbounds evaluate: {name}</h1>
<p class="verdict"><b>{verdict}</b></p>
<div class="meta">kvbounds {__version__} · profile <b>{html.escape(result['profile'])}</b> · seed {result['seed']} ·
{result['streams']} streams · compression ratio {result['ratio']:g} (headline: {100 * result['fraction']:.0f}% of the
cache's floats)</div>
<section class="card t-{tone}">
<div class="card-head"><h3>{name}</h3>
<span class="kind">{html.escape(result['kind'])} · {html.escape(result['spec'])}</span></div>
<div class="statement">Does {name} beat doing nothing and the field's baselines at equal memory?
The battery: {html.escape(', '.join(label(c) for c in controls))}, each given the floats the method's cache holds
(keys, values and weights counted alike). Metric (the practitioner's): {html.escape(result['metric'])}; per memory,
the median over streams (the unit: an independent stream) with its 95% interval, the method's and each control's on the same streams.
Each call: the battery's test (two one-sided Wilcoxon signed-rank tests, Holm over each memory's pairs) with the
median ratio method / control [95% interval] and the streams won; where the test and the interval disagree the card
says "leaning" on the interval's side (never "worse" beside an interval containing 1).</div>
<dl class="dl">
<dt>method</dt><dd>{html.escape(result['label'])}</dd>
<dt>families</dt><dd>{fams}{missing}</dd>
{dec}{_e2e_block(e2e)}{_curves_block(e2e.get('curves') or {})}
{_provenance(result)}
<dt>run</dt><dd>wall {t.get('wall_s', '-')} s; stream trials {_num(t.get('trials_cpu_s'))} CPU s on
{t.get('workers', '-')} worker(s); this process {_num(t.get('cpu_s_this_process'))} CPU s</dd>
</dl>
<div class="paths">records: <code>results.jsonl</code> · summary: <code>evaluation.json</code></div>
</section></body></html>
"""


def write_outputs(out, result: dict) -> tuple[Path, Path]:
    """evaluation.json and evaluation.html in ``out``, each atomically."""
    j = write_output(Path(out) / JSON_FILE, json.dumps(jsonable(result), indent=1, sort_keys=True) + "\n",
                     stores=[out])
    h = write_output(Path(out) / CARD_FILE, render_card(result), stores=[out])
    return j, h

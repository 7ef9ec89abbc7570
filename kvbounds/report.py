"""The report: claim verdicts from the stored records, as a terminal table, ``summary.json`` and a
static ``report.html`` with seaborn figures.

    build_verdicts(records)  one Verdict per registered claim (registry order), never raising,
    render_terminal(verdicts) the plain-text table and findings list the CLI prints,
    write_report(out_dir)    reads ``out_dir/results.jsonl``, writes ``report.html``,
                             ``summary.json`` and ``figures/*.png``; returns the html path.

The HTML needs no server: its only external files are the PNGs under ``figures/``, referenced by
relative paths. Figures are drawn on plain ``matplotlib.figure.Figure`` objects (Agg canvas), so
the report never touches pyplot's global state or the process-wide backend.
"""
from __future__ import annotations

import dataclasses
import html
import json
import re
import time
from collections import defaultdict
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from . import registry
from .records import Record, ResultStore, _jsonable, canonical
from .verdict import (FAILS, HOLDS, HOLDS_FITTED, INCONCLUSIVE, NO_CHECK, NOT_RUN, FigureSpec,
                      Verdict)

STATUS_COLOURS = {HOLDS: "#2e7d32", HOLDS_FITTED: "#558b2f", FAILS: "#c62828",
                  INCONCLUSIVE: "#ef6c00", NO_CHECK: "#757575", NOT_RUN: "#9e9e9e"}
FIG_DIR = "figures"
EVIDENCE_CHARS = 100


# ---------------------------------------------------------------------------------------- verdicts

def build_verdicts(records: Sequence[Record]) -> dict[str, Verdict]:
    """One verdict per claim of ``registry.CLAIMS`` (looked up at call time), in registry order.

    A check module that fails to import or whose ``summarize`` raises gives an ``inconclusive``
    verdict carrying the exception text; the report itself never fails on a check's bug."""
    by_claim: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        by_claim[r.claim].append(r)
    out: dict[str, Verdict] = {}
    for cid, claim in registry.CLAIMS.items():
        recs = by_claim.get(cid, [])
        if not claim.has_check:
            out[cid] = Verdict(cid, NO_CHECK, "no check registered yet")
        elif not recs:
            out[cid] = Verdict(cid, NOT_RUN, "check registered, no records yet")
        else:
            try:
                v = claim.check_module().summarize(recs)
                if not isinstance(v, Verdict):
                    raise TypeError(f"summarize returned {type(v).__name__}, not Verdict")
            except Exception as e:  # noqa: BLE001 - a broken check must not take the report down
                v = Verdict(cid, INCONCLUSIVE, f"summarize raised {type(e).__name__}: {e}")
            v.n_records = v.n_records or len(recs)
            out[cid] = v
    return out


def _constant_text(v: Verdict) -> str:
    if v.constant is None:
        return ""
    s = f"C={v.constant:.3g}"
    if v.constant_kind:
        s += f" ({v.constant_kind})"
    return s


def _truncate(s: str, n: int = EVIDENCE_CHARS) -> str:
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 3] + "..."


def render_terminal(verdicts: dict[str, Verdict]) -> str:
    """Plain-text summary: one row per claim, then every finding."""
    rows = [(cid, v.status, _truncate(v.summary), _constant_text(v)) for cid, v in verdicts.items()]
    head = ("claim", "status", "evidence", "constant")
    w = [max([len(head[i])] + [len(r[i]) for r in rows]) for i in range(3)]
    fmt = lambda r: f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:<{w[2]}}  {r[3]}".rstrip()
    lines = [fmt(head), "-" * (sum(w) + 6 + len(head[3]))] + [fmt(r) for r in rows]
    counts: dict[str, int] = defaultdict(int)
    for v in verdicts.values():
        counts[v.status] += 1
    lines += ["", "Totals: " + ", ".join(f"{k} {n}" for k, n in counts.items())]
    findings = [f for v in verdicts.values() for f in v.findings]
    lines += ["", f"Findings ({len(findings)})" if findings else "Findings: none"]
    for f in findings:
        lines.append(f"  - [{f.kind}] {f.title}")
        lines.append(f"      {f.detail}")
        if f.smallest_input:
            lines.append(f"      smallest input: {canonical(f.smallest_input)}")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------- figures

def _fig_name(claim: str, i: int) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"{claim}_{i}") + ".png"


def _frame(records: Sequence[Record]) -> pd.DataFrame:
    rows = [{**r.params, "measured": r.measured, "bound": r.bound, "ratio": r.ratio,
             "check": r.check, "control": r.control} for r in records]
    return pd.DataFrame(rows)


def draw_figure(spec: FigureSpec, records: Sequence[Record], path: Path) -> str | None:
    """Draw one FigureSpec to ``path``. Returns None on success, else a note why it was skipped."""
    recs = [r for r in records if spec.check is None or r.check == spec.check]
    if not recs:
        return f"no records{' for check ' + repr(spec.check) if spec.check else ''}"
    if not any(spec.x in r.params for r in recs):
        return f"x key {spec.x!r} not in the records' params"
    df = _frame(recs)
    df = df[df[spec.x].notna()]
    if spec.hue and spec.hue not in df.columns:
        return f"hue key {spec.hue!r} not in the records"
    numeric_x = pd.api.types.is_numeric_dtype(df[spec.x])
    logx = spec.logx and numeric_x and bool((df[spec.x] > 0).all())
    df = df[np.isfinite(df[spec.y].astype(float))]
    if spec.logy:
        df = df[df[spec.y] > 0]
    df = df.copy()
    if df.empty:
        return f"no finite{' positive' if spec.logy else ''} values of {spec.y}"

    # Categorical hue with an explicit palette, so the bound lines can reuse each level's colour.
    hue_col = None
    if spec.hue:
        hue_col = f"{spec.hue} "  # a separate column, so hue == x still works
        levels = list(df[spec.hue].dropna().unique())
        try:
            levels.sort()
        except TypeError:  # mixed types: order by text
            levels.sort(key=str)
        df[hue_col] = df[spec.hue].map(str)
        order = [str(v) for v in levels]
        palette = dict(zip(order, sns.color_palette(n_colors=max(len(order), 1))))
    else:
        order, palette = [None], {None: sns.color_palette()[0]}
    style = "control" if df["control"].nunique() > 1 else None

    fig = Figure(figsize=(6.4, 4.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    sns.lineplot(data=df, x=spec.x, y=spec.y, hue=hue_col, hue_order=order if hue_col else None,
                 palette=palette if hue_col else None, color=None if hue_col else palette[None],
                 estimator="median", errorbar=("pi", 90), ax=ax,
                 **(dict(style=style, markers=True, dashes=False) if style else dict(marker="o")))
    extra = []
    if spec.show_bound and spec.y == "measured":
        for lvl in order:
            sub = df if lvl is None else df[df[hue_col] == lvl]
            med = sub.groupby(spec.x)["bound"].median().sort_index()
            med = med[np.isfinite(med)]
            if spec.logy:
                med = med[med > 0]
            if len(med):
                ax.plot(med.index, med.values, ls="--", lw=1.2, color=palette[lvl])
        extra.append(Line2D([], [], ls="--", color="0.3", label="bound (median)"))
    if spec.y == "ratio":
        ax.axhline(1.0, ls=":", lw=1.2, color="k")
        extra.append(Line2D([], [], ls=":", color="k", label="bound (ratio = 1)"))
    if logx:
        ax.set_xscale("log")
    if spec.logy:
        ax.set_yscale("log")
    leg = ax.get_legend()
    handles = list(leg.legend_handles) if leg else []
    labels = [t.get_text() for t in leg.texts] if leg else []
    if handles or extra:
        ax.legend(handles + extra, labels + [h.get_label() for h in extra], fontsize=8,
                  title=spec.hue if hue_col and not style else None)
    ax.set_title(spec.title, fontsize=10)
    ax.set_xlabel(spec.x)
    ax.set_ylabel(spec.y)
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return None


def _draw_all(verdicts: dict[str, Verdict], records: Sequence[Record], fig_dir: Path) -> dict[str, list]:
    """Per claim: a list of (spec, relative png path or None, note or None)."""
    by_claim: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        by_claim[r.claim].append(r)
    out: dict[str, list] = {}
    for cid, v in verdicts.items():
        out[cid] = []
        for i, spec in enumerate(v.figures):
            name = _fig_name(cid, i)
            try:
                note = draw_figure(spec, by_claim.get(cid, []), fig_dir / name)
            except Exception as e:  # noqa: BLE001 - one bad figure must not lose the report
                note = f"drawing failed: {type(e).__name__}: {e}"
            out[cid].append((spec, None if note else f"{FIG_DIR}/{name}", note))
    return out


# -------------------------------------------------------------------------------------------- html

_CSS = """
body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;width:100%;font-size:0.9em}
th,td{border:1px solid #ddd;padding:4px 6px;text-align:left;vertical-align:top}
th{background:#f4f4f4} .status{color:#fff;padding:1px 6px;border-radius:3px;white-space:nowrap}
code,pre{font-size:0.85em;background:#f6f6f6} pre{padding:6px;white-space:pre-wrap}
section{border-top:1px solid #ccc;margin-top:1.5em} img{max-width:100%} .note{color:#888}
"""


def _e(x) -> str:
    return html.escape(str(x))


def _status_html(status: str) -> str:
    return f'<span class="status" style="background:{STATUS_COLOURS.get(status, "#555")}">{_e(status)}</span>'


def _anchor(cid: str) -> str:
    return "claim-" + re.sub(r"[^A-Za-z0-9_-]", "_", cid)


def _constant_html(v: Verdict) -> str:
    if v.constant is None:
        return ""
    s = f"{v.constant:.3g}" + (f" ({_e(v.constant_kind)})" if v.constant_kind else "")
    if v.constant_spread:
        s += " <small>5%/50%: " + "/".join(f"{x:.3g}" for x in v.constant_spread) + "</small>"
    return s


def render_html(verdicts: dict[str, Verdict], records: Sequence[Record], figures: dict[str, list]) -> str:
    claims = registry.CLAIMS
    backends = sorted({r.backend for r in records})
    seeds = sorted({r.seed for r in records})
    orphan = sorted({r.claim for r in records} - set(claims))
    meta = [f"{len(records)} records", f"backends: {', '.join(backends) or '-'}",
            f"seeds: {', '.join(map(str, seeds)) or '-'}",
            f"generated {time.strftime('%Y-%m-%d %H:%M:%S %Z')}"]
    if orphan:
        meta.append(f"records for unregistered claims (ignored): {', '.join(orphan)}")
    p = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
         "<title>kvbounds claim report</title>", f"<style>{_CSS}</style></head><body>",
         "<h1>kvbounds: claim verification report</h1>", f"<p>{_e(' | '.join(meta))}</p>",
         "<h2>Summary</h2><table><tr><th>claim</th><th>family</th><th>source</th><th>status</th>"
         "<th>evidence</th><th>constant</th></tr>"]
    for cid, v in verdicts.items():
        c = claims[cid]
        p.append(f'<tr><td><a href="#{_anchor(cid)}">{_e(cid)}</a></td><td>{_e(c.family)}</td>'
                 f"<td>{_e(c.source)}</td><td>{_status_html(v.status)}</td><td>{_e(v.summary)}</td>"
                 f"<td>{_constant_html(v)}</td></tr>")
    p.append("</table>")
    findings = [f for v in verdicts.values() for f in v.findings]
    p.append(f"<h2>Findings ({len(findings)})</h2>")
    if not findings:
        p.append('<p class="note">none</p>')
    for f in findings:
        p.append(f'<div><h3><a href="#{_anchor(f.claim)}">{_e(f.claim)}</a> &mdash; {_e(f.kind)}: {_e(f.title)}</h3>'
                 f"<p>{_e(f.detail)}</p><p>smallest input: <code>{_e(canonical(f.smallest_input))}</code></p></div>")
    p.append("<h2>Claims</h2>")
    for cid, v in verdicts.items():
        c = claims[cid]
        p.append(f'<section id="{_anchor(cid)}"><h3>{_e(cid)} {_status_html(v.status)}</h3>'
                 f"<p>{_e(c.statement)}</p><p><b>Source:</b> {_e(c.source)}"
                 f"{' | <b>check:</b> <code>' + _e(c.check) + '</code>' if c.check else ''}"
                 f" | <b>records:</b> {v.n_records}</p><pre>{_e(v.summary)}</pre>")
        if v.constant is not None:
            p.append(f"<p><b>Constant:</b> {_constant_html(v)}</p>")
        for f in v.findings:
            p.append(f"<p><b>{_e(f.kind)}:</b> {_e(f.title)} &mdash; {_e(f.detail)} "
                     f"<code>{_e(canonical(f.smallest_input))}</code></p>")
        for spec, src, note in figures.get(cid, []):
            if src:
                p.append(f'<figure><img src="{_e(src)}" alt="{_e(spec.title)}"><figcaption>{_e(spec.title)}'
                         "</figcaption></figure>")
            else:
                p.append(f'<p class="note">figure "{_e(spec.title)}" skipped: {_e(note)}</p>')
        p.append("</section>")
    p.append("</body></html>")
    return "\n".join(p)


def summary_dict(verdicts: dict[str, Verdict]) -> dict:
    return {cid: {"status": v.status, "summary": v.summary, "constant": v.constant,
                  "constant_spread": list(v.constant_spread) if v.constant_spread else None,
                  "constant_kind": v.constant_kind, "n_records": v.n_records,
                  "findings": [dataclasses.asdict(f) for f in v.findings]}
            for cid, v in verdicts.items()}


def write_report(out_dir) -> Path:
    """Build verdicts from ``out_dir/results.jsonl``; write report.html, summary.json, figures/*.png."""
    out = Path(out_dir)
    records = ResultStore(out).load()
    verdicts = build_verdicts(records)
    figures = _draw_all(verdicts, records, out / FIG_DIR)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(_jsonable(summary_dict(verdicts)), indent=2) + "\n",
                                      encoding="utf-8")
    path = out / "report.html"
    path.write_text(render_html(verdicts, records, figures), encoding="utf-8")
    return path

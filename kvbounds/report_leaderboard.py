"""The end-to-end leaderboard in the report: a table (method x metric x budget) and a figure of quality
against memory, from the rows of ``kvbounds.e2e.leaderboard.leaderboard_rows(records)``.

A row: method, source ("kvbounds" | "kvpress"), budget (fraction of the cache kept), memory_floats, metric,
value, ci_low, ci_high (float or None), n (trials), note.
"""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

MAX_PANELS = 3


def _num(x) -> float | None:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _cell(row: dict) -> dict:
    v, lo, hi = _num(row.get("value")), _num(row.get("ci_low")), _num(row.get("ci_high"))
    text = "-" if v is None else f"{v:.3g}"
    ci = f"[{lo:.3g}, {hi:.3g}]" if lo is not None and hi is not None else ""
    return {"text": text, "ci": ci, "n": row.get("n", ""), "note": row.get("note", "") or ""}


def board_table(rows: list[dict]) -> dict:
    """{"budgets": [...], "metrics": [{"metric", "rows": [{"method", "source", "cells": [...]}]}]}"""
    budgets = sorted({float(r["budget"]) for r in rows if _num(r.get("budget")) is not None})
    by_metric: dict[str, dict[tuple, dict]] = defaultdict(dict)
    for r in rows:
        by_metric[str(r.get("metric", ""))].setdefault((str(r.get("method", "")), str(r.get("source", ""))), {})
        b = _num(r.get("budget"))
        if b is not None:
            by_metric[str(r.get("metric", ""))][(str(r.get("method", "")), str(r.get("source", "")))][b] = _cell(r)
    metrics = []
    for metric, methods in sorted(by_metric.items()):
        metrics.append({"metric": metric, "rows": [
            {"method": m, "source": s, "cells": [cells.get(b, {"text": "", "ci": "", "n": "", "note": ""})
                                                 for b in budgets]}
            for (m, s), cells in sorted(methods.items())]})
    return {"budgets": [f"{b:g}" for b in budgets], "metrics": metrics}


def draw_board(rows: list[dict], path: Path) -> bool:
    """Quality against memory (floats held), one panel per metric (at most three), one line per method."""
    import seaborn as sns
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    pts: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        mem, v = _num(r.get("memory_floats")), _num(r.get("value"))
        if mem is None or v is None or mem <= 0:
            continue
        label = f"{r.get('method', '')} ({r.get('source', '')})"
        pts[str(r.get("metric", ""))][label].append((mem, v, _num(r.get("ci_low")), _num(r.get("ci_high"))))
    # graded metrics first (they separate methods that all miss an exact match), then the rest
    graded = [m for m in sorted(pts) if "exact match" not in m and "perplexity" not in m]
    metrics = (graded + [m for m in sorted(pts) if m not in graded])[:MAX_PANELS]
    if not metrics:
        return False
    methods = sorted({m for metric in metrics for m in pts[metric] if not m.startswith("exact ")})
    colours = dict(zip(methods, sns.color_palette("husl", n_colors=len(methods))))
    bands = len(methods) <= 6            # with more methods, overlapping bands hide the lines: intervals are in the table
    fig = Figure(figsize=(4.4 * len(metrics) + 2.6, 3.9))
    FigureCanvasAgg(fig)
    for i, metric in enumerate(metrics):
        ax = fig.add_subplot(1, len(metrics), i + 1)
        for m, p in sorted(pts[metric].items()):
            if m.startswith("exact "):   # the uncompressed cache: a reference level, not a point far to the right
                ax.axhline(p[0][1], color="black", ls="--", lw=1, label="exact attention (no compression)")
        for m in methods:
            p = sorted(pts[metric].get(m, []))
            if not p:
                continue
            xs, ys = [q[0] for q in p], [q[1] for q in p]
            style = "-" if m.endswith("(kvbounds)") else ":"
            ax.plot(xs, ys, marker="o", ls=style, color=colours[m], label=m, lw=1.4, ms=4)
            if bands:
                lo = [q[2] if q[2] is not None else q[1] for q in p]
                hi = [q[3] if q[3] is not None else q[1] for q in p]
                ax.fill_between(xs, lo, hi, color=colours[m], alpha=0.15, lw=0)
        ax.set_xlabel("memory (floats held in the cache)")
        ax.set_ylabel(metric)
        ax.set_title(f"{metric} against memory", fontsize=10)
        ax.grid(True, alpha=0.3)
        if i == len(metrics) - 1:
            ax.legend(fontsize=6.5, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return True

"""The end-to-end leaderboard in the report: ranked tables per (metric, budget) and a figure of quality
against memory with error bars, colours grouped by family, from the rows of
``kvbounds.e2e.leaderboard.leaderboard_rows(records)``.

A row: method, source ("kvbounds" | "kvpress"), budget (fraction of the cache kept), budget_label, memory_floats,
metric, value, ci_low, ci_high (float or None), n (instances), note, family, rank, best, tied.
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
    """{"tables": [{"title", "metric", "budget", "rows": [{"rank", "method", "source", "family", "text", "ci", "n",
    "floats", "mark", "note"}]}], "collapsed": [lines], "references": [lines]}: one ranked table per (metric,
    budget) - best first, the best and those statistically tied with it marked, the floats each method holds beside
    it; tables without information collapsed into one line; exact attention's level given as a reference line."""
    tables: dict = defaultdict(list)
    collapsed, refs = [], []
    for r in rows:
        metric, method = str(r.get("metric", "")), str(r.get("method", ""))
        label = r.get("budget_label") or f"budget {r.get('budget')}"
        if method == "exact":
            c = _cell(r)
            refs.append(f"{metric}: exact attention {c['text']} {c['ci']} ({c['n']})")
        elif method == "all methods":
            collapsed.append(f"{metric} at {label}: {r.get('note', '')}")
        elif metric == "skipped":
            collapsed.append(f"{method} at {label}: skipped ({r.get('note', '')})")
        else:
            tables[(metric, _num(r.get("budget")) or 0.0, label)].append(r)
    out = []
    for (metric, budget, label), rs in sorted(tables.items()):
        rs = sorted(rs, key=lambda r: (r.get("rank") is None, r.get("rank") or 0, str(r.get("method"))))
        out.append({"title": f"{metric} - {label}", "metric": metric, "budget": label, "rows": [
            dict(_cell(r), rank=r.get("rank") or "", method=r.get("method", ""), source=r.get("source", ""),
                 family=r.get("family", ""), floats=f"{int(r.get('memory_floats') or 0):,}",
                 mark="best" if r.get("best") else "tied with best" if r.get("tied") else "") for r in rs]})
    return {"tables": out, "collapsed": collapsed, "references": sorted(set(refs))}


# colours grouped by family: ours in blues, kvpress in oranges/reds, baselines in greens/greys
FAMILY_PALETTES = {"ours": "Blues", "kvpress": "Oranges", "baselines": "Greens"}


def _colours(methods: list[tuple[str, str]]) -> dict:
    import seaborn as sns
    out = {}
    for fam, pal in FAMILY_PALETTES.items():
        ms = [m for m, f in methods if f == fam]
        out.update(zip(ms, sns.color_palette(pal, n_colors=len(ms) + 2)[2:][::-1] if ms else []))
    return out


def draw_board(rows: list[dict], path: Path) -> bool:
    """Quality against memory (floats held), one panel per metric (at most three), one line per method."""
    import seaborn as sns
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from .output_files import write_output

    pts: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    fams: dict[str, str] = {}
    for r in rows:
        mem, v = _num(r.get("memory_floats")), _num(r.get("value"))
        if mem is None or v is None or mem <= 0:
            continue
        if r.get("method") in ("all methods",):
            continue
        label = f"{r.get('method', '')} ({r.get('source', '')})"
        fams[label] = r.get("family") or ("kvpress" if r.get("source") == "kvpress" else "ours")
        pts[str(r.get("metric", ""))][label].append((mem, v, _num(r.get("ci_low")), _num(r.get("ci_high"))))
    # graded metrics first (they separate methods that all miss an exact match), then the rest
    graded = [m for m in sorted(pts) if "exact match" not in m and "perplexity" not in m]
    metrics = (graded + [m for m in sorted(pts) if m not in graded])[:MAX_PANELS]
    if not metrics:
        return False
    methods = sorted({m for metric in metrics for m in pts[metric] if not m.startswith("exact ")},
                     key=lambda m: (list(FAMILY_PALETTES).index(fams.get(m, "ours")), m))
    colours = _colours([(m, fams.get(m, "ours")) for m in methods])
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
            lo = [q[1] - q[2] if q[2] is not None else 0.0 for q in p]
            hi = [q[3] - q[1] if q[3] is not None else 0.0 for q in p]
            ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", ls=style, color=colours[m], label=f"{m} [{fams.get(m)}]",
                        lw=1.2, ms=4, capsize=2, elinewidth=0.8)
        ax.set_xlabel("memory (floats held in the cache)")
        ax.set_ylabel(metric)
        ax.set_title(f"{metric} against memory", fontsize=10)
        ax.grid(True, alpha=0.3)
        if i == len(metrics) - 1:
            ax.legend(fontsize=6.5, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_output(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"), own=True)
    return True

"""The end-to-end leaderboard in the report: ranked tables per (metric, budget) and a figure of quality
against the share of the cache held, one panel per task, with error bars and colours grouped by family, from the
rows of
``kvbounds.e2e.leaderboard_rows(records)``.

A row: method, source ("kvbounds" | "kvpress"), budget (fraction of the cache kept), budget_label, memory_floats,
metric, value, ci_low, ci_high (float or None), n (instances), note, family, rank, best, tied.
"""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from kvbounds.core import write_output

MAX_PANELS = 6


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
    it; tables without information collapsed into one line; exact attention's level given as a reference line.
    Rows that are not leaderboard rows (a field missing or of the wrong type) are an InputError naming the row."""
    from ._rows import check_board_rows
    check_board_rows(rows)
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


# the families told apart by marker, the methods of a family by colour (colour-blind safe, distinct within a family)
FAMILY_PALETTES = {"ours": "Blues", "kvpress": "Oranges", "baselines": "Greens"}
FAMILY_MARKERS = {"ours": "o", "kvpress": "s", "baselines": "^"}
# the legend's words for a family: "ours" (the records' label) are the papers' methods as this package implements them
FAMILY_WORDS = {"ours": "the papers' methods", "kvpress": "kvpress", "baselines": "baselines"}
TASK_NAMES = {"ppl": "perplexity", "passkey": "passkey retrieval", "lines": "line retrieval",
              "decode": "decode, SmolLM2 generating"}


def _colours(methods: list[tuple[str, str]]) -> dict:
    import seaborn as sns
    out = {}
    for fam in FAMILY_PALETTES:
        ms = [m for m, f in methods if f == fam]
        out.update(zip(ms, sns.color_palette("colorblind", n_colors=max(len(ms), 1))))
    for m, f in methods:
        out.setdefault(m, (0.4, 0.4, 0.4))
    return out


def board_panels(pts: dict) -> list[str]:
    """The metrics drawn: per task (the text before ":", the "question inside" setting only where it is the task's
    only one), its graded metric (exact match separates nothing when every method misses; perplexity before the
    NLL increase, which says the same), in the order ppl, passkey, lines, then the rest (decode)."""
    order = {"ppl": 0, "passkey": 1, "lines": 2}
    chosen: dict[tuple, str] = {}
    for m in sorted(pts):
        task, _, quantity = m.partition(":")
        if "exact match" in quantity or not pts[m]:
            continue
        key = (task.split(",")[0].strip(), m if task.startswith("decode") else "")   # each decode claim its panel
        rank = ("question inside" in task, "NLL increase" in quantity)
        if key not in chosen or rank < chosen[key][0]:
            chosen[key] = (rank, m)
    picked = sorted(chosen.items(), key=lambda kv: (order.get(kv[0][0], 9), kv[1][1]))
    return [m for _, (_, m) in picked][:MAX_PANELS]


def _higher_is_better(metric: str) -> bool:
    return any(w in metric for w in ("log-likelihood", "exact match", "accuracy"))


def _floats(x: float) -> str:
    return f"{x / 1e6:.3g}M" if x >= 1e6 else f"{x / 1e3:.3g}k" if x >= 1e3 else f"{x:.0f}"


def draw_board(rows: list[dict], path: Path) -> bool:
    """Quality against the share of the cache held, one panel per task (at most MAX_PANELS): the budgets on the x
    axis (with the floats they hold), the methods side by side at each budget with their 95% intervals, exact
    attention as a dashed line, one legend for every panel."""
    import textwrap

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D


    pts: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    fams: dict[str, str] = {}
    exact: dict[str, float] = {}
    claims: dict[str, set] = defaultdict(set)
    for r in rows:
        mem, v, budget = _num(r.get("memory_floats")), _num(r.get("value")), _num(r.get("budget"))
        if mem is None or v is None or mem <= 0 or budget is None or r.get("method") in ("all methods",):
            continue
        metric = str(r.get("metric", ""))
        if r.get("method") == "exact":        # the uncompressed cache: a reference level, not a point at 100%
            exact[metric] = v
            continue
        label = str(r.get("method", ""))        # one name across panels (the decode panels' controls are one entry)
        fams[label] = r.get("family") or ("kvpress" if r.get("source") == "kvpress" else "ours")
        pts[metric][label].append((budget, mem, v, _num(r.get("ci_low")), _num(r.get("ci_high"))))
        if r.get("source") not in (None, "", "kvbounds", "kvpress"):
            claims[metric].add(str(r["source"]))
    metrics = board_panels(pts)
    if not metrics:
        return False
    methods = sorted({m for metric in metrics for m in pts[metric]},  # ours, then kvpress, then the baselines
                     key=lambda m: (list(FAMILY_PALETTES).index(fams.get(m, "ours")), m))
    colours = _colours([(m, fams.get(m, "ours")) for m in methods])
    ncols = min(3, len(metrics))
    nrows = -(-len(metrics) // ncols)
    fig = Figure(figsize=(4.3 * ncols, 3.3 * nrows + 0.35 * (len(methods) // 3 + 2)), layout="constrained")
    FigureCanvasAgg(fig)
    for i, metric in enumerate(metrics):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        here = [m for m in methods if pts[metric].get(m)]
        budgets = sorted({q[0] for m in here for q in pts[metric][m]})
        width = 0.7 / max(len(here), 1)
        for j, m in enumerate(here):
            p = sorted(pts[metric][m])
            xs = [budgets.index(q[0]) + (j - (len(here) - 1) / 2) * width for q in p]
            ys = [q[2] for q in p]
            err = [[q[2] - q[3] if q[3] is not None else 0.0 for q in p],
                   [q[4] - q[2] if q[4] is not None else 0.0 for q in p]]
            ax.errorbar(xs, ys, yerr=err, marker=FAMILY_MARKERS.get(fams.get(m), "o"), ms=4.5, lw=0.9, capsize=2,
                        elinewidth=0.8, color=colours[m], ls="-" if len(p) > 1 else "none")
        if metric in exact:
            ax.axhline(exact[metric], color="black", ls="--", lw=1)
        mem = {b: sorted(q[1] for m in here for q in pts[metric][m] if q[0] == b) for b in budgets}
        ax.set_xticks(range(len(budgets)),
                      [f"{b:.0%}\n{_floats(mem[b][len(mem[b]) // 2])} floats" for b in budgets], fontsize=8)
        ax.set_xlim(-0.6, len(budgets) - 0.4)
        task, _, quantity = metric.partition(":")
        head, _, setting = task.partition(",")
        title = TASK_NAMES.get(head.strip(), head.strip()) + (f", {setting.strip()}" if setting else "")
        title += f" ({', '.join(sorted(claims[metric]))})" if claims[metric] else ""
        ax.set_title(textwrap.fill(title, 44, break_on_hyphens=False), fontsize=10)
        ylabel = quantity.split(", SmolLM2")[0].strip() or metric
        ylabel += " (higher is better)" if _higher_is_better(metric) else " (lower is better)"
        ax.set_ylabel(textwrap.fill(ylabel, 34, break_on_hyphens=False), fontsize=8.5)
        ax.set_xlabel("share of the cache held (memory)", fontsize=8.5)
        ax.tick_params(axis="y", labelsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    handles = [Line2D([], [], color=colours[m], marker=FAMILY_MARKERS.get(fams.get(m), "o"), ms=4.5, ls="-",
                      label=f"{m} [{FAMILY_WORDS.get(fams.get(m), fams.get(m))}]") for m in methods]
    if exact:
        handles.append(Line2D([], [], color="black", ls="--", label="exact attention (no compression)"))
    fig.legend(handles=handles, loc="outside lower center", ncol=3, fontsize=7.5, frameon=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_output(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png", bbox_inches="tight"), own=True)
    return True

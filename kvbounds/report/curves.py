"""The end-to-end curves in the report and the README: one panel per task and model (score against the share of the
cache held, one line per method, exact attention as the ceiling), exact attention's score per panel, the decisions
read from the curves, and the time per instance.

The data (:func:`curves_data`) come from the run's records when it has curve records (``params["curve"]``, see
:mod:`kvbounds.e2e.curve_grid`), else from the committed compact form of the last full run,
``docs/e2e_curves.json`` (:data:`COMMITTED`), when present; either way ``provenance`` says which. ``python -m
kvbounds.report.curves RESULTS_DIR docs/e2e_curves.json`` writes the compact form from a run's records.
"""
from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from kvbounds.core import write_output
from kvbounds.core import ResultStore

__all__ = ["COMMITTED", "FORMAT", "from_records", "curves_data", "panels", "draw", "exact_lines", "decision_lines",
           "timing_lines", "depth_table", "BEGIN", "END", "readme_block", "splice_readme", "main"]

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "e2e_curves.json"
FORMAT = 1


def from_records(records, provenance: str) -> dict | None:
    """The curves' data (points, exact scores, decisions, timing) of the records' curve trials; None without any."""
    from kvbounds.e2e import curves
    from kvbounds.e2e.curve_grid import CURVE_INSTANCES as FULL_INSTANCES
    recs = [r for r in records if (getattr(r, "params", None) or {}).get("curve")]
    if not recs:
        return None
    dec = [dict(d, versus_exact={str(b): c for b, c in d["versus_exact"].items()},
                calls={str(b): c for b, c in d["calls"].items()}) for d in curves.decisions(recs)]
    exact = curves.exact_scores(recs)
    pts = curves.points(recs)
    # a curve cell: a task and length compressed by some method (not exact attention alone, not the depth sweep)
    curve = {(p["model"], p["task"], p["n"]) for p in pts if p["method"] != "exact" and "@depth" not in p["task"]}
    span = lambda xs: "-".join(map(str, sorted({min(xs), max(xs)})))
    sizes = [s["instances"] for s in exact if (s["model"], s["task"], s["n"]) in curve]
    rest = [s["instances"] for s in exact if (s["model"], s["task"], s["n"]) not in curve]
    if sizes:
        provenance += (f"; {span(sizes)} instances a curve cell"
                       + (f" (fewer than the full profile's {FULL_INSTANCES}: a smaller run, its calls weaker)"
                          if min(sizes) < FULL_INSTANCES else ""))
    if rest:
        provenance += f"; {span(rest)} in a cell of exact attention alone or of the needle-depth sweep"
    return dict(format=FORMAT, provenance=provenance, points=pts, exact=exact,
                decisions=dec, timing=curves.timing(recs))


def curves_data(records, run: str = "this run") -> dict | None:
    """The run's curves (:func:`from_records`), else the committed ones (``docs/e2e_curves.json``) with their
    provenance, else None."""
    data = from_records(records, f"{run}'s records")
    if data is not None or not COMMITTED.is_file():
        return data
    try:
        data = json.loads(COMMITTED.read_text(encoding="utf-8"))
    except ValueError:
        return None
    if data.get("format") != FORMAT:
        return None
    data["provenance"] = f"committed ({COMMITTED.parent.name}/{COMMITTED.name}: {data.get('provenance', '')})"
    return data


def panels(data: dict) -> list[tuple]:
    """(model, task, n, setting) of each panel, the depth sweep's left out (drawn as a table)."""
    return sorted({(p["model"], p["task"], p["n"], p["setting"]) for p in data["points"] if "@depth" not in p["task"]})


def draw(data: dict, path: Path) -> bool:
    """One panel per task and model; False when there is nothing to draw."""
    import textwrap

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from kvbounds.methods import leaderboard_family
    keys = panels(data)
    if not keys:
        return False
    exact = {(s["model"], s["task"], s["n"], s["setting"]): s for s in data["exact"]}
    by = defaultdict(lambda: defaultdict(list))
    for p in data["points"]:
        by[(p["model"], p["task"], p["n"], p["setting"])][p["method"]].append(p)
    methods = sorted({m for k in keys for m in by[k] if m != "exact"})
    import seaborn as sns
    colours = dict(zip(methods, sns.color_palette("husl", n_colors=max(len(methods), 1))))
    style = {"ours": "-", "kvpress": ":", "baselines": "--"}
    ncols = min(3, len(keys))
    nrows = -(-len(keys) // ncols)
    fig = Figure(figsize=(4.6 * ncols, 3.4 * nrows + 1.2), layout="constrained")
    FigureCanvasAgg(fig)
    for i, key in enumerate(keys):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        for m in methods:
            pts = sorted(by[key].get(m, []), key=lambda p: p["memory"])
            if not pts:
                continue
            xs, ys = [p["memory"] for p in pts], [p["value"] for p in pts]
            ax.plot(xs, ys, style.get(leaderboard_family(m), "-"), marker="o", ms=3, lw=1.1, color=colours[m])
        ex = by[key].get("exact")
        if ex:
            ax.axhline(ex[0]["value"], color="black", lw=1.2, ls="-.")
        s = exact.get(key)
        head = f"{key[1]} [{key[0]}], n = {key[2]}"
        if s:
            head += (f"; exact {s['retrieved']}/{s['instances']}" if s["what"] == "exact match"
                     else f"; exact ppl {s['score']:.3g}, {s['instances']} windows")
            head += "" if s["powered"] else " - no power"
        ax.set_title(textwrap.fill(head, 48), fontsize=9)
        metric = next(iter(by[key].values()))[0]["metric"]
        ax.set_ylabel(metric + (" (lower is better)" if "NLL" in metric else " (higher is better)"), fontsize=8)
        ax.set_xlabel("share of the cache's floats held", fontsize=8)
        ax.set_xlim(0, 1)
        ax.grid(True, alpha=0.3)
        ax.tick_params(labelsize=8)
    from matplotlib.lines import Line2D
    handles = [Line2D([], [], color=colours[m], ls=style.get(leaderboard_family(m), "-"), marker="o", ms=3, label=m)
               for m in methods] + [Line2D([], [], color="black", ls="-.", label="exact attention (the ceiling)")]
    fig.legend(handles=handles, loc="outside lower center", ncol=5, fontsize=7, frameon=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_output(path, lambda tmp: fig.savefig(tmp, dpi=100, format="png", bbox_inches="tight"), own=True)
    return True


def exact_lines(data: dict) -> list[str]:
    """Exact attention's score per task, model and length, "no power" where below the floor."""
    out = []
    for s in data["exact"]:
        where = f"{s['task']} [{s['model']}, n = {s['n']}{', ' + s['setting'] if s['setting'] != 'after' else ''}]"
        if s["what"] == "perplexity":
            out.append(f"{where}: perplexity {s['score']:.3g} over {s['instances']} windows")
        else:
            out.append(f"{where}: {s['retrieved']}/{s['instances']}" + ("" if s["powered"] else
                                                                       " - no power (below 90%), no call made"))
    return out


def decision_lines(data: dict) -> list[str]:
    from kvbounds.e2e.curves import decision_words
    out = []
    for d in data["decisions"]:
        d = dict(d, calls={float(b): c for b, c in d["calls"].items()})
        out.append(f"{d['task']} [{d['model']}, n = {d['n']}] " + decision_words(d))
    return out


def timing_lines(data: dict) -> list[str]:
    return [f"{t['model']}, n = {t['n']}: {t['seconds']:.3g} CPU s per instance over {t['instances']} instances, "
            f"the prefill {100 * t['prefill_share']:.0f}% of it ({t['prefill_s']:.3g} s)"
            for t in data["timing"] if not math.isnan(t["prefill_share"])]


def depth_table(data: dict) -> list[dict]:
    """The needle-depth x context-length sweep: per (model, method, budget, n, depth) the score and instances."""
    return [dict(model=p["model"], method=p["method"], budget=p["budget"], n=p["n"],
                 depth=float(p["task"].split("@depth")[1]), value=p["value"], instances=p["instances"])
            for p in data["points"] if "@depth" in p["task"]]


BEGIN, END = "<!-- e2e-curves: begin (generated by `python -m kvbounds.report.curves --readme`) -->", \
    "<!-- e2e-curves: end -->"


def readme_block(data: dict | None) -> str:
    """The README's curves block (between :data:`BEGIN` and :data:`END`): the committed run's provenance, exact
    attention's score per cell, the decisions at 25% and 50%, the time per instance; a line saying where it will
    come from when nothing is committed."""
    from kvbounds.e2e.curves import decision_words
    if data is None:
        return "\n".join([BEGIN, "", "No full run's curves are committed yet (`docs/e2e_curves.json`): `make report` "
                          "draws the quick profile's.", "", END])
    lines = [BEGIN, "", f"From {data.get('provenance', '')}.", "", "Exact attention:", ""]
    lines += [f"- {x}" for x in exact_lines(data)]
    told = [d for d in data["decisions"] if _any_call(d)]
    dec = [f"- {d['task']} [{d['model']}, n = {d['n']}] " + decision_words(dict(d, calls={
        float(b): c for b, c in d["calls"].items() if float(b) in (0.25, 0.5)})) for d in told]
    silent = len(data["decisions"]) - len(told)
    if silent:
        dec.append(f"- {silent} more (method, cell) pairs with no call: too few instances (the needle-depth sweep's "
                   "one a cell)")
    lines += ["", "Read from the curves (calls at 25% and 50%; every memory in the report):", ""] + dec if dec else []
    lines += ["", "Time per instance:", ""] + [f"- {x}" for x in timing_lines(data)] + ["", END]
    return "\n".join(lines)


def _any_call(d: dict) -> bool:
    """A decision with something to say: tied with exact attention somewhere, or a call that was made."""
    return d.get("matches_exact") is not None or any(c.get("call") not in ("not tested", None)
                                                     for c in list(d["calls"].values()) + list(d["versus_exact"].values()))


def splice_readme(text: str, block: str) -> str:
    """``text`` with its curves block replaced by ``block`` (the markers must be there once each)."""
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise ValueError("the README must hold the e2e-curves markers once each")
    a, b = text.index(BEGIN), text.index(END) + len(END)
    return text[:a] + block + text[b:]


def main(argv=None) -> int:
    """``python -m kvbounds.report.curves RESULTS_DIR OUT_JSON``: the compact form of a run's curves;
    ``python -m kvbounds.report.curves --readme README.md``: the README's block from the committed form."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "--readme":
        data = curves_data([])
        path = Path(args[1])
        try:
            text = splice_readme(path.read_text(encoding="utf-8"), readme_block(data))
        except (OSError, ValueError) as e:
            print(f"kvbounds.report.curves: {e}", file=sys.stderr)
            return 2
        write_output(path, text, own=True)
        return 0
    if len(args) != 2:
        print("usage: python -m kvbounds.report.curves RESULTS_DIR OUT_JSON | --readme README.md", file=sys.stderr)
        return 2
    records = ResultStore(args[0]).load()
    runs = sorted({r.get("profile", "") for r in _runs(Path(args[0]))} - {""})
    data = from_records(records, f"run in {Path(args[0]).name}, profile {'/'.join(runs) or 'unknown'}")
    if data is None:
        print(f"kvbounds.report.curves: no curve records in {args[0]}", file=sys.stderr)
        return 2
    write_output(Path(args[1]), json.dumps(data, indent=1, sort_keys=True) + "\n", own=True)
    return 0


def _runs(out: Path) -> list[dict]:
    p = out / "runs.jsonl"
    if not p.is_file():
        return []
    rows = []
    for line in p.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


if __name__ == "__main__":
    raise SystemExit(main())

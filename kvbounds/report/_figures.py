"""The report's figures: one FigureSpec drawn as measured against its bound, with seaborn on a plain
``matplotlib.figure.Figure`` (Agg canvas; pyplot's global state is never touched).

Rules, so a figure cannot misinform:
  * one sweep per figure: a spec's ``sweep`` (or, by default, the sweep named like its x key) filters the
    records, so records of other sweeps at the centre point are not pooled in;
  * a bound line only where the claim has a number on that axis: an ``a-priori``/``certificate``/``exact``/``fitted``
    bound at its recorded value (a ``fitted`` record's bound is the claimed number, its constants fitted); a
    ``shape`` (an O(.) with no constant) only as the shape scaled by the fitted constant, labelled as that and not
    as a bound;
  * a bound far above the data (or infinite) is not drawn but said in the legend: its value (e^X when the records
    carry its logarithm), and "vacuous" when returning zeros meets it; likewise when a spec hides the bound;
  * axes say what they measure (units where a parameter has one); log ticks carry no overlapping minor labels;
  * at most ``MAX_HUES`` colours (evenly chosen levels otherwise, said in the caption); bands only for few hues.
"""
from __future__ import annotations

import math
import re
import textwrap
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, LogLocator, MaxNLocator, NullFormatter, NullLocator

from kvbounds.core import write_output
from kvbounds.core import Record
from kvbounds.claims import cite
from ._words import check_text
from kvbounds.verdict import FigureSpec

MAX_HUES = 6
SHAPE_KINDS = ("shape",)            # an O(.) shape: a number only once multiplied by the fitted constant
OFF_CHART = 1e3                     # a bound this many times above every measured value is not drawn, but said
TINY_C = 1e-6                       # a fitted constant below this: the shape with constant 1 says nothing here
KIND_LABELS = {"a-priori": "bound (the paper's constants)", "exact": "bound (exact, as recorded)",
               "certificate": "certificate (the algorithm's own bar)", "fitted": "bound as stated (constants fitted)"}

# params keys with one meaning across the checks, and their units
PARAM_LABELS = {
    "n": "n (tokens in the stream)", "d": "d (head dimension)", "t": "t (batch size, tokens)",
    "eps": "ε (target error)", "delta": "δ (failure probability)", "r": "r (key-norm bound, ‖k‖ ≤ r)",
    "T": "T (levels; 2^-T of the middle kept)", "J": "J (chunks)", "position": "position (tokens)",
    "layer": "layer", "block_size": "batch size (tokens)", "ell": "ℓ (sketch rows)", "l": "ℓ (sketch rows)",
    "lam": "λ (multiple of the stated sample size)", "C": "C (multiple of the stated shape)",
    "M_over_n": "M / n (memory per bit)", "eps_sqrt_n": "ε √n", "m": "m", "s": "s",
}
WRAP = 44                           # characters per line of an axis label


# the same key meaning something else in a family of claims (by claim-id prefix)
FAMILY_LABELS = {
    ("SUB.", "r"): "r (rank of the subspace)", ("FD.", "r"): "r (rank)", ("FD.", "ell"): "ℓ (sketch rows)",
    ("SUB.", "T"): "T (tokens in the context)", ("SG.", "m"): "m (samples kept)", ("SG.", "s"): "s (reservoir samples)",
    ("SB.", "s"): "s (value dimension)", ("MR.", "s"): "s (value dimension)", ("BKV.", "s"): "s (value dimension)",
    ("LB.", "d"): "d (dimension of the INDEX instance)",
    ("SUB.softmax-sensitivity", "t"): "t = ||l - l̂||∞ (the logits' perturbation)",
}
INTEGER_KEYS = {"n", "d", "t", "T", "J", "m", "s", "layer", "position", "block_size", "ell", "l", "r_rank"}


def param_label(key: str, claim: str = "") -> str:
    """The axis label of a params key (with its unit), as the claim's family reads it."""
    check_text(key, "the params key")
    check_text(claim, "the claim id")
    for (prefix, k), label in FAMILY_LABELS.items():
        if k == key and claim.startswith(prefix):
            return label
    return PARAM_LABELS.get(key, key)


def y_label(spec: FigureSpec, shaped: bool = False, mixed: bool = False) -> str:
    if spec.ylabel:
        return spec.ylabel
    if spec.y == "ratio" and mixed:
        return "measured / bound, or / O(.) shape for shape sub-checks"
    head = spec.title.split(" vs ")[0].strip()
    named = "/" in head and len(head) <= 40          # the title names the ratio ("eps_hat / shape", "error / uniform's error")
    if spec.y == "ratio" and shaped:
        return f"{head} (its largest value is the fitted C)" if named else \
            "measured / O(.) shape (its largest value is the fitted C)"
    if spec.y == "ratio":
        return f"{head} (1 = at the bound)" if named else "measured / bound (1 = at the bound)"
    return head if 0 < len(head) <= 60 else "measured (units of its bound)"


def title_checks(spec: FigureSpec, checks: set[str]) -> set[str]:
    """For a spec coloured by sub-check with no sub-check named: the sub-checks whose name shares a word with
    what the title says is measured ("peak memory / ..." -> "memory gram", "memory rows"), so quantities in
    different units are not drawn on one axis. All of them when none or all match. Sub-checks listed by name in
    parentheses ("... (paper c, c=log, random signs)") are taken as the list."""
    for group in re.findall(r"\(([^()]*)\)", spec.title):
        norm = lambda x: re.sub(r"[\s-]+", " ", x.strip().lower())
        listed = {norm(x) for x in group.split(",")}
        named = {c for c in checks if norm(c) in listed}
        if len(named) >= 2:
            return named
    head = re.split(r"\s+vs\.?\s+", spec.title)[0].lower()
    words = {w for w in re.findall(r"[a-z][a-z-]{3,}", head)}
    hit = {c for c in checks if words & set(re.findall(r"[a-z][a-z-]{3,}", c.lower()))}
    return hit if hit and hit != checks else checks


def select_records(spec: FigureSpec, records: Sequence[Record]) -> list[Record]:
    """The records a spec draws: its sub-check (or the sub-checks its title names), and one sweep only."""
    recs = [r for r in records if (spec.check is None or r.check == spec.check)
            and all(r.params.get(k) == v for k, v in (spec.where or {}).items())]
    if spec.check is None and spec.hue == "check":
        keep = title_checks(spec, {r.check for r in recs})
        recs = [r for r in recs if r.check in keep]
    sweep = spec.sweep
    if sweep is None and any(r.params.get("sweep") == spec.x for r in recs):
        sweep = spec.x   # the sweep along this figure's x axis, not the others' centre points
    if sweep is not None:
        recs = [r for r in recs if r.params.get("sweep", sweep) == sweep]
    return recs


def fitted_constants(records: Sequence[Record], verdict_constant: float | None = None) -> dict[str, float]:
    """Per sub-check: the fitted constant of its shape records, max measured/shape (the verdict rule's C).
    When the verdict reports one constant and there is one shape sub-check, that constant is used."""
    out: dict[str, float] = {}
    for r in records:
        if r.bound_kind in SHAPE_KINDS and not r.control and np.isfinite(r.ratio):
            out[r.check] = max(out.get(r.check, 0.0), r.ratio)
    if verdict_constant is not None and len(out) == 1:
        out = {k: float(verdict_constant) for k in out}
    return out


def _frame(records: Sequence[Record], consts: dict[str, float]) -> pd.DataFrame:
    rows = []
    for r in records:
        c = consts.get(r.check, 1.0) if r.bound_kind in SHAPE_KINDS else 1.0
        log_bound = r.extra.get("log_scale")          # a bound beyond float64 keeps its logarithm there
        if not isinstance(log_bound, (int, float)) or isinstance(log_bound, bool):
            log_bound = math.log(r.bound) if r.bound > 0 and math.isfinite(r.bound) else math.nan
        zeros = (r.extra.get("controls_eps") or r.extra.get("controls") or {}).get("zeros")
        rows.append({**{k: v for k, v in r.params.items() if k not in ("measured", "bound", "ratio")},
                     "measured": r.measured, "bound": r.bound * c, "ratio": r.ratio, "check": r.check,
                     "control": "negative control" if r.control else "main", "shaped": r.bound_kind in SHAPE_KINDS,
                     "bound kind ": r.bound_kind, "log bound ": float(log_bound),     # spaces: never a params key
                     "zeros ": float(zeros) if isinstance(zeros, (int, float)) else math.nan})
    return pd.DataFrame(rows)


def _e(log_value: float) -> str:
    """A number given by its natural logarithm: e^61, or the number itself when it is printable."""
    return f"e^{log_value:.0f}" if log_value > 25 else _num(math.exp(log_value))


def bound_off_chart(main: pd.DataFrame, y: str, consts: dict[str, float]) -> str:
    """Why the bound of these records is not drawn on a ``measured`` axis, or "" when it can be: infinite (its
    logarithm said), OFF_CHART times above every measured value, or a shape whose fitted constant is below TINY_C
    (the shape with constant 1 is then what the claim says, and it is far off). Says "vacuous" where the records
    carry the error of returning zeros and the bound is above it."""
    if y != "measured" or main.empty or not np.isfinite(main["log bound "]).any():
        return ""
    data = float(pd.to_numeric(main["measured"], errors="coerce").abs().max())
    logs = main["log bound "][np.isfinite(main["log bound "])]
    shaped = bool(main["shaped"].all())
    tiny = shaped and any(consts.get(k, 1.0) < TINY_C for k in main["check"].unique())
    lo, med, hi = float(logs.min()), float(logs.median()), float(logs.max())
    if not (tiny or lo > math.log(OFF_CHART * max(data, 1e-300)) or not np.isfinite(main["bound"]).all()):
        return ""
    what = "the O(.)'s scale (constant 1)" if shaped else "the bound"
    spread = f" ({_e(lo)}..{_e(hi)})" if hi - lo >= 1 else ""
    text = f"{what} is {_e(med)} here{spread}, off the chart: every measured value is at most {_num(data)}"
    zeros = main["zeros "][np.isfinite(main["zeros "])]
    if len(zeros) and lo > math.log(max(float(zeros.max()), 1e-300)):
        text += f"; returning zeros (error at most {_num(float(zeros.max()))}) meets it too: vacuous at these norms"
    return "not drawn: " + text


def _levels(values) -> list:
    levels = list(pd.Series(values).dropna().unique())
    try:
        levels.sort()
    except TypeError:
        levels.sort(key=str)
    return levels


def _thin(levels: list, k: int = MAX_HUES) -> list:
    if len(levels) <= k:
        return levels
    idx = np.unique(np.round(np.linspace(0, len(levels) - 1, k)).astype(int))
    return [levels[i] for i in idx]


def _palette(levels: list) -> dict:
    numeric = all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in levels)
    if numeric and len(levels) > 2:   # ordered values: a dark-to-mid sequential ramp, no near-white end
        cmap = sns.color_palette("viridis", as_cmap=True)
        cols = [cmap(x) for x in np.linspace(0.0, 0.8, len(levels))]
    else:
        cols = sns.color_palette("colorblind", n_colors=max(len(levels), 1))
    return dict(zip([str(v) for v in levels], cols))


def _num(v: float) -> str:
    return f"{v:,.0f}" if 1000 <= abs(v) < 1e7 else f"{v:.3g}"


def _nice_ticks(lo: float, hi: float, k: int = 4) -> np.ndarray:
    vals = np.geomspace(lo, hi, k)
    return np.unique([float(f"{v:.2g}") for v in vals])


def _ticks(ax, axis: str, values: np.ndarray, log: bool) -> None:
    a = ax.xaxis if axis == "x" else ax.yaxis
    if not log:
        return
    uniq = np.unique(values[np.isfinite(values) & (values > 0)])
    if not len(uniq):
        return
    a.set_minor_formatter(NullFormatter())
    lo, hi = (ax.get_xlim() if axis == "x" else ax.get_ylim())
    if axis == "x" and 1 < len(uniq) <= 8:          # few swept values: tick exactly at them
        a.set_major_locator(FixedLocator(uniq))
        a.set_minor_locator(NullLocator())
        a.set_major_formatter(lambda v, _pos: _num(v))
    elif hi / max(lo, 1e-300) < 30:                 # under ~1.5 decades: a few round values, no 10^k gaps
        a.set_major_locator(FixedLocator(_nice_ticks(lo, hi)))
        a.set_minor_locator(NullLocator())
        a.set_major_formatter(lambda v, _pos: _num(v))
    else:
        a.set_major_locator(LogLocator(base=10, numticks=6))
        a.set_minor_locator(LogLocator(base=10, subs=np.arange(2, 10) * 0.1, numticks=12))


def draw_figure(spec: FigureSpec, records: Sequence[Record], path: Path,
                verdict_constant: float | None = None, counterexample: dict | None = None,
                labels: dict | None = None) -> tuple[str | None, str]:
    """Draw one spec to ``path``. Returns (note why it was skipped or None, caption addition). ``counterexample``
    (the verdict's) is marked where its x value is known; ``labels``, when given, receives the axis labels drawn."""
    consts = fitted_constants(records, verdict_constant)   # over all sweeps of each sub-check, as the verdict fits
    recs = select_records(spec, records)
    if not recs:
        return f"no records{' for sub-check ' + repr(spec.check) if spec.check else ''}", ""
    if not any(spec.x in r.params for r in recs):
        return f"x key {spec.x!r} not in the records' params", ""
    df = _frame(recs, consts)
    df = df[df[spec.x].notna()]
    if spec.hue and spec.hue not in df.columns:
        return f"hue key {spec.hue!r} not in the records", ""
    if spec.y not in df.columns:
        return f"y {spec.y!r} is neither 'measured' nor 'ratio'", ""
    y = pd.to_numeric(df[spec.y], errors="coerce").astype(float)
    df = df[np.isfinite(y) & ((y > 0) if spec.logy else True)].copy()
    if df.empty:
        return f"every value of {spec.y} is non-finite{' or <= 0 on a log axis' if spec.logy else ''}", ""
    logy = spec.logy
    if not logy and spec.hue == "check" and bool((df[spec.y] > 0).all()):
        med = df.groupby("check")[spec.y].median()
        if len(med) > 1 and med.max() > 30 * med.min():   # sub-checks in different units: a linear axis hides all but one
            logy = True
            caption_units = "log y axis: the sub-checks differ by orders of magnitude"
    numeric_x = pd.api.types.is_numeric_dtype(df[spec.x])
    logx = spec.logx and numeric_x and bool((df[spec.x] > 0).all()) and df[spec.x].nunique() > 1

    caption = [caption_units] if logy != spec.logy else []
    hue_col, order, palette = None, [None], {None: sns.color_palette("colorblind")[0]}
    if spec.hue:
        levels = _levels(df[spec.hue])
        shown = _thin(levels)
        if len(shown) < len(levels):
            caption.append(f"{len(shown)} of {len(levels)} values of {'sub-check' if spec.hue == 'check' else spec.hue} "
                           "shown")
            df = df[df[spec.hue].isin(shown)]
        hue_col = f"{spec.hue} "            # a separate column, so hue == x still works
        df[hue_col] = df[spec.hue].map(lambda v: cite(str(v)))        # papers by name, not by label
        order = [cite(str(v)) for v in shown]
        palette = dict(zip(order, _palette(shown).values()))
    style = "control" if df["control"].nunique() > 1 else None
    bands = ("pi", 90) if len(order) <= 3 else None

    fig = Figure(figsize=(6.4, 3.8), layout="constrained")      # the legend below the axes, room made for it
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    sns.lineplot(data=df, x=spec.x, y=spec.y, hue=hue_col, hue_order=order if hue_col else None,
                 palette=palette if hue_col else None, color=None if hue_col else palette[None],
                 estimator="median", errorbar=bands, ax=ax,
                 **(dict(style=style, markers=True, dashes=False) if style else dict(marker="o")))
    extra = []
    main = df[df["control"] == "main"]
    off = bound_off_chart(main, spec.y, consts)
    bound_levels: list[float] = []
    if spec.show_bound and spec.y == "measured" and not off:
        for lvl in order:
            sub = main if lvl is None else main[main[hue_col] == lvl]
            med = sub.groupby(spec.x)["bound"].median().sort_index()
            med = med[np.isfinite(med) & ((med > 0) if logy else True)]
            bound_levels += [float(x) for x in med.values]
            if len(med) > 1:
                ax.plot(med.index, med.values, ls="--", lw=1.3, color=palette[lvl])
            elif len(med):           # one x value: a line has no length, so a wide dash marks the bound
                ax.plot(med.index, med.values, ls="none", marker="_", ms=28, mew=1.6, color=palette[lvl])
        if main["shaped"].any():      # an O(.) has no number: the line is the shape scaled to the data, not a bound
            cs = ", ".join(f"{c:.3g}" for c in sorted({consts.get(k, 1.0) for k in main.loc[main['shaped'], 'check']}))
            extra.append(Line2D([], [], ls="--", color="0.3",
                                label=f"O(.) shape × fitted C = {cs} (no constant stated: not a bound)"))
        if (~main["shaped"]).any():
            kinds = sorted(set(main.loc[~main["shaped"], "bound kind "]))
            extra.append(Line2D([], [], ls="--", color="0.3",
                                label=KIND_LABELS.get(kinds[0], "bound") if len(kinds) == 1 else "bound as recorded"))
    if off:                          # said, not drawn (also where the spec hides a bound this far off)
        extra.append(Line2D([], [], ls="none", label=textwrap.fill("bound " + off, 46, break_on_hyphens=False)))
        caption.append("bound " + off)
    mixed = bool(len(main)) and bool(main["shaped"].any()) and bool((~main["shaped"]).any())
    if spec.y == "ratio":
        if (~main["shaped"]).any():       # a number on this axis only for the bounds with the paper's constants
            ax.axhline(1.0, ls=":", lw=1.3, color="k")
            extra.append(Line2D([], [], ls=":", color="k",
                                label="a-priori bounds (ratio = 1)" if mixed else "bound (ratio = 1)"))
        if main["shaped"].any():
            caption.append("shape sub-checks: measured / O(.) shape against the fitted constant C "
                           "(an O(.) bound has no number until C is fitted)")
        shaped_checks = sorted({k for k in main.loc[main["shaped"], "check"] if k in consts})
        for k in shaped_checks:
            colour = palette.get(cite(k), "0.35") if spec.hue == "check" else "0.35"
            # the fitted C is the largest measured ratio by construction: drawn as that (dotted, thin), never as a
            # bound the points could be seen to "hold" under
            label = (f"largest measured ratio = {consts[k]:.3g} (the fitted C; not a bound)"
                     + (f" ({cite(k)})" if len(shaped_checks) > 1 else ""))
            ax.axhline(consts[k], ls=(0, (1, 2)), lw=0.9, color=colour)
            extra.append(Line2D([], [], ls=(0, (1, 2)), color=colour, label=label))
    cx = _counterexample_point(counterexample, spec, records)
    if cx is not None:
        ax.plot([cx[0]], [cx[1]], marker="X", ms=11, color="#b71c1c", mec="white", mew=1.2, ls="none", zorder=5)
        extra.append(Line2D([], [], marker="X", ms=9, color="#b71c1c", ls="none", label="counterexample (smallest)"))
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    _ticks(ax, "x", df[spec.x].to_numpy(dtype=float) if numeric_x else np.array([]), logx)
    _ticks(ax, "y", df[spec.y].to_numpy(dtype=float), logy)
    if numeric_x and not logx and _integer_valued(df[spec.x]):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))          # no fractional ticks on an integer parameter
    leg = ax.get_legend()
    labels_all: list[str] = []
    handles = list(leg.legend_handles) if leg else []
    texts = [t.get_text().strip() for t in leg.texts] if leg else []
    if leg:
        leg.remove()
    if handles or extra:      # one legend, below the axes and the x label: it never hides a point nor a label
        labels_all = texts + [h.get_label() for h in extra]
        ncol = 1 if max(len(t) for t in labels_all for t in t.splitlines()) > 46 else 2
        if style and ncol == 2 and "control" in texts:     # seaborn's two sections (colour, marker): one per column
            handles, labels_all = _two_sections(handles + extra, labels_all, texts.index("control"))
            extra = []
        fig.legend(handles + extra, labels_all, fontsize=8, frameon=False, loc="outside lower center", ncol=ncol,
                   title=("sub-check" if spec.hue == "check" else spec.hue) if hue_col and not style else None,
                   title_fontsize=8)
        rows = sum(len(t.splitlines()) for t in labels_all) / ncol + 1
        fig.set_size_inches(6.4, 3.1 + 0.17 * rows)
    claim = recs[0].claim
    xlabel = spec.xlabel or param_label(spec.x, claim)
    ylabel = y_label(spec, bool(len(main)) and bool(main["shaped"].all()), mixed)
    ax.set_title(textwrap.fill(cite(spec.title), 70, break_on_hyphens=False), fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(textwrap.fill(ylabel, WRAP, break_on_hyphens=False), fontsize=9 if len(ylabel) > WRAP else None)
    ax.grid(True, which="major", alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_output(path, lambda tmp: fig.savefig(tmp, dpi=110, bbox_inches="tight", format="png"), own=True)
    if labels is not None:
        labels.update(x=xlabel, y=ylabel, counterexample=cx is not None, bound=sorted(set(bound_levels)),
                      legend=[t for t in labels_all if t] if handles or extra else [])
    return None, "; ".join(caption)


def _two_sections(handles: list, labels: list[str], split: int) -> tuple[list, list[str]]:
    """Legend entries laid out column by column so that the section starting at ``split`` (seaborn's "control"
    title) heads the second column: blank entries pad the shorter column."""
    first, second = list(zip(handles[:split], labels[:split])), list(zip(handles[split:], labels[split:]))
    rows = max(len(first), len(second))
    blank = lambda: (Line2D([], [], ls="none"), "")
    first += [blank() for _ in range(rows - len(first))]
    second += [blank() for _ in range(rows - len(second))]
    entries = [(h, "sub-check" if t == "check" else t) for h, t in first + second]
    return [h for h, _ in entries], [t for _, t in entries]


def _integer_valued(values) -> bool:
    v = pd.to_numeric(values, errors="coerce").to_numpy(dtype=float)
    return bool(len(v)) and bool(np.all(np.isfinite(v))) and bool(np.all(v == np.round(v)))


def _counterexample_point(cx: dict | None, spec: FigureSpec, records: Sequence[Record]) -> tuple | None:
    """(x, y) of the verdict's counterexample on this figure's axes, when its params have the x key and the
    figure draws its sub-check (or all sub-checks); None otherwise."""
    if not cx or spec.x not in (cx.get("params") or {}):
        return None
    if spec.check is not None and cx.get("check") != spec.check:
        return None
    x = cx["params"][spec.x]
    y = cx.get("measured") if spec.y == "measured" else cx.get("ratio")
    try:
        x, y = float(x), float(y)
    except (TypeError, ValueError):
        return None
    return (x, y) if np.isfinite(x) and np.isfinite(y) and (y > 0 or not spec.logy) else None

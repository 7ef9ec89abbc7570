"""The report: claim verdicts from the stored records, as a terminal table, ``summary.json`` and a
static ``report.html`` (jinja2 template ``templates/report.html.j2``) with figures under ``figures/``.

    build_verdicts(records)   one Verdict per registered claim (registry order), never raising,
    render_terminal(verdicts) the plain-text verdict matrix and findings the CLI prints,
    summary_dict(verdicts)    every Verdict field but the figures, for ``summary.json``,
    write_report(out_dir)     reads ``out_dir/results.jsonl``, writes ``report.html``, ``summary.json``
                              and ``figures/*.png``; returns the html path.

The page answers at a glance: a verdict matrix (claims x the verdict dimensions statement, proof, rate,
reproduction, power, with totals and each claim's headline), then one card per claim, the findings grouped
by kind, and the run's metadata. Verdicts that predate the dimensions fall back to their legacy ``status``.
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Iterable, Sequence

from kvbounds import claims as registry
from kvbounds.algorithms.validation import InputError, check_int
from kvbounds.core import check_output, check_output_dir, write_output
from kvbounds.core import DEFERRED, FIGURES_DIR, REPORT_FILES, Record, ResultStore, canonical
from . import _chips as report_chips
from ._chips import calls_worse, define  # noqa: F401
from ._meta import error_rows, leaderboard, run_metadata
from ._words import (check_text, check_verdict, check_verdicts, counterexample_in_words, infinite_ratios,
                     params_in_words, spread_words)
from ._summary import group_by_kind, summary_dict, summary_extras, summary_json, unique_findings  # noqa: F401
from ._glance import DIMENSIONS, GLANCE_LABELS, LEGACY_STATEMENT, at_a_glance, dimensions, glance_category, glance_split
from kvbounds.verdict import (FAILS, HOLDS, HOLDS_FITTED, INCONCLUSIVE, NO_CHECK, NOT_REFUTED, NOT_RUN, VACUOUS,
                              Verdict, finalize)
from kvbounds.core import store_writer

FIG_DIR = FIGURES_DIR
MAX_FIGURES = 2          # per claim card
EVIDENCE_CHARS = 110

# colour class of a dimension value: good / bad / warn / none
TONE = {"holds": "good", "holds-fitted": "good", "sound": "good", "observed": "good", "reproduced": "good",
        "shown": "good", "better": "good", "false": "bad", "fails": "bad", "reversed": "bad", "not-reproduced": "bad",
        "worse": "bad", "errata": "warn", "not-reached": "warn", "partial": "warn", "low": "warn",
        "inconclusive": "warn", "not-refuted": "warn", "not-shown": "warn", "vacuous": "warn", "tied": "warn",
        "not-tested": "none"}


class ReportError(Exception):
    """The report cannot be built (no records where it was asked to look)."""


# ---------------------------------------------------------------------------------------- verdicts

def build_verdicts(records: Sequence[Record], claims: Iterable[str] | None = None) -> dict[str, Verdict]:
    """One verdict per claim of ``registry.CLAIMS`` (or of ``claims``), in registry order.

    A check module that fails to import or whose ``summarize`` raises gives an ``inconclusive``
    verdict carrying the exception text; the report itself never fails on a check's bug."""
    wanted = set(check_claims(claims)) if claims is not None else None
    by_claim: dict[str, list[Record]] = defaultdict(list)
    for i, r in enumerate(records):
        if not isinstance(r, Record):
            raise InputError(f"records[{i}] is a {type(r).__name__}, not a Record")
        by_claim[r.claim].append(r)
    out: dict[str, Verdict] = {}
    for cid, claim in registry.CLAIMS.items():
        if wanted is not None and cid not in wanted:
            continue
        recs, deferred = split_deferred(by_claim.get(cid, []))
        if not claim.has_check:
            v = Verdict(cid, NO_CHECK, "no check registered yet")
        elif not recs and deferred:
            v = Verdict(cid, NOT_RUN, "every trial recorded so far was deferred (too large for its backend)")
        elif not recs:
            v = Verdict(cid, NOT_RUN, "check registered, no records yet")
        else:
            try:
                v = claim.check_module().summarize(recs)
                if not isinstance(v, Verdict):
                    raise TypeError(f"summarize returned {type(v).__name__}, not Verdict")
            except Exception as e:  # noqa: BLE001 - a broken check must not take the report down
                v = Verdict(cid, INCONCLUSIVE, f"summarize raised {type(e).__name__}: {e}")
            v.n_records = v.n_records or len(recs)
        v.kind = v.kind or claim.kind
        v.deferred = deferred_text(deferred)
        try:   # dimensions, headline and legacy status by the shared rules, for every verdict
            out[cid] = finalize(v)
        except ValueError as e:   # a check that set an invalid dimension: say so instead of failing the report
            out[cid] = finalize(Verdict(cid, INCONCLUSIVE, f"invalid verdict from the check: {e}", kind=claim.kind))
    return out


def check_claims(claims) -> list[str]:
    """The claim ids a report is restricted to: an iterable of registered ids (not one string, which would be read
    as its letters); anything else is an InputError naming the id."""
    if isinstance(claims, (str, bytes)) or not isinstance(claims, Iterable):
        raise InputError(f"claims is {claims!r}, not a list of claim ids")
    claims = list(claims)
    for c in claims:
        if not isinstance(c, str) or c not in registry.CLAIMS:
            raise InputError(f"claims: {c!r} is not a registered claim id")
    return claims


def split_deferred(records: Sequence[Record]) -> tuple[list[Record], list[Record]]:
    """(measured, deferred): a deferred record (check "deferred", see ``proofs_checks.common.deferred_record``)
    holds no measurement; it stays deferred only while no backend has measured the same parameters."""
    measured = [r for r in records if r.check != DEFERRED]
    done = {canonical(r.params) for r in measured}
    return measured, [r for r in records if r.check == DEFERRED and canonical(r.params) not in done]


def deferred_text(deferred: Sequence[Record]) -> str:
    """'k trial(s) deferred on <backends>: <sweep> = a..b (reason)', one clause per sweep, sorted."""
    if not deferred:
        return ""
    groups: dict[tuple, list] = defaultdict(list)
    for r in deferred:
        p = r.params
        sweep = str(p.get("sweep", ""))        # a string as the runner writes it; any stored value reads as text
        key = next((k for k in ("t", "n") if k in p and sweep.startswith(k)), "n")
        groups[(sweep, key, str(r.extra.get("deferred", "")))].append((p.get(key), r.backend))
    parts = []
    for (sweep, key, why), vals in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        xs = [int(x) if float(x).is_integer() else x for x in sorted({x for x, _ in vals if isinstance(x, (int, float))
                                                                           and math.isfinite(x)})]
        rng = f"{key} = " + (f"{xs[0]}..{xs[-1]}" if len(xs) > 1 else f"{xs[0]}") if xs else key
        backends = ", ".join(sorted({b for _, b in vals}))
        parts.append(f"{len(vals)} trial(s) of the {sweep or key} sweep deferred on {backends}: {rng} ({why})")
    return "; ".join(parts)


def headline(v: Verdict) -> str:
    check_verdict(v)
    return v.headline or v.status


def tone(value: str) -> str:
    v = check_text(value, "the verdict value").lower()
    if v in TONE:
        return TONE[v]
    if v.startswith(("false", "fails", "not reproduced", "reversed")):
        return "bad"
    if any(w in v for w in ("no better than", "worse than", "not shown better than", "tied with", "not told apart",
                            "not attainable")):
        return "warn"                  # a hold that a control also earns (or beats) is no evidence of power
    if v.startswith(("holds", "reproduced", "bound holds")):
        return "good"
    if v in ("n/a", "not-run", "no-check", "not run", "no check"):
        return "none"
    return "warn"


def statement_tone(v: Verdict) -> str:
    """The statement chip's colour (:func:`kvbounds.report._chips.statement_tone`)."""
    value = dimensions(v)["statement"]
    return report_chips.statement_tone(v, value, tone(value))


def card_tone(v: Verdict) -> str:
    """The headline chip's colour, never greener than the statement's."""
    return report_chips.card_tone(tone(headline(v)), statement_tone(v), dimensions(v)["statement"])


def evidence(v: Verdict, n: int = EVIDENCE_CHARS) -> str:
    """One readable line: for a failing claim its first finding (the reason), else the summary's first clause."""
    if tone(headline(v)) == "bad" and v.findings:
        f = v.findings[0]
        title = re.sub(rf"^{re.escape(v.claim)}\s*:?\s*", "", f.title) or f.title
        return one_line(title + (f" (+{len(v.findings) - 1} more)" if len(v.findings) > 1 else ""), n)
    return one_line(v.summary, n)


def one_line(s: str, n: int = EVIDENCE_CHARS) -> str:
    """The first clause of ``s`` (up to its first "; "), papers named, cut to ``n`` characters with an ellipsis."""
    check_text(s)
    check_int(n, "n", minimum=1)
    s = " ".join(registry.cite(s).split())
    first = re.split(r"(?<=;) ", s)[0].rstrip(";")
    return first if len(first) <= n else first[: n - 1] + "\u2026"


# ---------------------------------------------------------------------------------------- terminal

def render_terminal(verdicts: dict[str, Verdict]) -> str:
    """Plain-text verdict matrix: one row per claim (headline, dimensions, one line of evidence), totals, findings."""
    check_verdicts(verdicts)
    short = {"statement": "statement", "proof": "proof", "rate": "rate", "reproduction": "repro", "power": "power"}
    head = ("claim", *short.values(), "headline")
    rows = []
    for cid, v in verdicts.items():
        d = dimensions(v)
        rows.append((cid, *(d[k].replace("n/a", "-") for k in short), headline(v)))
    w = [max([len(head[i])] + [len(r[i]) for r in rows]) for i in range(len(head) - 1)]
    fmt = lambda r: "  ".join(f"{c:<{w[i]}}" for i, c in enumerate(r[:-1])) + "  " + r[-1]
    lines = [fmt(head), "-" * (sum(w) + 2 * len(w) + 8)] + [fmt(r).rstrip() for r in rows]
    counts = Counter(dimensions(v)["statement"] for v in verdicts.values())
    lines += ["", "Statements: " + ", ".join(f"{k} {n}" for k, n in counts.most_common())]
    unique = unique_findings(verdicts)
    lines += ["", f"Findings ({len(unique)})" if unique else "Findings: none"]
    for kind, fs in group_by_kind(unique).items():
        lines.append(f"  {kind} ({len(fs)})")
        for f in fs:
            lines.append(f"  - {f['title']}  [{', '.join(f['claims'])}]")
            lines.append(f"      {f['detail']}")
            if f["smallest_input"]:
                lines.append(f"      smallest input: {params_in_words(f['smallest_input'])}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------- html

def source_path(dotted: str) -> str:
    """Repository path of a module (``kvbounds.theory.subgen:fn`` -> ``theory/subgen.py: fn``)."""
    if not dotted:
        return ""
    mod, _, fn = check_text(dotted, "the module path").partition(":")
    parts = mod.split(".")
    if len(parts) > 2 and parts[0] == "kvbounds" and parts[1] in ("theory", "algorithms", "proofs_checks", "gpu",
                                                                  "traces"):
        parts = parts[1:]
    return "/".join(parts) + ".py" + (f": {fn}" if fn else "")


def _constant_rows(v: Verdict) -> list[dict]:
    rows = []
    for c in (v.proven_constant, v.fitted_constant):
        if c is not None:
            rows.append({"kind": c.kind, "value": f"{c.value:.3g}", "what": registry.cite(c.what),
                         "spread": spread_words(c.spread)})
    if not rows and v.constant is not None:
        rows.append({"kind": v.constant_kind or "fitted", "value": f"{v.constant:.3g}", "what": "",
                     "spread": spread_words(v.constant_spread)})
    return rows


def _card(cid: str, v: Verdict, figures: list) -> dict:
    from kvbounds.battery import CONTROL_LABELS, power_table_cells
    c = registry.CLAIMS[cid]
    return {
        "id": cid, "anchor": "claim-" + re.sub(r"[^A-Za-z0-9_-]", "_", cid), "family": c.family,
        "kind": v.kind or c.kind, "statement": c.statement, "source": c.source,
        "papers": [p.citation() for p in registry.papers_in(c.source)],
        "headline": headline(v), "tone": card_tone(v), "dims": dimensions(v),
        "dim_tones": dict({d: tone(val) for d, val in dimensions(v).items()}, statement=statement_tone(v)),
        "evidence": evidence(v), "summary": registry.cite(v.summary), "n_records": v.n_records,
        "constants": _constant_rows(v),
        "counterexample": counterexample_in_words(v.counterexample) if v.counterexample else "",
        "corrected": registry.cite(v.corrected),
        "errata": [{"where": registry.cite(e.where), "what": registry.cite(e.what), "corrected": registry.cite(e.corrected),
                    "input": params_in_words(e.smallest_input) if e.smallest_input else ""} for e in v.errata],
        "rate_info": dataclasses.asdict(v.rate_info) if v.rate_info else None,
        "reproductions": [dataclasses.asdict(r) for r in v.reproductions], "power_detail": v.power_detail,
        "power_table": power_table_cells(v.power_table) if v.power_table else None,
        "power_inf": infinite_ratios(v.power_table, CONTROL_LABELS),
        "findings": [{"kind": f.kind, "title": registry.cite(f.title), "detail": registry.cite(f.detail),
                      "input": params_in_words(f.smallest_input) if f.smallest_input else ""} for f in v.findings],
        "deferred": v.deferred, "figures": figures, "bound_path": source_path(c.bound), "check_path": source_path(c.check),
    }


def _draw_all(verdicts: dict[str, Verdict], records: Sequence[Record], fig_dir: Path) -> dict[str, list]:
    """Per claim: up to MAX_FIGURES drawn figures (src, title, caption) and notes for the ones skipped."""
    try:
        from ._figures import draw_figure, select_records
    except ImportError as e:   # the `report` extra (matplotlib, seaborn, pandas) is not installed
        return {cid: [{"src": None, "title": spec.title, "caption": "", "alt": "",
                       "note": f"no figures without {e.name}: pip install 'kvbounds[report]'"} for spec in v.figures]
                for cid, v in verdicts.items()}
    by_claim: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        by_claim[r.claim].append(r)
    if fig_dir.is_dir():       # figures of an earlier report must not outlive it
        for old in fig_dir.glob("*.png"):
            old.unlink()
    out: dict[str, list] = {}
    for cid, v in verdicts.items():
        out[cid] = []
        const = v.fitted_constant.value if v.fitted_constant else (v.constant if v.constant_kind == "fitted" else None)
        seen = set()
        for i, spec in enumerate(v.figures):
            if sum(1 for f in out[cid] if f["src"]) >= MAX_FIGURES:
                break
            sig = (spec.x, spec.y, spec.hue, tuple(id(r) for r in select_records(spec, by_claim.get(cid, []))))
            if sig in seen:
                out[cid].append({"src": None, "title": registry.cite(spec.title), "caption": "", "alt": "",
                                 "note": "the same records as a figure above"})
                continue
            seen.add(sig)
            name = re.sub(r"[^A-Za-z0-9._-]", "_", f"{cid}_{i}") + ".png"
            labels: dict = {}
            try:
                note, caption = draw_figure(spec, by_claim.get(cid, []), fig_dir / name, const, v.counterexample,
                                            labels)
            except Exception as e:  # noqa: BLE001 - one bad figure must not lose the report
                note, caption = f"drawing failed: {type(e).__name__}: {e}", ""
            title = registry.cite(spec.title)
            alt = (f"{cid}: {title}. y axis: {labels.get('y', '')}; x axis: {labels.get('x', '')}"
                   + ("; the smallest counterexample marked with a red cross" if labels.get("counterexample") else ""))
            out[cid].append({"src": None if note else f"{FIG_DIR}/{name}", "title": title, "alt": alt,
                             "caption": caption, "note": note, "xlabel": labels.get("x", ""),
                             "ylabel": labels.get("y", "")})
    return out


def _matrix_totals(verdicts: dict[str, Verdict]) -> dict[str, list]:
    totals = {}
    for k in DIMENSIONS:
        cnt = Counter(dimensions(v)[k] for v in verdicts.values())
        totals[k] = [(val, n, tone(val)) for val, n in cnt.most_common() if val != "n/a"]
    return totals


def _env():
    import jinja2
    env = jinja2.Environment(loader=jinja2.PackageLoader("kvbounds.report", "templates"),
                             autoescape=jinja2.select_autoescape(["html", "j2"]), trim_blocks=True,
                             lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    env.filters["tone"] = tone
    env.filters["define"] = define
    from ._practitioner import fmt
    env.filters["fmt_value"] = fmt
    return env


def render_html(verdicts: dict[str, Verdict], records: Sequence[Record], figures: dict[str, list], *,
                meta: dict | None = None, errors: Sequence = (), board: list[dict] | None = None,
                board_figure: str | None = None, glossary_links: bool = False, practitioner: dict | None = None,
                curves: dict | None = None) -> str:
    """The page; ``glossary_links`` links each glossary term's first occurrence per section (``write_report``
    does), else only the glossary itself is there."""
    cards = [_card(cid, v, figures.get(cid, [])) for cid, v in verdicts.items()]
    groups = {kind: [{"claims": [(c, "claim-" + re.sub(r"[^A-Za-z0-9_-]", "_", c)) for c in f["claims"]],
                      "title": f["title"], "detail": f["detail"],
                      "input": params_in_words(f["smallest_input"]) if f["smallest_input"] else ""} for f in fs]
              for kind, fs in group_by_kind(unique_findings(verdicts)).items()}
    from ._leaderboard import board_table
    from ._power import first_table
    from ._paper_answers import paper_answers
    from ._glossary import TERMS, grouped
    from ._html import finish
    from ._decisions import html_answers
    from .markdown import as_summary
    import markupsafe
    read = html_answers(as_summary(verdicts, board, practitioner, meta))
    read["papers"] = [(t, markupsafe.Markup(h)) for t, h in read["papers"]]
    read["decision"] = [markupsafe.Markup(h) for h in read["decision"]]
    return finish(_env().get_template("report.html.j2").render(
        glossary=grouped(), answers=paper_answers(verdicts), practitioner=practitioner, read=read,
        nothing=first_table(verdicts),
        cards=cards, dims=DIMENSIONS, totals=_matrix_totals(verdicts), glance=at_a_glance(verdicts),
        groups=groups, n_findings=sum(len(fs) for fs in groups.values()), meta=meta or run_metadata(records, verdicts, Path(".")),
        errors=error_rows(errors), board=board_table(board) if board else None, board_figure=board_figure,
        curves=curves,
        papers=[(p.citation(), p.url) for p in registry.PAPERS.values()]), TERMS if glossary_links else ())


def refuse_evaluate_store(out: Path) -> None:
    """ReportError when ``out`` is a ``kvbounds evaluate`` store: the report reads and writes `kvbounds check` stores
    only (an evaluation has its own card, evaluation.html)."""
    if store_writer(out) == "evaluate":
        raise ReportError(f"{out} is a `kvbounds evaluate` store (its card is {out / 'evaluation.html'}); `kvbounds "
                          "report` reads the stores `kvbounds check` writes")


def write_report(out_dir, claims: Iterable[str] | None = None) -> Path:
    """Build verdicts from ``out_dir/results.jsonl``; write report.html, summary.json, figures/*.png.

    Raises ReportError when the directory or its records are missing (nothing to report on) or it is a ``kvbounds
    evaluate`` store, OutputRefused (before anything is written) when report.html or summary.json is a link onto
    another file of the store, a device, a FIFO or a directory, or figures/ is a link or holds such a file. Every
    file is written to a temporary file and renamed (kvbounds.core._output_files)."""
    out = Path(out_dir)
    store = ResultStore(out)
    if out.exists() and not out.is_dir():
        raise ReportError(f"{out} is a file, not a directory; pass the directory `kvbounds check --out` wrote")
    if not out.is_dir():
        raise ReportError(f"{out} does not exist; run `kvbounds check --out {out}` first")
    refuse_evaluate_store(out)
    contents = store.read()          # one pass over results.jsonl: records and error records together
    records = contents.records
    if not records:
        raise ReportError(f"{store.path} holds no records; run `kvbounds check --out {out}` first")
    for name in REPORT_FILES:
        check_output(out / name, own=True)
    check_output_dir(out / FIG_DIR, "*.png")
    verdicts = build_verdicts(records, claims)
    errors = contents.errors
    if claims is not None:
        records = [r for r in records if r.claim in verdicts]
        errors = [e for e in errors if e.claim in verdicts]
    figures = _draw_all(verdicts, records, out / FIG_DIR)
    board = leaderboard(records)
    board_fig = None
    if board:
        from ._leaderboard import draw_board
        try:
            board_fig = draw_board(board, out / FIG_DIR / "leaderboard.png") and f"{FIG_DIR}/leaderboard.png"
        except ImportError:
            board_fig = None
    curves = _curves(records, out / FIG_DIR / "e2e_curves.png")
    meta = run_metadata(records, verdicts, out)
    extras = summary_extras(records, verdicts, meta, board)
    write_output(out / "summary.json", summary_json(verdicts, extras), own=True)
    path = out / "report.html"
    write_output(path, render_html(verdicts, records, figures, meta=meta, errors=errors, board=board,
                                   board_figure=board_fig, glossary_links=True,
                                   practitioner=extras["practitioner"], curves=curves), own=True)
    return path


def _curves(records, path: Path) -> dict | None:
    """The end-to-end curves' words and figure (:mod:`kvbounds.report.curves`): this run's, else the committed ones."""
    from . import curves as RC
    data = RC.curves_data(records)
    if data is None:
        return None
    try:
        figure = RC.draw(data, path) and f"{FIG_DIR}/{path.name}"
    except ImportError:
        figure = None
    return dict(provenance=data["provenance"], figure=figure, exact=RC.exact_lines(data),
                decisions=RC.decision_lines(data), timing=RC.timing_lines(data), depth=RC.depth_table(data))

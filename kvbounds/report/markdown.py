"""The report as markdown (``kvbounds report --markdown FILE``; ``make results-md`` writes docs/RESULTS.md): what was
found first, from the same verdicts as the html report.

    per paper         each paper's main theorems in plain sentences (:mod:`kvbounds.report._answers`)
    should I use it?  the decision map per budget and task that ran (:mod:`kvbounds.report._decisions`), then the
                      practitioner's table (each paper method against StreamingLLM and uniform sampling)
    at a glance       counts by statement (reproduction for empirical claims)
    verdict matrix    one row per registered claim: its dimensions, headline and one line of evidence
    findings          each finding once, with the claims it concerns (:func:`kvbounds.report._report.unique_findings`)
    leaderboard       the end-to-end leaderboard's tables, when there are end-to-end records
    claims            per claim, every verdict field that is set, rendered generically (so fields added later,
                      a power table or a "beats doing nothing" comparison, appear without changes here)
    glossary          every word of the verdicts defined (:mod:`kvbounds.report`, as in the html report)
    run               version, profile, wall and CPU time

Papers are named by their short names (``registry.cite``) throughout.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

from kvbounds import claims as registry
from ._glossary import markdown_section
from kvbounds.core import Record
from ._words import check_text, check_verdicts, counterexample_in_words, params_in_words
from kvbounds.verdict import Verdict
from kvbounds.core import check_output, write_output
from kvbounds.core import ResultStore
from kvbounds.core import OutputRefused, check_output, write_output

__all__ = ["anchor", "power_row", "answers_lines", "render_markdown", "write_markdown", "render_from_summary",
           "FOUND_BEGIN", "FOUND_END", "found_block", "splice", "main"]

# fields shown in the matrix or not meant for a reader; every other set field is rendered per claim
_SHOWN_ELSEWHERE = {"claim", "status", "kind", "statement", "proof", "rate", "reproduction", "power", "headline",
                    "figures", "findings", "n_records", "constant", "constant_spread", "constant_kind"}


def anchor(cid: str) -> str:
    """The markdown anchor of a claim id (``claim-`` and the id, every character but letters, digits, - and _ as -)."""
    check_text(cid, "the claim id")
    return "claim-" + "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in cid)


def _cell(text) -> str:
    """One table cell: papers named, one line, pipes escaped, and underscores and asterisks escaped (a formula's
    subscript or product renders as written, not as emphasis)."""
    return escape_math(" ".join(registry.cite(str(text)).split())).replace("|", "\\|")


def escape_math(text: str) -> str:
    """``text`` with ``_`` and ``*`` escaped, so that markdown renders a formula's characters as written."""
    return text.replace("\\", "\\\\").replace("_", "\\_").replace("*", "\\*")


def _value(v, depth: int = 0) -> list[str]:
    """Markdown lines for one verdict field's value: scalars inline, dataclasses and dicts as nested bullets."""
    pad = "  " * depth
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        v = {f.name: getattr(v, f.name) for f in dataclasses.fields(v)}
    elif isinstance(v, dict):       # a plain dict's keys sorted, as summary.json stores them (report.summary_read)
        v = dict(sorted(v.items()))
    if isinstance(v, dict):
        if all(not isinstance(x, (dict, list)) and not dataclasses.is_dataclass(x) for x in v.values()):
            return [pad + "- " + "; ".join(f"{k}: {_cell(x)}" for k, x in v.items() if x not in (None, "", [], {}))]
        out = []
        for k, x in v.items():
            if x in (None, "", [], {}):
                continue
            sub = _value(x, depth + 1)
            out += [f"{pad}- {k}:"] + sub
        return out
    if isinstance(v, (list, tuple)):
        if all(isinstance(x, (int, float, str)) for x in v):
            return [pad + "- " + ", ".join(_cell(x) for x in v)]
        return [line for x in v for line in _value(x, depth)]
    return [pad + "- " + _cell(v)]


def _short(x) -> str:
    if isinstance(x, float):
        return f"{x:.3g}"
    if isinstance(x, dict):
        return ", ".join(f"{k} {_short(v)}" for k, v in sorted(x.items()))
    if isinstance(x, (list, tuple)):
        return ", ".join(_short(v) for v in x)
    return str(x)


def power_row(row: dict) -> str:
    """One setting of a power table on one line (numbers to 3 significant digits; its calls left out: the verdict's
    power calls say them)."""
    return "; ".join(f"{k.replace('_', ' ')}: {_short(v)}" for k, v in sorted(row.items())
                     if k != "calls" and v not in (None, "", [], {}))


def _claim_section(cid: str, v: Verdict, findings: list[dict]) -> list[str]:
    from ._report import dimensions, headline
    c = registry.CLAIMS[cid]
    d = dimensions(v)
    lines = [f'<a id="{anchor(cid)}"></a>', f"### {cid}: {_cell(headline(v))}", "",
             f"*{c.kind}, {c.family}; source: {_cell(c.source)}; {v.n_records} records*", "",
             f"> {_cell(c.statement)}", "",
             "Verdict: " + ", ".join(f"{k} **{val}**" for k, val in d.items() if val != "n/a"), ""]
    for f in dataclasses.fields(v):
        val = getattr(v, f.name)
        if f.name in _SHOWN_ELSEWHERE or val in (None, "", [], {}, "n/a"):
            continue
        if f.name == "counterexample":                # in words, as the html report shows it
            val = "the smallest input, " + counterexample_in_words(val)
        elif f.name in ("power_calls", "power_table"):   # one line per call in words, per setting (its calls aside)
            from kvbounds.verdict import call_words
            lines.append(f"- **{f.name.replace('_', ' ')}**:")
            lines += ["  - " + _cell(call_words(x, metric=True) if f.name == "power_calls" else power_row(x))
                      for x in val]
            continue
        elif f.name == "errata":
            val = [dict(dataclasses.asdict(e), smallest_input=params_in_words(e.smallest_input)) for e in val]
        if isinstance(val, str):
            lines.append(f"- **{f.name.replace('_', ' ')}**: {_cell(val)}")
        else:
            lines.append(f"- **{f.name.replace('_', ' ')}**:")
            lines += ["  " + line for line in _value(val)]
    mine = [f for f in findings if cid in f["claims"]]
    if mine:
        lines.append("- **findings**: " + ", ".join(f"[{f['id']}](#findings) {f['title']}" for f in mine))
    return lines + [""]


def _leaderboard(rows: list[dict] | None) -> list[str]:
    if not rows:
        return []
    from ._leaderboard import board_table
    t = board_table(rows)
    lines = ["## End-to-end leaderboard", "",
             "Per metric and budget, methods ranked by mean effect with a 95% interval; **best** and those "
             "statistically tied with it marked; floats held per method beside each row.", ""]
    for tab in t["tables"]:
        lines += [f"**{tab['title']}**", "", "| rank | method | source | mean [95% CI] | n | floats held | mark |",
                  "|---|---|---|---|---|---|---|"]
        for r in tab["rows"]:
            lines.append(f"| {r['rank']} | {r['method']} | {r['source']} | {r['text']} {r['ci']} | {r['n']} | "
                         f"{r['floats']} | {r['mark']} |")
        lines.append("")
    if t["references"]:
        lines += ["Reference: " + "; ".join(t["references"]), ""]
    if t["collapsed"]:
        lines += ["Tables without information (collapsed):", ""] + [f"- {c}" for c in t["collapsed"]] + [""]
    return lines


def as_summary(verdicts: dict[str, Verdict], board: list[dict] | None = None, practitioner: dict | None = None,
               run: dict | None = None) -> dict:
    """summary.json's form of the verdicts and extras, as the answers read it (:mod:`kvbounds.report._answers`)."""
    import json
    from ._summary import summary_json
    return json.loads(summary_json(verdicts, {"leaderboard": board or [], "practitioner": practitioner or {},
                                              "run": run or {}}))


def answers_lines(summary: dict, level: str = "##", glossary: str = "#glossary", base: str = "") -> list[str]:
    """The per-paper answers and the decision map (:mod:`kvbounds.report._answers`); ``glossary``: where the words
    are defined; ``base``: the page the claims' anchors are on ("" for this page)."""
    from ._decisions import markdown_lines
    lines = markdown_lines(summary, level, base)
    return lines[:2] + [f"The words (fitted constant, vacuous, tied, StreamingLLM, H2O, SnapKV, ...) are defined in the "
                        f"[glossary]({glossary}).", ""] + lines[2:]


def render_markdown(verdicts: dict[str, Verdict], records: Sequence[Record], meta: dict,
                    board: list[dict] | None = None, practitioner: dict | None = None,
                    papers: dict | None = None, summary: dict | None = None) -> str:
    check_verdicts(verdicts)
    if board:                       # the answers read the rows: an InputError naming the bad row comes first
        from ._rows import check_board_rows
        check_board_rows(board)
    from ._report import DIMENSIONS, at_a_glance, dimensions, evidence, headline, unique_findings
    findings = unique_findings(verdicts)
    lines = ["# kvbounds results", "",
             f"Generated by `make results-md` (or `kvbounds report --markdown`) from {meta.get('records', len(records))} records "
             f"(kvbounds {meta.get('version', '')}, profile {meta.get('profile', '')}"
             + (f", {meta['duration']}" if meta.get("duration") else "") + "). Papers: "
             + "; ".join(f"{p.short} ({p.url or p.where})" for p in registry.PAPERS.values()) + ".", ""]
    lines += answers_lines(summary if summary is not None else as_summary(verdicts, board, practitioner, meta))
    if practitioner:
        from ._practitioner import markdown_lines as table_lines
        lines += ["## Each paper method against StreamingLLM and uniform sampling", "",
                  "The practitioner's table: each method of the papers inside the model against exact attention and "
                  "the better of StreamingLLM and uniform sampling (95% intervals over instances). The call is the one "
                  "rule's, on the practitioner's metric (a task's score; for decode, the relative attention error of "
                  "the generated tokens' queries): a paired test at the unit (an instance, a distinct prompt or text "
                  "window; a generation), Holm over the stated family; **better** / **leaning better** / **tied** / "
                  "**leaning worse** / **worse**, or **not attainable** with too few units.", ""]
        lines += table_lines(practitioner)
    lines += ["## At a glance", ""]
    lines += [f"- {n} {label}" for label, n, _ in at_a_glance(verdicts)] + [""]
    lines += ["## Verdict matrix", "", "Every word of the verdicts is defined in the [glossary](#glossary).", "",
              "| claim | kind | " + " | ".join(DIMENSIONS) + " | headline | evidence |",
              "|---|---|" + "---|" * (len(DIMENSIONS) + 2)]
    for cid, v in verdicts.items():
        d = dimensions(v)
        dims = " | ".join("·" if d[k] == "n/a" else d[k] for k in DIMENSIONS)
        lines.append(f"| [{cid}](#{anchor(cid)}) | {registry.CLAIMS[cid].kind} | {dims} | {_cell(headline(v))} | "
                     f"{_cell(evidence(v))} |")
    lines += ["", '<a id="findings"></a>', f"## Findings ({len(findings)} unique)", ""]
    if not findings:
        lines.append("none")
    for f in findings:
        claims = ", ".join(f"[{c}](#{anchor(c)})" for c in f["claims"])
        lines.append(f"- **{f['id']}** [{f['kind']}] {_cell(f['title'])} ({claims}): {_cell(f['detail'])}"
                     + (f" Smallest input: {params_in_words(f['smallest_input'])}." if f["smallest_input"] else ""))
    lines.append("")
    lines += _leaderboard(board)
    lines += ["## Claims", ""]
    for cid, v in verdicts.items():
        lines += _claim_section(cid, v, findings)
    lines += markdown_section()
    lines += ["## Run", "", f"- kvbounds {meta.get('version', '')}, commit {meta.get('commit', '')}",
              f"- profile: {meta.get('profile', '')}; seeds: {meta.get('seeds', '')}; backends: {meta.get('backends', '')}",
              f"- duration: {meta.get('duration') or 'not recorded'}; {meta.get('trial_time', '')}", ""]
    return "\n".join(lines)


def write_markdown(out_dir, path, claims=None) -> Path:
    """Markdown of the records in ``out_dir`` to ``path`` (ReportError as ``write_report`` when there are none;
    OutputRefused, before any work, when ``path`` is a file a result store owns: kvbounds.core._output_files)."""
    from ._report import ReportError, build_verdicts, refuse_evaluate_store
    from ._meta import leaderboard, run_metadata
    out = Path(out_dir)
    check_output(path, stores=[out])
    if out.is_dir():
        refuse_evaluate_store(out)
    records = ResultStore(out).load() if out.is_dir() else []
    if not records:
        raise ReportError(f"{out / 'results.jsonl'} holds no records; run `kvbounds check --out {out}` first")
    from kvbounds.e2e import timing_rows
    from ._practitioner import practitioner_table
    verdicts = build_verdicts(records, claims)
    meta = run_metadata(records, verdicts, out)
    board = leaderboard(records)
    text = render_markdown(verdicts, records, meta, board, practitioner_table(board, verdicts, timing_rows(records)))
    return write_output(path, text, stores=[out])


def render_from_summary(summary: dict, link: str = "docs/RESULTS.md") -> tuple[str, str]:
    """(docs/RESULTS.md, the README's what-we-found block) from summary.json alone
    (:mod:`kvbounds.report.summary_read`)."""
    from .summary_read import verdicts_from_summary
    verdicts = verdicts_from_summary(summary)
    run = summary.get("run") or {}
    board = summary.get("leaderboard") or None
    text = render_markdown(verdicts, [], run, board, summary.get("practitioner"), summary.get("papers"), summary)
    return text, found_block(verdicts, link, summary=summary, run_meta=run)


# ------------------------------------------------------------------------------------------ README block
FOUND_BEGIN, FOUND_END = "<!-- what-we-found: begin (generated by `make results-md`) -->", "<!-- what-we-found: end -->"
_ORDER = {"bad": 0, "warn": 1, "good": 2, "none": 3}


def run_line(run: dict | None) -> list[str]:
    """The line that names the run the block is rendered from: its profile, records, wall and CPU time, commit."""
    if not run:
        return []
    how = {"full": " (`make report PROFILE=full`, the committed profile)",
           "quick": " (`make report`, the smoke run)"}.get(run.get("profile", ""), "")
    parts = [f"{run['records']} records" if run.get("records") else "", run.get("duration") or "",
             run.get("trial_time") or "", f"kvbounds {run['version']}" if run.get("version") else "",
             f"commit {run['commit']}" if run.get("commit") else ""]
    return [f"Rendered from the **{run.get('profile') or 'unknown'}** profile's run{how}: "
            + "; ".join(p for p in parts if p) + ".", ""]


def found_block(verdicts: dict[str, Verdict], link: str = "docs/RESULTS.md", n: int = 100, *,
                summary: dict | None = None, run_meta: dict | None = None) -> str:
    """The README's "What we found": the run it is rendered from (:func:`run_line`: the profile named), the
    per-paper answers and the decision map (:func:`answers_lines`), the counts (those that partition the claims,
    then those that overlap), then every claim that was run, the false and not-reproduced ones first (claim,
    verdict, one line of evidence, link to its section of ``link``)."""
    check_verdicts(verdicts)
    from ._report import evidence, glance_split, headline, tone
    run = [(cid, v) for cid, v in verdicts.items() if tone(headline(v)) != "none"]
    run.sort(key=lambda kv: _ORDER[tone(headline(kv[1]))])
    parts, overlap = glance_split(verdicts)
    counts = (f"Each of the {len(verdicts)} claims in one category: "
              + "; ".join(f"{k} {label}" for label, k, _ in parts) + ".")
    if overlap:
        counts += " Across them (a claim can count in several): " + "; ".join(f"{k} {label}" for label, k, _ in overlap) + "."
    summary = summary if summary is not None else as_summary(verdicts)
    lines = [FOUND_BEGIN, ""] + run_line(run_meta) + answers_lines(summary, "###", f"{link}#glossary", link) + [
             "### Every claim", "", counts, "", "| claim | verdict | evidence |", "|---|---|---|"]
    for cid, v in run:
        lines.append(f"| [{cid}]({link}#{anchor(cid)}) | {_cell(headline(v))} | {_cell(evidence(v, n))} |")
    if len(run) < len(verdicts):
        lines += ["", f"{len(verdicts) - len(run)} of {len(verdicts)} claims have no records in this run."]
    return "\n".join(lines + ["", FOUND_END])


def splice(text: str, block: str) -> str:
    """``text`` with the part between the what-we-found markers replaced by ``block`` (markers included)."""
    i, j = text.find(FOUND_BEGIN), text.find(FOUND_END)
    if i < 0 or j < i:
        raise ValueError(f"no {FOUND_BEGIN!r} ... {FOUND_END!r} markers")
    return text[:i] + block + text[j + len(FOUND_END):]


def main(argv=None) -> int:
    """``python -m kvbounds.report.markdown OUT_DIR README.md``: rewrite the README's what-we-found block from the
    records in OUT_DIR; ``python -m kvbounds.report.markdown SUMMARY.json README.md [RESULTS.md]``: rewrite it (and
    RESULTS.md) from a summary.json alone (``make results-md``). Atomically; exit 2 with one line, nothing written,
    when README.md or RESULTS.md may not be written (a file a result store owns, a device, a FIFO, a directory, a
    path inside a result store other than OUT_DIR, or the command's own input: RESULTS.md = SUMMARY.json or
    README.md, README.md = the source) or README.md has no markers."""
    import sys
    from ._report import ReportError, build_verdicts
    args = argv if argv is not None else sys.argv[1:]
    if len(args) not in (2, 3) or (len(args) == 3 and Path(args[0]).is_dir()):
        print("usage: python -m kvbounds.report.markdown OUT_DIR|SUMMARY.json README.md [RESULTS.md]", file=sys.stderr)
        return 2
    source, readme = args[0], args[1]
    stores = [source] if Path(source).is_dir() else []
    try:
        check_output(readme, stores=stores, inputs=[source])
        if len(args) == 3:
            check_output(args[2], stores=stores, inputs=[source, readme])
        if Path(source).is_dir():
            records = ResultStore(source).load()
            if not records:     # a README block saying that nothing ran would replace the real one
                raise ReportError(f"{Path(source) / 'results.jsonl'} holds no records; run `kvbounds check --out "
                                  f"{source}` first")
            block = found_block(build_verdicts(records))
        else:
            from .summary_read import load_summary
            results, block = render_from_summary(load_summary(source))
            if len(args) == 3:
                write_output(args[2], results, stores=stores, inputs=[source, readme])
        text = splice(Path(readme).read_text(encoding="utf-8"), block)
        write_output(readme, text, stores=stores, inputs=[source])
    except (OutputRefused, ReportError, ValueError) as e:   # ValueError: no markers in README.md, or an InputError
        print(f"kvbounds: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"kvbounds: cannot rewrite {readme}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

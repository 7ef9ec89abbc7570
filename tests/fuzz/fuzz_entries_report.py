"""Fuzz entries of the report layer (kvbounds.report*, paper_answers, practitioner, summary_read, glossary): the
surfaces a user reaches with their own files (a summary.json, a results directory) mutated one value at a time, and
the pure helpers on fuzzed numbers and strings.

A mutation replaces one value of a small real summary (a claim's verdict field at any depth, the papers' answers,
the practitioner's table, the leaderboard, the run) or one field of a stored record with a fuzzed value (NaN, inf,
a string, None, a list, an empty object) or deletes it; the place is drawn from the fuzzed array's bytes. The
report must then render (no "nan" in the text where a number was asked for) or refuse with an InputError naming
the claim and the field; a results directory with no usable records is the documented ReportError."""
from __future__ import annotations

import copy
import json
import math
import re
import tempfile
import zlib
from functools import lru_cache
from pathlib import Path

import numpy as np

from fuzz_harness import Entry, as_numpy, make_array

from kvbounds.report import _glossary as glossary
from kvbounds.report import _paper_answers as pa
from kvbounds.report import _practitioner as pr
from kvbounds.report import _report as rp
from kvbounds.report import _chips as chips
from kvbounds.report import _figures as rf
from kvbounds.report import _glance as rg
from kvbounds.report import _html as rh
from kvbounds.report import _leaderboard as rl
from kvbounds.report import markdown as rm
from kvbounds.report import _meta as meta
from kvbounds.report import _power as rpow
from kvbounds.report import _summary as rs
from kvbounds.report import _rows as report_rows
from kvbounds.report import _words as rw
from kvbounds.report import summary_read as sr
from kvbounds.algorithms.validation import InputError
from kvbounds.core import Record

ROOT = Path(__file__).resolve().parents[2]
# claims whose verdicts hold every kind of field (a counterexample, errata, a rate, reproductions, a power table and
# paired calls, a vacuity, a fitted constant), kept small so that a render costs milliseconds
SUMMARY_CLAIMS = ("BKV.attention", "BKV.decode", "SG.attention", "SUB.lowrank", "BKV.e2e", "LB.index", "NORM.bounded")
DELETE = object()
NAN_WORD = re.compile(r"(?<![\w.-])nan(?![\w-])")        # a float printed as Python writes NaN


@lru_cache(maxsize=1)
def base_summary() -> str:
    s = json.loads((ROOT / "docs" / "summary.json").read_text(encoding="utf-8"))
    return json.dumps({k: v for k, v in s.items() if k in SUMMARY_CLAIMS or k in rs.SUMMARY_KEYS})


def _paths(x, prefix=()):
    """Every path (the keys and indices from the root) of a JSON tree."""
    items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list) else ()
    for k, v in items:
        yield prefix + (k,)
        yield from _paths(v, prefix + (k,))


def _draw(values) -> int:
    return zlib.crc32(repr(as_numpy(values)).encode())


def _replacement(values, value, pick: int):
    """The new value: a JSON file holds no complex number, so a complex array arrives as its numbers' text."""
    v = as_numpy(values)
    if np.iscomplexobj(v):
        v = np.array([str(x) for x in np.ravel(v)])
    value = str(value) if isinstance(value, complex) else value
    first = float(np.ravel(v)[0]) if np.size(v) and np.asarray(v).dtype.kind in "biuf" else math.nan
    options = (value, first, v.tolist() if isinstance(v, np.ndarray) else v, DELETE, "text", {}, [], -first)
    return options[pick % len(options)]


def mutate(tree, values, value):
    """``tree`` with one value (at a place drawn from ``values``) replaced or deleted; the path and the new value."""
    tree = copy.deepcopy(tree)
    paths = list(_paths(tree))
    pick = _draw(values)
    path = paths[pick % len(paths)]
    new = _replacement(values, value, pick // len(paths))
    parent = tree
    for k in path[:-1]:
        parent = parent[k]
    if new is DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = new
    return tree, path, new


def _values(rng, cls):
    return dict(values=make_array(rng, (int(rng.integers(1, 4)),), cls))


def _no_nan_text(texts) -> str | None:
    for t in texts:
        m = NAN_WORD.search(t)
        if m:
            return f"'nan' in the text: ...{t[max(0, m.start() - 80):m.end() + 40]}..."
    return None


def _summary_call(values, value):
    """summary.json mutated at one place, written and read back (load_summary), then every reader of it: the
    markdown, the README block, the papers' answers, the terminal table, the glance and power tables, the words and
    a round trip through what the report writes."""
    summary, path, new = mutate(json.loads(base_summary()), values, value)
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
        summary = sr.load_summary(Path(d) / "summary.json")
    verdicts = sr.verdicts_from_summary(summary)
    text, block = rm.render_from_summary(summary)
    answers = pa.paper_answers(verdicts)
    words = [rw.what_the_records_show(verdicts, list(verdicts)), rp.render_terminal(verdicts),
             "\n".join(a["answer"] for a in answers.values()), rm.splice(f"a\n{rm.FOUND_BEGIN}\n{rm.FOUND_END}\n", block)]
    for cid, v in verdicts.items():
        head = rp.headline(v)
        words += [rw.verdict_in_words(v), rp.evidence(v), rp.one_line(v.summary), chips.define(head),
                  rp.statement_tone(v), rp.card_tone(v), rp.tone(head), rg.glance_category(v), rpow.nothing_label(v),
                  str(rg.dimensions(v)), str(chips.calls_worse(v)), "\n".join(rw.infinite_ratios(v.power_table)),
                  rw.counterexample_in_words(v.counterexample or {}), rw.spread_words(v.constant_spread),
                  rm.power_row(v.power_table[0]) if v.power_table else "", rp.source_path(cid)]
    words += [str(rg.at_a_glance(verdicts)), str(rg.glance_split(verdicts)), str(rpow.first_table(verdicts)),
              str(rpow.power_glance(verdicts)), str(rs.group_by_kind(rs.unique_findings(verdicts))),
              rm.anchor(str(path[0])), "\n".join(rm.answers_lines(summary))]
    back = rs.summary_json(verdicts, {k: summary[k] for k in rs.SUMMARY_KEYS if k in summary and k != "findings"})
    sr.verdicts_from_summary(json.loads(back))          # what the report writes reads back
    return text, block, words, sr.compact(summary)


def _check_summary(out, values, value):
    text, block, words, _ = out
    return _no_nan_text([text, block] + words)


@lru_cache(maxsize=1)
def base_html() -> str:
    s = json.loads(base_summary())
    verdicts = sr.verdicts_from_summary(s)
    return rp.render_html(verdicts, [], {}, meta=dict(s["run"], generated="today", orphans=""), board=s["leaderboard"],
                          glossary_links=False, practitioner=s["practitioner"])


def _html_call(text, n):
    """The html finisher on the page with fuzzed text inserted (tags, entities, glossary words)."""
    html = base_html()[:24000]          # the head, the matrix and the first cards: a finish costs milliseconds
    cut = min(len(html), max(0, int(n))) if isinstance(n, (int, float)) and math.isfinite(n) else len(html) // 2
    page = html[:cut] + str(text) + html[cut:]
    out = rh.finish(page)
    return out, rh.term_pattern().pattern[:10]


# -------------------------------------------------------------------------------- results directories

def _record_lines(values):
    """Records of four small claims as a check stores them (the smoke profile's shapes), measured / bound from the
    fuzzed values, as JSON objects."""
    v = np.ravel(as_numpy(values)).tolist() if np.size(as_numpy(values)) else [0.0]
    lines = []
    for i in range(6):
        x = v[i % len(v)]
        x = x.real if isinstance(x, complex) else x
        for claim, params in (("SB.cost", dict(n=2 ** (i + 4), d=4, sweep="n")),
                              ("SG.reservoir", dict(n=64, s=2 + i, sweep="s")),
                              ("MR.memory", dict(n=2 ** (i + 6), d=8, sweep="n")),
                              ("BKV.attention", dict(n=2 ** (i + 5), d=4, sweep="n", rep=i))):
            rec = Record(claim, params, 0, "numpy", abs(float(x)) if not isinstance(x, bool) else 1.0, 1.0,
                         True, bound_kind="shape", source="SubGen Thm 1", time_s=0.01)
            lines.append(json.loads(rec.to_json()))
    return lines


def _store_call(values, value, claims):
    """A results directory with one stored record mutated: the verdicts, the markdown, the terminal table, the run's
    metadata and the figures' data (records selected, constants fitted)."""
    lines, path, new = mutate(_record_lines(values), values, value)
    with tempfile.TemporaryDirectory() as d:
        out = Path(d)
        (out / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
        try:
            md = rm.write_markdown(out, out / "RESULTS.md", claims=claims)
        except rp.ReportError as e:                 # the documented refusal: no records to report on
            raise InputError(f"ReportError: {e}") from None
        from kvbounds.core import ResultStore
        contents = ResultStore(out).read()
        recs = contents.records
        verdicts = rp.build_verdicts(recs, claims)
        m = meta.run_metadata(recs, verdicts, out)
        spec_words = []
        for cid, v in verdicts.items():
            for spec in v.figures:
                sel = rf.select_records(spec, recs)
                spec_words += [rf.y_label(spec), rf.param_label(spec.x, cid), str(rf.title_checks(spec, {"a"})),
                               str(rf.fitted_constants(sel, v.constant))]
        words = [md.read_text(encoding="utf-8"), rp.render_terminal(verdicts), str(m), meta.infer_profile(recs),
                 str(meta.trial_seconds(recs)), str(meta.error_rows(contents.errors)), rp.deferred_text(recs),
                 str(rs.summary_dict(verdicts, rs.summary_extras(recs, verdicts, m, meta.leaderboard(recs))))]
        return words + spec_words, len(rp.split_deferred(recs)[0])


def _check_store(out, values, value, claims):
    return _no_nan_text(out[0][:2])


# -------------------------------------------------------------------------------- pure helpers

def _number_call(values, key, params, spread, cx):
    """The words of fuzzed numbers, then of ``params``, ``spread`` and ``cx`` as given (fuzzed parameters)."""
    return _numbers_in_words(values, key) + [rw.params_in_words(params), rw.spread_words(spread),
                                              rw.counterexample_in_words(cx)]


def _numbers_in_words(values, key):
    v = as_numpy(values)
    xs = np.ravel(v).tolist() if isinstance(v, np.ndarray) else v if isinstance(v, list) else [v]
    params = {str(key): xs[0] if xs else 0, "n": xs, "sweep": "n", "rule": "alg1"}
    return ([rw.number(x) for x in xs] + [rw.value_in_words(str(key), xs), rw.params_in_words(params),
                                         rw.spread_words(xs[:2] if len(xs) >= 2 else None),
                                         rw.counterexample_in_words(dict(params=params, measured=xs[0] if xs else 0,
                                                                         bound=xs[-1] if xs else 0, seed=0))])


def _check_number(out, values, key, params, spread, cx):
    v = np.ravel(np.asarray(values)).tolist()
    for x, text in zip(v, out):
        if isinstance(x, float) and math.isnan(x) and text != "not a number":
            return f"NaN as {text!r}"
        if isinstance(x, float) and math.isfinite(x) and x != 0 and float(text) != float(f"{x:.4g}"):
            return f"{x} as {text!r}"
    return _no_nan_text([t.replace(f"{key} = ", "") for t in out])     # the parameter's name may read "nan"


def _interval_arrays(rng, cls):
    return dict(method=make_array(rng, (3,), cls), base=make_array(rng, (3,), cls))


def _as_value(a):
    """A leaderboard row's value and 95% interval (value, ci_low, ci_high) from three fuzzed numbers."""
    v = as_numpy(a)
    xs = (list(np.ravel(np.asarray(v, dtype=object)).tolist() if not isinstance(v, list) else v) + [None] * 3)[:3]
    lo, hi = xs[1], xs[2]
    if all(isinstance(x, float) and not math.isnan(x) for x in (lo, hi)):
        lo, hi = min(lo, hi), max(lo, hi)
    return {"value": xs[0], "ci_low": lo, "ci_high": hi, "n": 8}


def _practitioner_call(method, base, lower_better):
    rows = []
    for name, a in (("balancekv", method), ("streaming_llm", base), ("uniform", base), ("exact", base)):
        for budget in (0.25, 0.5, 1.0):
            v = _as_value(a)
            units = {f"i{k}": v["value"] + 0.01 * k for k in range(8)} if isinstance(v["value"], float) else {}
            rows.append(dict(v, method=name, metric="ppl: NLL increase vs exact (nats/token)", units=units,
                             budget=budget, family="ours" if name == "balancekv" else "baselines"))
    timing = [dict(method="balancekv", n=64, compress_s=_as_value(method)["value"], prefill_s=0.1, count=2)]
    table = pr.practitioner_table(rows, {}, timing)
    m, b = ({"value": r["value"], "ci": [r["ci_low"], r["ci_high"]], "n": 8} for r in (rows[0], rows[3]))
    for v, name in ((m, "the method's value"), (b, "the baseline's value")):
        pr.check_value(v, name)
    c = pr.comparison(rows[0], rows[3], rows[0]["metric"], "balancekv | ppl | 25%", "StreamingLLM")
    return (table["rows"][0]["call"] if table else "not tested", pr.fmt(m), pr.fmt(b), pr.per_token_ms(timing),
            pr.markdown_lines(table), pr.in_words(table["rows"]) if table else "", pr.method_words("balancekv"),
            c.reason)


def _check_interval(out, method, base, lower_better):
    if out[0] not in ("better", "leaning better", "tied", "leaning worse", "worse", "not attainable", "not tested"):
        return f"call {out[0]!r}"
    return _no_nan_text([out[1], out[2], "\n".join(out[4]), out[5]])


def _text_arrays(rng, cls):
    return dict(codes=make_array(rng, (int(rng.integers(1, 30)),), cls))


WORDS = ("holds", "holds-fitted", "not-reached", "worse", "uniform sample", "released walk at temp 1",
         "BalanceKV:streaming", "streaming SubGen", "k-center", "Frequent Directions", "<b>", "&amp;", "vacuous",
         "StreamingLLM", "balance", "gamma=", ":fd", "sized", "", " ", "\u2026", "claim-1")


def _text(codes) -> str:
    """A string drawn from the fuzzed codes: glossary words, tags, entities and raw characters."""
    v = np.ravel(np.asarray(as_numpy(codes), dtype=complex)).real if np.size(as_numpy(codes)) else np.zeros(0)
    out = []
    for x in v:
        i = int(abs(x) * 1e3) % (len(WORDS) + 64) if math.isfinite(x) else 0
        out.append(WORDS[i] if i < len(WORDS) else chr(32 + i * 7 % 0x2fff))
    return " ".join(out)


def _words_call(codes, algorithm, word, n):
    """The helpers on a drawn string, then on ``word`` and ``n`` as given (a fuzzed parameter: None, NaN, a number)."""
    t = _text(codes)
    term = glossary.term_for(t)
    out = (pa.short_variant(t, algorithm), term.name if term else "", chips.define(t), rm.anchor(t),
           rp.one_line(t, 20), meta.one_line(t, 20), rf.param_label(t), rh.finish(f"<p>{t}</p><table></table>"),
           rp.tone(t), chips.card_tone("good", t, t), [g for g, _ in glossary.grouped()],
           len(glossary.markdown_section()), [glossary.Term.__name__], report_rows.short_repr(t))
    given = (pa.short_variant(word), glossary.term_for(word), chips.define(word), rm.anchor(word), rp.one_line(word, n),
             meta.one_line(word, n), rf.param_label(word), rp.tone(word), rp.source_path(word), rw.check_text(word),
             report_rows.short_repr(word))
    return out, given


def _check_words(out, codes, algorithm, word, n):
    out = out[0]
    if len(out[4]) > 20 or len(out[5]) > 20:
        return f"one_line kept {len(out[4])} / {len(out[5])} characters of 20"
    if not re.fullmatch(r"claim-[\w-]*", out[3]):
        return f"anchor {out[3]!r}"
    if len(out[-1]) > 60:
        return f"short_repr kept {len(out[-1])} characters of 60"
    return None


def _board_arrays(rng, cls):
    return dict(values=make_array(rng, (int(rng.integers(1, 5)),), cls))


def _board_call(values, metric):
    v = np.ravel(np.asarray(as_numpy(values), dtype=complex)).real.tolist() if np.size(as_numpy(values)) else []
    rows = [dict(method=m, metric=str(metric), budget=b, value=x, ci_low=x - 1, ci_high=x + 1, n=4, rank=1,
                 family="ours" if m == "balancekv" else "baselines", budget_label=f"{b}", memory_floats=100,
                 note="", tied=False, best=False, source="kvbounds")
            for x in v for m in ("balancekv", "uniform") for b in (0.25, 0.5)]
    return rl.board_table(rows), rl.board_panels({}), rm.render_markdown({}, [], {}, rows, None, None)


def _check_board(out, values, metric):
    return _no_nan_text([out[2].replace(str(metric), "")])             # the metric's name may read "nan"


ENTRIES = [
    Entry("load_summary+verdicts_from_summary+verdict_from_dict+render_from_summary+render_markdown+found_block+"
          "splice+answers_lines+paper_answers+compose+answer+groups+markdown_lines+render_terminal+summary_json+"
          "summary_dict+compact+at_a_glance+glance_split+first_table+power_glance+unique_findings+group_by_kind+"
          "check_summary_extras+check_row+check_rows+fits_row",
          _values, dict(value=1.0), _summary_call, _check_summary, torch_ok=False),
    Entry("render_html+finish+term_pattern", lambda r, c: {}, dict(text="<b>holds</b> &amp; worse", n=5000),
          _html_call, torch_ok=False),
    Entry("write_markdown+build_verdicts+check_claims+split_deferred+deferred_text+run_metadata+leaderboard+"
          "infer_profile+"
          "trial_seconds+error_rows+summary_extras+select_records+fitted_constants+y_label+title_checks",
          _values, dict(value=1.0, claims=("SB.cost", "SG.reservoir", "MR.memory", "BKV.attention")),
          _store_call, _check_store, torch_ok=False),
    Entry("number+value_in_words+params_in_words+spread_words+counterexample_in_words", _values,
          dict(key="eps", params={"n": 4, "eps": 0.1}, spread=(0.5, 1.0), cx={"measured": 1.0, "bound": 0.5}),
          _number_call, _check_number, torch_ok=False),
    Entry("practitioner_table+comparison+fmt+check_value+per_token_ms+in_words+method_words", _interval_arrays,
          dict(lower_better=True), _practitioner_call, _check_interval, torch_ok=False),
    Entry("short_variant+term_for+define+anchor+one_line+param_label+tone+card_tone+source_path+check_text+grouped+"
          "markdown_section+Term+short_repr",
          _text_arrays, dict(algorithm="SubGen", word="holds-fitted", n=20), _words_call, _check_words,
          torch_ok=False),
    Entry("board_table+board_panels+render_markdown[leaderboard]", _board_arrays, dict(metric="passkey: exact match"),
          _board_call, _check_board, torch_ok=False),
]


# Public callables of the report layer that are not fuzz entries, each with its reason (tests/fuzz/test_fuzz.py)
NOT_ENTRY_POINTS = {
    # the report's refusal (raised by write_report / write_markdown on a directory without records: the entries
    # above count it as clear) and a glossary term (a data holder, built by the glossary's entry)
    "ReportError",
    # matplotlib drawings of records and leaderboard rows (a second per figure; tests/report/test_report.py draws them
    # on
    # the smoke store and checks the files), and the figure's annotation of the bound above the axes
    "draw_figure", "draw_board", "bound_off_chart",
    # the report's files on a store (seconds: every figure drawn; tests/report/test_report.py and test_report_page.py
    # run
    # it on the smoke store, corrupted stores included); the store entry above reaches build_verdicts and its
    # markdown through write_markdown
    "write_report",
    # the report's refusal of a `kvbounds evaluate` store (a directory; tests/test_store_safety.py)
    "refuse_evaluate_store",
    # the git commit of the working tree (no arguments; a subprocess)
    "git_commit",
    # command lines over files, run as subprocesses with their rc and one line (tests/report/test_summary_read.py,
    # test_results_md.py, test_output_files.py)
    "main",
}


def _practitioner_board_call(values, value):
    """The practitioner's table from the leaderboard's rows of docs/summary.json, one value mutated."""
    board, path, new = mutate(json.loads(base_summary())["leaderboard"], values, value)
    text, cells = rm.render_markdown({}, [], {}, board), str(rl.board_table(board))
    table = pr.practitioner_table(board, {}, None)
    return pr.markdown_lines(table), table["in_words"] if table else "", text, cells


ENTRIES.append(Entry("practitioner_table+render_markdown+board_table+check_board_rows[mutated leaderboard rows]",
                     _values, dict(value=1.0), _practitioner_board_call,
                     lambda out, **kw: _no_nan_text(["\n".join(out[0]), out[1], out[2], out[3]]),
                     torch_ok=False))


@lru_cache(maxsize=1)
def base_verdicts() -> dict:
    return sr.verdicts_from_summary(json.loads(base_summary()))


def _verdict_call(claim, value, value_tone, n):
    """The helpers of one verdict and of the verdicts, with ``claim`` naming a verdict of the small summary (a fuzzed
    claim that names none is passed as the verdict itself: None, NaN, a number) and the chips' strings fuzzed."""
    verdicts = base_verdicts()
    v = verdicts.get(claim, claim) if isinstance(claim, str) else claim
    vs = {claim: v} if isinstance(claim, str) else claim
    return (rp.headline(v), rp.evidence(v, n), rp.statement_tone(v), rp.card_tone(v), chips.calls_worse(v),
            chips.statement_tone(v, value, value_tone), chips.card_tone(value_tone, value_tone, value),
            rg.dimensions(v), rg.glance_category(v), rw.verdict_in_words(v), rw.check_verdict(v),
            rp.render_terminal(vs), rg.at_a_glance(vs), rs.unique_findings(vs), pa.groups(vs), rm.found_block(vs),
            rm.render_markdown(vs, [], {}), rw.what_the_records_show(vs, list(vs)), rw.check_verdicts(vs))


ENTRIES.append(Entry("headline+evidence+statement_tone+card_tone+calls_worse+dimensions+glance_category+"
                     "verdict_in_words+check_verdict+check_verdicts+render_terminal+at_a_glance+unique_findings+groups+"
                     "found_block+render_markdown+what_the_records_show", lambda r, c: {},
                     dict(claim="SG.attention", value="holds", value_tone="good", n=110), _verdict_call,
                     lambda out, **kw: _no_nan_text([out[-4], out[-3]]), torch_ok=False))

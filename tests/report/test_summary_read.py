"""A summary.json or a results directory that a user hands to the report: a file that is not a summary, a verdict
field of the wrong type, a power call or a practitioner's row missing what the markdown reads. Each was found by the
report's fuzz entries (tests/fuzz/fuzz_entries_report.py) as a traceback (TypeError, KeyError, AttributeError) or, for
an
empty results directory, a README rewritten to say that nothing ran; each is now an InputError naming the file, the
claim and the field, and the command lines exit 2 with one line, writing nothing."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from kvbounds.report import markdown as report_markdown
from kvbounds.report import summary_read
from kvbounds.algorithms.validation import InputError
from kvbounds.report.markdown import FOUND_BEGIN, FOUND_END, render_from_summary
from kvbounds.report.summary_read import load_summary, verdict_from_dict, verdicts_from_summary

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def summary() -> dict:
    return load_summary(ROOT / "docs" / "summary.json")


@pytest.fixture
def readme(tmp_path) -> Path:
    p = tmp_path / "README.md"
    p.write_text(f"intro\n{FOUND_BEGIN}\nold\n{FOUND_END}\n", encoding="utf-8")
    return p


def _run(main, args, capsys) -> tuple[int, str]:
    rc = main([str(a) for a in args])
    return rc, capsys.readouterr().err.strip()


@pytest.mark.parametrize("text, words", [
    ('{"BKV.attention": 5}', ["claim 'BKV.attention'", "int 5"]),        # was: TypeError from verdict_from_dict
    ("not json", ["summary.json", "is not JSON"]),                          # was: the parser's words, no file named
    ("[1, 2]", ["summary.json", "JSON list"]),
    ('{"BKV.attention": {"claim": "BKV.attention", "status": "holds"}}', ["'summary'"]),
])
def test_the_markdown_cli_refuses_a_bad_summary_in_one_line(tmp_path, readme, capsys, text, words):
    src = tmp_path / "summary.json"
    src.write_text(text, encoding="utf-8")
    before = readme.read_text(encoding="utf-8")
    rc, err = _run(report_markdown.main, [src, readme, tmp_path / "RESULTS.md"], capsys)
    assert rc == 2 and len(err.splitlines()) == 1 and all(w in err for w in words), err
    assert readme.read_text(encoding="utf-8") == before and not (tmp_path / "RESULTS.md").exists()
    rc, err = _run(summary_read.main, [src, tmp_path / "out.json"], capsys)
    assert rc == 2 and len(err.splitlines()) == 1 and not (tmp_path / "out.json").exists()


def test_a_missing_summary_is_named_and_an_empty_store_leaves_the_readme(tmp_path, readme, capsys):
    """A missing SOURCE said "cannot rewrite README.md" (rc 1); an empty results directory rewrote the README's
    block to say that no claim has records."""
    rc, err = _run(report_markdown.main, [tmp_path / "nope.json", readme], capsys)
    assert rc == 2 and "cannot read" in err and "nope.json" in err
    (tmp_path / "store").mkdir()
    before = readme.read_text(encoding="utf-8")
    rc, err = _run(report_markdown.main, [tmp_path / "store", readme], capsys)
    assert rc == 2 and "holds no records" in err and readme.read_text(encoding="utf-8") == before


def _mutated(summary, cid, path, value):
    s = copy.deepcopy(summary)
    node = s[cid]
    for k in path[:-1]:
        node = node[k]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return s


@pytest.mark.parametrize("cid, path, value, words", [
    ("BKV.attention", ("statement",), 5, "'statement' is 5, not a string"),
    ("BKV.attention", ("statement",), "maybe", "statement = 'maybe' is not one of"),
    ("BKV.attention", ("summary",), KeyError, "has no 'summary'"),
    ("BKV.attention", ("constant_spread",), [1.0], "'constant_spread' is [1.0]"),
    ("LB.index", ("errata", 0), "x", "errata[0] is str"),
    # a call the words do not know: was KeyError in power_calls.call_words
    ("BKV.attention", ("power_calls", 0, "call"), "text", "power_calls[0]: 'call' is 'text'"),
    # an interval of no numbers: was ValueError (unpacking) in power_calls.numbers
    ("BKV.attention", ("power_calls", 4, "ci"), {}, "power_calls[4]: 'ci' is {}"),
    # a count that is an object: was TypeError in report_power.first_table
    ("BKV.attention", ("power_calls", 13, "n"), {}, "power_calls[13]: 'n' is {}"),
    # a table of numbers: was AttributeError in report_markdown.power_row
    ("SG.attention", ("power_table",), [1e-311, 2e-310], "power_table[0] is 1e-311"),
    # a practitioner's row without its prefill time: was KeyError in practitioner.markdown_lines
    ("practitioner", ("rows", 7, "prefill_ms"), KeyError, "practitioner: rows[7] has no 'prefill_ms'"),
    # a method name that is a number: was printed as "nan" in the leaderboard's table
    ("leaderboard", (45, "method"), float("nan"), "leaderboard[45]: 'method' is nan, not a string"),
])
def test_a_mutated_summary_is_refused_by_claim_and_field(summary, cid, path, value, words):
    bad = _mutated(summary, cid, path, value)
    with pytest.raises(InputError, match=None) as e:
        render_from_summary(bad)
    assert words in str(e.value) and (cid in str(e.value)), str(e.value)


def test_verdict_from_dict_names_where():
    with pytest.raises(InputError, match=r"^claim 'X': 'n_records' is 'many', not an integer"):
        verdict_from_dict({"claim": "X", "status": "holds", "summary": "", "n_records": "many"}, "claim 'X'")
    with pytest.raises(InputError, match="claim ids are strings"):
        verdicts_from_summary({1: {}})
    v = verdict_from_dict({"claim": "X", "status": "holds", "summary": "s", "constant": "inf"})
    assert v.constant == float("inf")          # summary.json's non-finite strings still read back as floats

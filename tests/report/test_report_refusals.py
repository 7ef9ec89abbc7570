"""The report's helpers on input they cannot read, found by the report's fuzz entries
(tests/fuzz/fuzz_entries_report.py):
each was a traceback, a silent empty report or a "nan" in the text, and is now an InputError naming what is wrong."""
from __future__ import annotations

import pytest

from kvbounds.algorithms.validation import InputError


def test_the_report_helpers_refuse_what_they_cannot_read():
    """Found by the fuzz entries: a claims argument of one string (read as its letters: no claim reported), a
    non-string sweep in a stored record (AttributeError in deferred_text), a NaN or complex interval (printed as
    "nan", or a TypeError) and an infinite timing (inf ms per token) in the practitioner's table."""
    from kvbounds.report import _practitioner as pr
    from kvbounds.core import Record
    from kvbounds.report._report import build_verdicts, deferred_text
    with pytest.raises(InputError, match="not a list of claim ids"):
        build_verdicts([], "BKV.attention")
    with pytest.raises(InputError, match="'NOPE' is not a registered claim id"):
        build_verdicts([], ["NOPE"])
    with pytest.raises(InputError, match=r"records\[0\] is a dict"):
        build_verdicts([{"claim": "BKV.attention"}])
    r = Record("BKV.attention", {"n": 64, "sweep": 1.0}, 0, "numpy", float("nan"), float("nan"), False,
               check="deferred", extra={"deferred": "too large"})
    assert deferred_text([r]) == "1 trial(s) of the 1.0 sweep deferred on numpy: n = 64 (too large)"
    with pytest.raises(InputError, match="ci is"):
        pr.fmt({"value": 0.5, "ci": [float("nan"), 1.0]})
    with pytest.raises(InputError, match="the baseline's value"):
        pr.check_value({"value": 1.0, "ci": [0.0, 2j]}, "the baseline's value")
    with pytest.raises(InputError, match=r"timing row 0 \(balancekv\): compress_s is inf"):
        pr.per_token_ms([dict(method="balancekv", n=64, compress_s=float("inf"), prefill_s=0.1, count=2)])
    assert pr.fmt({"value": 0.227, "ci": [0.05, 0.404]}) == "0.227 [0.05, 0.404]"


def test_numpy_scalars_read_as_numbers_and_leaderboard_rows_are_checked():
    """Found by the fuzz entries: report_words.number printed numpy's float32 as its repr ('-0.30660254', not 4
    digits); a leaderboard row that is not a dict, or whose memory_floats is NaN / inf / a list, or whose rank is a
    list, raised AttributeError / ValueError / OverflowError / TypeError in board_table and practitioner_table."""
    import numpy as np

    from kvbounds.report._practitioner import practitioner_table
    from kvbounds.report import board_table
    from kvbounds.report._words import number
    assert (number(np.float32(-0.3066025376319885)), number(np.int64(3))) == ("-0.3066", "3")
    row = dict(method="uniform", metric="passkey: exact match", budget=0.25, value=0.5, ci_low=0.1, ci_high=0.9)
    assert board_table([row])["tables"]
    for bad, words in ((dict(row, memory_floats=float("nan")), r"leaderboard\[0\]: 'memory_floats' is nan"),
                       (dict(row, rank=[1]), r"'rank' is \[1\]"), ("a row", r"leaderboard\[0\] is 'a row'")):
        with pytest.raises(InputError, match=words):
            board_table([bad])
    with pytest.raises(InputError, match=r"leaderboard\[1\] has no 'metric'"):
        practitioner_table([row, dict(method="balancekv", budget=0.25, value=0.5, ci_low=0.1, ci_high=0.9)])


def _word_calls():
    from kvbounds.report._glossary import term_for
    from kvbounds.report._paper_answers import short_variant
    from kvbounds.report._report import one_line, source_path, tone
    from kvbounds.report._figures import param_label
    from kvbounds.report.markdown import anchor
    from kvbounds.report._meta import one_line as meta_one_line
    return [("short_variant", short_variant), ("short_variant algorithm", lambda x: short_variant("streaming", x)),
            ("term_for", term_for), ("anchor", anchor), ("one_line", one_line),
            ("one_line n", lambda x: one_line("text", x)), ("report_meta.one_line n", lambda x: meta_one_line("t", x)),
            ("tone", tone), ("source_path", lambda x: source_path(x if x is not None else 5)),   # None: no source, ""
            ("param_label", param_label)]


@pytest.mark.parametrize("value", [None, 2.5, float("nan"), True])
def test_the_words_helpers_refuse_what_is_not_text(value):
    """Found by the fuzz entries: short_variant(None) and short_variant(text, algorithm=None) raised AttributeError /
    TypeError, and so did term_for, anchor, one_line, tone, source_path and param_label on a number; one_line's
    length n of NaN or '0.5' raised TypeError. Each is now an InputError naming the argument."""
    for name, call in _word_calls():
        with pytest.raises(InputError):
            call(value)


def test_verdict_helpers_and_words_refuse_what_they_cannot_read():
    """Found by the fuzz entries: headline(None), calls_worse(2.5), dimensions('x'), render_terminal(None),
    render_markdown({'X': 1}, ...) and the other helpers of a verdict raised AttributeError; params_in_words(0),
    spread_words('0.5') and counterexample_in_words(True) raised TypeError / ValueError / AttributeError."""
    from kvbounds.report import _report as report
    from kvbounds.report import _chips as report_chips
    from kvbounds.report import _glance as report_glance
    from kvbounds.report import markdown as report_markdown
    from kvbounds.report import _words as report_words
    for call in (lambda: report.headline(None), lambda: report_chips.calls_worse(2.5),
                 lambda: report_glance.dimensions("x"), lambda: report.render_terminal(None),
                 lambda: report_markdown.render_markdown({"X": 1}, [], {}), lambda: report_words.params_in_words(0),
                 lambda: report_words.spread_words("0.5"), lambda: report_words.counterexample_in_words(True),
                 lambda: report_chips.card_tone("good", None, "holds")):
        with pytest.raises(InputError):
            call()
    assert report_words.params_in_words({"n": 2, 3: "x", "b": 1}) == "n = 2, 3 = x, b = 1"

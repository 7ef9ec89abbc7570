"""The distinct real texts the real-key streams read (kvbounds.traces.corpus): a fixed order of distinct stdlib
texts, enough of them for the units of every family, each read by name (also through the real-trace cache's text
argument), an unknown name refused by name."""
from __future__ import annotations

import pytest

from kvbounds.algorithms.validation import InputError
from kvbounds.traces import corpus
from kvbounds.traces.real_cache import read_text


def test_the_corpus_holds_enough_distinct_texts_in_a_fixed_order():
    names = corpus.texts(min_chars=2200)
    assert len(names) >= 40 and len(set(names)) == len(names)            # >= 40 units of ~544 tokens
    assert names == corpus.texts(min_chars=2200)                        # the same order every time
    assert names[0].startswith("topic:") and any(n.startswith("module:") for n in names)
    bodies = {corpus.text(n) for n in names}
    assert len(bodies) == len(names)                                    # distinct texts, not windows of one
    assert all(len(corpus.text(n)) >= 2200 for n in names)
    assert len(corpus.text_sha256(names[0])) == 64


def test_a_text_is_read_by_name_also_by_the_trace_cache():
    name = corpus.texts()[0]
    body, label = read_text("corpus:" + name)
    assert body == corpus.text(name) == corpus.text("corpus:" + name) and label == "corpus:" + name
    with pytest.raises(InputError, match="no corpus text 'topic:nope'"):
        corpus.text("topic:nope")
    with pytest.raises(InputError, match="no corpus text 'module:os'"):
        corpus.text("module:os")                                        # not in MODULES: platform-dependent
    with pytest.raises(InputError, match="tokens must be an integer"):
        corpus.long_enough("smollm2", 0)

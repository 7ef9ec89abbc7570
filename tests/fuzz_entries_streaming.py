"""Fuzz entries of the weighted cache's newer helpers (kvpress's pipeline hook). ``NOT_ENTRY_POINTS`` lists the
public callables of these modules that are reached through other entries, each with its reason; tests/test_fuzz.py
adds them to its exclusions."""
from __future__ import annotations

from fuzz_harness import Entry


def _install_call():
    from kvbounds.e2e import kvpress_answers
    return kvpress_answers.install(), kvpress_answers.install()


ENTRIES = [
    Entry("kvpress_answers.install", lambda r, c: {}, {}, _install_call),
]

NOT_ENTRY_POINTS = {
    # the last n visible tokens from a transformers 4-d mask (the press hooks' reader; reached through the presses)
    "visible_tokens",
}

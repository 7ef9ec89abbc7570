"""`kvbounds --help` and each command's: an example per command, every option with help and its default, no reST
markup."""
from __future__ import annotations

import argparse

import pytest

from kvbounds.cli._main import EXAMPLES, build_parser


def _commands(parser, path=("kvbounds",)):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, path + (name,))


COMMANDS = list(_commands(build_parser()))


@pytest.mark.parametrize("path,parser", COMMANDS, ids=lambda x: " ".join(x) if isinstance(x, tuple) else "")
def test_every_command_has_an_example_and_every_option_help(path, parser):
    text = parser.format_help()
    assert "``" not in text and ":func:" not in text and ":mod:" not in text, text
    leaf = not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)
    if leaf:
        assert "example:" in text and path[-1] in EXAMPLES, path
        assert f"kvbounds {path[-1]}" in text or "kvbounds traces" in text
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction) or a.option_strings and a.option_strings[0] in ("-h", "--version"):
            continue
        assert a.help, (path, a.option_strings or a.dest)
        if a.option_strings and a.default is not None and a.default is not False:
            assert "default" in parser._get_formatter()._get_help_string(a), (path, a.option_strings)

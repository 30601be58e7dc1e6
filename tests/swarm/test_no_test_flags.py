"""The product carries no test code: no `swarm` command has a hidden flag for tests. Tests reach the product
through its extension points instead (`run_peer(on_stage_peer=)`, `run_coordinator(on_refitter=)`), from
doubles under tests/doubles/."""
from __future__ import annotations

import argparse

from swarm.cli import build_parser

# the one hidden flag: plumbing between two product commands (`swarm local` reads the dashboard's URL from it)
HIDDEN = {("dashboard", "--url-file")}


def _flags(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _flags(sub, (*path, name))
        else:
            for flag in action.option_strings:
                yield path, flag, action.help


def test_no_command_has_a_hidden_flag_or_one_for_tests():
    flags = list(_flags(build_parser()))
    assert len(flags) > 100  # every subcommand's flags were walked
    hidden = {(" ".join(path), flag) for path, flag, text in flags if text == argparse.SUPPRESS}
    assert hidden == HIDDEN
    for_tests = [(path, flag) for path, flag, text in flags if isinstance(text, str) and text.startswith("tests")]
    assert for_tests == []

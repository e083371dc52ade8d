"""The `migpart operator` and `migpart agent` command lines as the manifest and docs tests read
them: each parser, a parse that fails the test with argparse's message, every flag a command
knows, and the docs that name them."""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Callable
from typing import Any

import pytest

from migpart.commands import agent as agent_command
from migpart.commands import operator as operator_command
from tests.tools import ROOT

DOCS = sorted([*(ROOT / "docs").glob("*.md"), ROOT / "README.md"])


def operator_args(argv: list[str]) -> Any:
    return operator_command.parse_args(argv)


def agent_args(argv: list[str]) -> Any:
    return agent_command.parser().parse_args(argv)


PARSERS: dict[str, Callable[[list[str]], Any]] = {"operator": operator_args, "agent": agent_args}


def parse(command: str, argv: list[str]) -> Any:
    """The parsed arguments, or a test failure with argparse's message (not a SystemExit)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return PARSERS[command](argv)
    except SystemExit:
        pytest.fail(f"migpart {command} rejects {argv}: {err.getvalue().strip()}")


def known_flags(command: str) -> set[str]:
    """Every option string the command's parser accepts, read from its --help text."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        PARSERS[command](["--help"])
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", out.getvalue()))

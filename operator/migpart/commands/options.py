"""The commands' argument parsing: a mistake is one line on stderr and exit 2, and every
`--help` shows each option's default.

argparse's own `error()` prints the whole usage before the message; with two dozen options
that buries the one line that says what was wrong.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" to an option's help unless the help already names its default,
    or there is none to show (None, False, a suppressed default)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            not action.option_strings
            or default is None
            or default is False
            or default is argparse.SUPPRESS
            or "default" in text.lower()
        ):
            return action.help
        return f"{text} (default: %(default)s)".lstrip()


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, `PROG: MESSAGE`, and exit 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {message}", file=sys.stderr)
        raise SystemExit(2)


class UsageError(Exception):
    """A command-line mistake, already worded `PROG: MESSAGE`; the command's `main` prints it
    and returns 2."""


class ReturningParser(Parser):
    """A `Parser` for a command whose `main(argv)` returns its exit status (`plan`,
    `simulate`): a mistake raises `UsageError` instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def log_level(text: str) -> str:
    """`--log-level`: a logging level name, in any case."""
    if text.upper() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(LOG_LEVELS)}")
    return text.upper()


def port(text: str) -> int:
    """A TCP port to listen on, 0 for none."""
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0 to 65535)")
    return int(text)

"""The docs name only code that exists: every `migpart.…` name quoted in backticks in
README.md and docs/*.md resolves, and every test they quote (`test_…`, a test file, or
`path::test`) is defined under tests/.

A name is resolved by importing its longest importable module prefix and reading the rest as
attributes (a dataclass or pydantic field counts as an attribute of its class). A call suffix
(`plan(snapshot, requests, policy)`) is ignored.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TESTS = ROOT / "tests"

_QUOTED = re.compile(r"`([^`\n]+)`")
_DOTTED = re.compile(r"migpart(?:\.[A-Za-z_]\w*)+")
_CALL = re.compile(r"\(.*\)$")
# `migpart.io` is the API group (and the driver's domain), not a module
_NOT_CODE = frozenset({"migpart.io"})


def _quoted() -> list[tuple[str, str]]:
    """(doc, span) of every backtick span of the docs."""
    return [
        (doc.relative_to(ROOT).as_posix(), m.group(1))
        for doc in DOCS
        for m in _QUOTED.finditer(doc.read_text())
    ]


def _dotted_names() -> list[tuple[str, str]]:
    out = set()
    for doc, span in _quoted():
        name = _CALL.sub("", span)
        if name not in _NOT_CODE and _DOTTED.fullmatch(name):
            out.add((doc, name))
    return sorted(out)


def _test_names() -> list[tuple[str, str]]:
    return sorted(
        {
            (doc, span)
            for doc, span in _quoted()
            if re.fullmatch(r"(?:tests/[\w/]+/)?test_\w+(?:\.py)?(?:::test_\w+)?", span)
        }
    )


def _has_attribute(obj: object, name: str) -> bool:
    if hasattr(obj, name):
        return True
    if isinstance(obj, type):
        if dataclasses.is_dataclass(obj) and name in {f.name for f in dataclasses.fields(obj)}:
            return True
        if name in (getattr(obj, "model_fields", None) or {}):
            return True
    return False


def resolves(name: str) -> bool:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            if not _has_attribute(obj, attribute):
                return False
            obj = getattr(obj, attribute, None)
        return True
    return False


@cache
def _test_sources() -> dict[Path, str]:
    return {path: path.read_text() for path in TESTS.rglob("*.py")}


def _defined(function: str, in_file: Path | None = None) -> bool:
    pattern = re.compile(rf"^\s*(?:async\s+)?def {re.escape(function)}\(", re.MULTILINE)
    return any(
        pattern.search(text)
        for path, text in _test_sources().items()
        if in_file is None or path == in_file
    )


def test_the_scan_finds_names_at_all() -> None:
    assert len(_dotted_names()) > 10
    assert len(_test_names()) > 10


@pytest.mark.parametrize(("doc", "name"), _dotted_names())
def test_a_quoted_migpart_name_resolves(doc: str, name: str) -> None:
    assert resolves(name), f"{doc} names `{name}`, which does not exist"


@pytest.mark.parametrize(("doc", "name"), _test_names())
def test_a_quoted_test_exists(doc: str, name: str) -> None:
    path, _, function = name.partition("::")
    if path.endswith(".py"):
        if "/" in path:
            assert (ROOT / path).is_file(), f"{doc} names `{name}`: no file {path}"
        else:
            assert any(p.name == path for p in _test_sources()), f"{doc} names `{name}`: no file"
        if function:
            assert _defined(function, ROOT / path), f"{doc} names `{name}`: no such test there"
    else:
        assert _defined(path), f"{doc} names `{name}`, defined nowhere under tests/"

"""docs/code-map.md cannot fall behind the code: every module of the package is on it, and
every module it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "migpart"
MAP = ROOT / "docs" / "code-map.md"
GENERATED = re.compile(r"_pb2(_grpc)?\.py$")


def modules() -> set[str]:
    """Every module of the package, relative to it; packages' `__init__.py` and generated
    protobuf code left out."""
    return {
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if (path.name != "__init__.py" or path.parent == PACKAGE)
        and not GENERATED.search(path.name)
        and "proto" not in path.relative_to(PACKAGE).parts
    }


def named() -> set[str]:
    """The module paths the map names in backticks (`controller/rounds/loop.py`,
    `slices/dra.py`)."""
    return set(re.findall(r"`([a-z_/]+\.py)`", MAP.read_text()))


def test_every_module_of_the_package_is_on_the_map() -> None:
    missing = sorted(modules() - named())
    assert not missing, f"add to docs/code-map.md: {missing}"


def test_every_module_on_the_map_exists() -> None:
    gone = sorted(name for name in named() if not (PACKAGE / name).is_file())
    assert not gone, f"docs/code-map.md names modules that do not exist: {gone}"

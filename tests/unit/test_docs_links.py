"""Every relative link in README.md and docs/*.md leads somewhere: `[..](file.md#anchor)` names
an existing file and, where it has one, an anchor that a heading of that file gets on GitHub;
`[..](#anchor)` names a heading of the same file; a link to any other file (an image, a
manifest) names a file that exists. Every one of these Markdown files stays under 500 lines
(split a longer one by topic and move its links with it).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.MULTILINE | re.DOTALL)
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
_LINK = re.compile(r"(?<!\\)\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_INLINE_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")


def without_code_blocks(markdown: str) -> str:
    """The text outside fenced code blocks (a `# comment` in a shell block is no heading)."""
    return _FENCE.sub("", markdown)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: the link text of inline links, lower case, only word
    characters, hyphens and spaces kept, each space a hyphen."""
    text = _INLINE_LINK.sub(r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """A file's heading anchors; a repeated heading gets -1, -2, … as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for heading in _HEADING.findall(without_code_blocks(path.read_text())):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return frozenset(out)


def relative_links() -> list[tuple[str, str]]:
    """(doc, target) of every link of the docs that is not a URL or an e-mail address."""
    out = set()
    for doc in DOCS:
        for target in _LINK.findall(without_code_blocks(doc.read_text())):
            if not re.match(r"[a-z][a-z0-9+.-]*:", target):
                out.add((doc.relative_to(ROOT).as_posix(), target))
    return sorted(out)


def test_slugs_follow_github() -> None:
    assert slug("1. Build and push the image") == "1-build-and-push-the-image"
    assert slug("The testbed (`hack/testbed`)") == "the-testbed-hacktestbed"
    assert slug("GPU nodes: the NVIDIA runtime") == "gpu-nodes-the-nvidia-runtime"
    assert slug("What decides the stretch's mean wait") == "what-decides-the-stretchs-mean-wait"
    assert slug("Over time (`migpart simulate`)") == "over-time-migpart-simulate"


def test_the_scan_finds_links_at_all() -> None:
    links = relative_links()
    assert len(links) > 100
    assert any("#" in target and not target.startswith("#") for _, target in links)
    assert any(target.startswith("#") for _, target in links)


@pytest.mark.parametrize(("doc", "target"), relative_links())
def test_a_relative_link_resolves(doc: str, target: str) -> None:
    path, _, anchor = target.partition("#")
    file = (ROOT / doc).parent / path if path else ROOT / doc
    assert file.exists(), f"{doc} links to {target}: no file {path}"
    if anchor:
        assert file.suffix == ".md", f"{doc} links to {target}: an anchor in a non-Markdown file"
        assert anchor in anchors(file.resolve()), f"{doc} links to {target}: no such heading"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_a_doc_stays_under_500_lines(doc: Path) -> None:
    lines = len(doc.read_text().splitlines())
    assert lines <= 500, f"{doc.name} has {lines} lines: split it by topic"

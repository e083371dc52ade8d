"""The Dockerfile and the operations docs agree with the code.

The base images are pinned, the image runs migpart as non-root from a small context; the docs
mention only flags the parsers accept, metrics the code exposes and Event reasons it emits, and
explain every one of them (the manifests' side is tests/unit/test_manifests.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from migpart.agent.metrics import AgentMetrics
from migpart.controller.core.metrics import Metrics
from tests.commands import DOCS, PARSERS, known_flags
from tests.tools import ROOT

# ------------------------------------------------------------------ Dockerfile


def dockerfile() -> str:
    return (ROOT / "Dockerfile").read_text()


def base_images(text: str) -> list[str]:
    """FROM images with ARG defaults substituted; stage names are not images."""
    args = dict(re.findall(r"^ARG\s+(\w+)=(\S+)", text, re.M))
    stages: set[str] = set()
    images: list[str] = []
    for image, stage in re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text, re.M | re.I):
        resolved = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), image)
        if resolved not in stages:
            images.append(resolved)
        if stage:
            stages.add(stage)
    return images


def test_dockerfile_base_images_are_pinned() -> None:
    images = base_images(dockerfile())
    assert images
    for image in images:
        _name, _, tag = image.partition(":")
        assert "$" not in image, image
        assert tag, image
        assert tag != "latest", image
        # made from Debian packages by hack/image/build.sh (`make image`), never pulled;
        # anything pulled is pinned by digest
        assert image.startswith("localhost/") or "@sha256:" in image, image


@pytest.mark.parametrize(
    "pattern",
    [
        r"python -m migpart\.agent\.proto\.build",  # the gRPC code is generated, not committed
        r"pip wheel",
        r'^ENTRYPOINT \["migpart"\]$',
    ],
)
def test_dockerfile_builds_and_runs_migpart(pattern: str) -> None:
    assert re.search(pattern, dockerfile(), re.M), pattern


def test_dockerfile_runs_as_non_root() -> None:
    users = re.findall(r"^USER\s+(\S+)", dockerfile(), re.M)
    assert users, "no USER: the image would run as root"
    assert users[-1].split(":")[0] not in ("0", "root")


def test_dockerignore_keeps_the_build_context_small() -> None:
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert "*" in ignore
    assert {"!pyproject.toml", "!README.md", "!operator/", "!LICENSE", "!requirements/"} <= set(
        ignore
    )


# ------------------------------------------------------------------ docs


def mentioned_flags(path: Path) -> Iterator[tuple[str, str]]:
    """(command, flag) for flags written after `migpart operator` / `migpart agent` on a line,
    up to the end of its code span."""
    for line in path.read_text().splitlines():
        for match in re.finditer(r"migpart (operator|agent)\b([^`]*)", line):
            for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", match.group(2)):
                yield match.group(1), flag


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_docs_mention_only_flags_the_parsers_know(path: Path) -> None:
    known = {command: known_flags(command) for command in PARSERS}
    unknown = {(c, f) for c, f in mentioned_flags(path) if f not in known[c]}
    assert not unknown, f"{path.name} mentions flags the parsers do not know: {sorted(unknown)}"


def exposed_metrics() -> set[str]:
    """Every metric name the operator and the agent expose, as Prometheus scrapes them."""
    suffixes = {
        "counter": ("_total",),
        "histogram": ("_bucket", "_sum", "_count", ""),
        "gauge": ("",),
    }
    names: set[str] = set()
    for registry in (Metrics().registry, AgentMetrics("node").registry):
        for family in registry.collect():
            names.update(family.name + s for s in suffixes[family.type])
    return names


def test_monitoring_doc_lists_every_metric() -> None:
    text = (ROOT / "docs" / "monitoring.md").read_text()
    documented = set(re.findall(r"\bmigpart_[a-z_]+[a-z]", text))
    exposed = {n for n in exposed_metrics() if n.startswith("migpart_")}
    counters = {n for n in exposed if n.endswith("_total")}
    histograms = {n.removesuffix("_count") for n in exposed if n.endswith("_count")}
    gauges = exposed - {n for n in exposed if re.search(r"_(total|bucket|sum|count)$", n)}
    gauges -= histograms
    missing = (counters | histograms | gauges) - documented
    assert not missing, f"docs/monitoring.md does not describe {sorted(missing)}"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_docs_name_only_real_metrics(path: Path) -> None:
    documented = set(re.findall(r"\bmigpart_[a-z_]+[a-z]", path.read_text()))
    assert documented <= exposed_metrics(), sorted(documented - exposed_metrics())


def emitted_event_reasons() -> set[str]:
    """Event reasons the operator posts: `effects.event(body, type, reason, message)` calls in
    migpart.controller (the Effects port is the one way events are posted)."""
    source = "".join(p.read_text() for p in (ROOT / "operator/migpart/controller").rglob("*.py"))
    calls = re.split(r"\beffects\.event\(", source)[1:]
    found = (re.match(r"[^,]+,\s*\"(?:Normal|Warning)\",\s*\"(\w+)\"", call) for call in calls)
    return {m.group(1) for m in found if m}


@pytest.mark.parametrize("doc", ["kubectl.md", "troubleshooting.md"])
def test_docs_explain_every_event_reason(doc: str) -> None:
    reasons = emitted_event_reasons()
    assert reasons >= {
        "Repartitioning",
        "DryRunPlan",
        "DestroyAborted",
        "RoundFailed",
        "Unsatisfiable",
    }
    text = (ROOT / "docs" / doc).read_text()
    assert not {r for r in reasons if r not in text}, doc

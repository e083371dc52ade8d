"""helm and kustomize, as `make tools` builds them into $MIGPART_CACHE/tools/bin.

The chart tests run the real tools: a template that renders wrong, a schema that lets a bad
value through or a chart that drifts from manifests/ shows only when Helm and kustomize read
them. Where a tool is missing, the tests that need it FAIL naming `make tools`; they never skip.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from migpart.testbed.build import cache_dir

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "manifests" / "helm" / "migpart"
MANIFESTS = ROOT / "manifests"
# values.yaml's image.repository is a placeholder (REGISTRY/migpart) that fails rendering until
# it is set: the tests render the image the kustomize manifests name, migpart:<appVersion>.
IMAGE_VALUES = ("--set", "image.repository=migpart")


def tool(name: str) -> Path:
    """The path of `name` (helm, kustomize) in the tools cache, or a test failure."""
    path = cache_dir() / "tools" / "bin" / name
    if not os.access(path, os.X_OK):
        pytest.fail(
            f"{name} is required and not installed at {path}: run `make tools`", pytrace=False
        )
    return path


def run(name: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(tool(name)), *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        pytest.fail(f"{name} {' '.join(args)} failed: {proc.stderr.strip()}", pytrace=False)
    return proc


def docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def helm_template(*args: str, namespace: str = "migpart-system") -> list[dict[str, Any]]:
    """The objects `helm template` renders from the chart with these extra arguments."""
    out = run("helm", "template", "migpart", str(CHART), "--namespace", namespace, *args).stdout
    return docs(out)


def kustomize_build(directory: Path = MANIFESTS) -> list[dict[str, Any]]:
    return docs(run("kustomize", "build", str(directory)).stdout)

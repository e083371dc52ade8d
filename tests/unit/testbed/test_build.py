"""The testbed build's version selection and cache keys (no Go build here)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from migpart.testbed.build import (
    DEFAULT_KUBE_VERSION,
    KUBE_VERSIONS,
    TestbedBuildError,
    binary_path,
    build_key,
    kube_version,
    module_dir,
    source_dir,
)


def test_version_from_argument_environment_or_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MIGPART_K8S_VERSION", raising=False)
    assert kube_version() == DEFAULT_KUBE_VERSION == "1.37.2"
    monkeypatch.setenv("MIGPART_K8S_VERSION", "v1.34.4")
    assert kube_version() == "1.34.4"
    assert kube_version("1.37.2") == "1.37.2"
    assert kube_version("v1.36.3") == "1.36.3"  # offer mode's modules run there (Makefile)


def test_unknown_version_is_refused_with_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MIGPART_K8S_VERSION", "1.36.0")
    with pytest.raises(TestbedBuildError, match=r"'1.36.0' \(from MIGPART_K8S_VERSION\).*1.34.4"):
        kube_version()


def test_every_version_has_its_module_in_the_repo() -> None:
    for version in KUBE_VERSIONS:
        module = module_dir(source_dir(), version)
        assert module.name == "v" + version.rsplit(".", 1)[0]
        assert f"k8s.io/kubernetes v{version}" in (module / "go.mod").read_text()


def makefile_words(name: str) -> list[str]:
    """The words of the Makefile's variable `name`, as make itself expands it."""
    root = source_dir().parents[1]
    rule = f"print-variable: ; @echo $({name})"
    out = subprocess.run(
        ["make", "-s", "-C", str(root), "--eval", rule, "print-variable"],
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if k != name},
    ).stdout
    words = out.split()
    assert words, f"no {name} in the Makefile"
    return words


def test_the_makefile_runs_every_version_the_testbed_builds_and_offer_modules_that_exist() -> None:
    versions = makefile_words("K8S_VERSIONS") + makefile_words("OFFER_K8S_VERSION")
    assert sorted(versions) == sorted(KUBE_VERSIONS)
    modules = makefile_words("OFFER_MODULES")
    assert modules
    for module in modules:
        assert (source_dir().parents[1] / module).is_file(), module


def test_each_version_is_cached_under_its_own_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MIGPART_CACHE", str(tmp_path))
    paths = {binary_path(version=v) for v in KUBE_VERSIONS}
    assert len(paths) == len(KUBE_VERSIONS)
    assert all(p.parent.parent == tmp_path for p in paths)


def test_key_follows_the_shared_source(tmp_path: Path) -> None:
    src = tmp_path / "testbed"
    (src / "v1.34").mkdir(parents=True)
    (src / "main.go").write_text("package main\n")
    (src / "v1.34" / "go.mod").write_text("module x\n")
    (src / "v1.34" / "go.sum").write_text("")
    before = build_key(src, "1.34.4")
    (src / "kubelet.go").write_text("package main\n")
    assert build_key(src, "1.34.4") != before


def test_missing_module_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TestbedBuildError, match=r"no go\.mod for Kubernetes 1\.37\.2"):
        build_key(tmp_path, "1.37.2")

"""The image's inputs: the hash-pinned locks agree with pyproject.toml and with each other, and
the Dockerfile builds from them the way docs/deploy.md says.

The built image itself is checked by tests/e2e/test_image.py, which runs it on the testbed.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = ROOT / "requirements"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def lock(name: str) -> dict[str, tuple[Version, list[str]]]:
    """A pip-compile lock: {name: (version, hashes)}."""
    text = (REQUIREMENTS / name).read_text().replace("\\\n", " ")
    pins: dict[str, tuple[Version, list[str]]] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})+)", line)
        assert match, f"{name}: not a hash-pinned requirement: {line[:80]}"
        hashes = re.findall(r"sha256:([0-9a-f]{64})", match.group(3))
        pins[canonicalize_name(match.group(1))] = (Version(match.group(2)), hashes)
    return pins


RUNTIME = lock("runtime.txt")
BUILD = lock("build.txt")


@pytest.mark.parametrize(
    "requirement", PYPROJECT["project"]["dependencies"], ids=lambda r: Requirement(r).name
)
def test_the_runtime_lock_pins_every_dependency_within_its_bounds(requirement: str) -> None:
    wanted = Requirement(requirement)
    name = canonicalize_name(wanted.name)
    assert name in RUNTIME, f"requirements/runtime.txt does not pin {name}: run `make lock`"
    version, _ = RUNTIME[name]
    assert wanted.specifier.contains(version, prereleases=True), (
        f"requirements/runtime.txt pins {name}=={version}, outside {wanted.specifier}: "
        "run `make lock`"
    )


def test_every_pin_carries_hashes() -> None:
    for pins in (RUNTIME, BUILD):
        for name, (_version, hashes) in pins.items():
            assert hashes, name


def test_the_runtime_lock_has_no_build_tools() -> None:
    assert not {"pip", "setuptools", "wheel", "grpcio-tools"} & set(RUNTIME)


def test_the_code_generator_matches_the_runtime() -> None:
    """Generated gRPC code refuses a grpcio older than its generator, and its protobuf code a
    protobuf older than protoc's: the image ships exactly the versions that generated it."""
    assert BUILD["grpcio-tools"][0] == RUNTIME["grpcio"][0]
    for name in ("grpcio", "protobuf"):
        assert BUILD[name][0] == RUNTIME[name][0], name
    pair = (REQUIREMENTS / "grpc.in").read_text()
    assert f"grpcio=={RUNTIME['grpcio'][0]}" in pair.split()
    assert f"grpcio-tools=={RUNTIME['grpcio'][0]}" in pair.split()


def dockerfile() -> str:
    return (ROOT / "Dockerfile").read_text()


def stages(text: str) -> dict[str, str]:
    """{stage name: its instructions}."""
    parts = re.split(r"^FROM\s+\S+\s+AS\s+(\S+)\s*$", text, flags=re.M | re.I)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_no_syntax_directive() -> None:
    """`# syntax=` makes BuildKit fetch a frontend image from a registry: offline builds fail."""
    assert not re.search(r"^#\s*syntax\s*=", dockerfile(), re.M | re.I)


def test_the_build_installs_only_from_the_locks_with_hashes() -> None:
    build = stages(dockerfile())["build"]
    installs = re.findall(r"pip (?:--python \S+ )?install[^&]*", build)
    locked = [i for i in installs if "-r requirements/" in i]
    assert {re.search(r"-r (\S+)", i).group(1) for i in locked} == {  # type: ignore[union-attr]
        "requirements/build.txt",
        "requirements/runtime.txt",
    }
    assert all("--require-hashes" in i for i in locked)
    # the only other install is migpart's own wheel, built here, without dependencies
    others = [i for i in installs if i not in locked]
    assert others
    assert all("--no-deps" in i and "/tmp/wheel/migpart-" in i for i in others)


def test_the_runtime_stage_copies_only_the_virtualenv() -> None:
    runtime = stages(dockerfile())["runtime"]
    copies = re.findall(r"^COPY\s+(.*)$", runtime, re.M)
    assert copies == ["--from=build /opt/migpart /opt/migpart"]
    assert not re.search(r"\b(pip|apt-get|setuptools|gcc)\b", runtime.split("USER")[0])
    assert "/opt/migpart/bin" in re.search(r"PATH=(\S+)", runtime).group(1)  # type: ignore[union-attr]


def test_the_image_is_labelled() -> None:
    runtime = stages(dockerfile())["runtime"]
    labels = set(re.findall(r"org\.opencontainers\.image\.(\w+)=", runtime))
    assert {"title", "description", "version", "revision", "source", "licenses"} <= labels
    assert 'org.opencontainers.image.licenses="Apache-2.0"' in runtime
    assert PYPROJECT["project"]["license"] == "Apache-2.0"


def test_user_and_entrypoint_are_the_manifests() -> None:
    import yaml

    text = dockerfile()
    user = re.findall(r"^USER\s+(\S+)", text, re.M)[-1]
    entrypoint = re.findall(r"^ENTRYPOINT\s+(.*)$", text, re.M)[-1]
    for name in ("operator.yaml", "agent.yaml"):
        for doc in yaml.safe_load_all((ROOT / "manifests" / name).read_text()):
            if doc["kind"] not in ("Deployment", "DaemonSet"):
                continue
            pod = doc["spec"]["template"]["spec"]
            (container,) = pod["containers"]
            assert entrypoint == '["' + '", "'.join(container["command"]) + '"]', name
            if doc["kind"] == "Deployment":
                context = pod["securityContext"]
                assert user == f"{context['runAsUser']}:{context['runAsGroup']}"


def test_the_license_is_apache_2() -> None:
    assert PYPROJECT["project"]["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text
    assert "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    requires = PYPROJECT["build-system"]["requires"]
    setuptools = next(Requirement(r) for r in requires if r.startswith("setuptools"))
    # the SPDX string and license-files need setuptools 77
    assert not setuptools.specifier.contains("76.1")

"""Build the testbed binary, one per Kubernetes version, cached outside the repo.

`hack/testbed/*.go` is shared by every version; `hack/testbed/v1.MINOR/` holds that version's
go.mod and go.sum. A build copies both into a staging directory in the cache and runs
`go build` there, keyed by the version and the content of every file it copied.
`MIGPART_K8S_VERSION` picks the version (default: the newest).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from migpart.errors import MigpartError

# Every version the testbed builds: the oldest migpart supports, the first that serves offer
# mode (partitionable devices and binding conditions, docs/offer-mode.md) and the newest.
KUBE_VERSIONS = ("1.34.4", "1.36.3", "1.37.2")
DEFAULT_KUBE_VERSION = "1.37.2"
VERSION_ENV = "MIGPART_K8S_VERSION"
BUILD_HINT = (
    "build it with `make testbed` (needs Go >= 1.26 on PATH and access to the Go module proxy; "
    "a first build takes 5 to 10 minutes per Kubernetes version, later runs reuse the cache in "
    "$MIGPART_CACHE, default ~/.cache/migpart)"
)


class TestbedBuildError(MigpartError):
    """The Go testbed could not be built; the message carries the compiler's last lines."""

    __test__ = False  # not a pytest test class


def kube_version(version: str | None = None) -> str:
    """The Kubernetes version to build and run: `version`, else $MIGPART_K8S_VERSION, else
    the default; a leading `v` is accepted. Raises TestbedBuildError for any other."""
    text = version or os.environ.get(VERSION_ENV) or DEFAULT_KUBE_VERSION
    wanted = text.strip().removeprefix("v")
    if wanted not in KUBE_VERSIONS:
        raise TestbedBuildError(
            f"Kubernetes version {text!r} (from {'the caller' if version else VERSION_ENV}) "
            f"is not one the testbed builds; choose one of {', '.join(KUBE_VERSIONS)}"
        )
    return wanted


def source_dir() -> Path:
    """hack/testbed in the checkout this package was installed from (editable install)."""
    env = os.environ.get("MIGPART_TESTBED_SRC")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "hack" / "testbed"


def outside_checkout(command: str) -> str | None:
    """Why `command` cannot run here, or None: the testbed is built from hack/testbed, which
    only a checkout of the repository has (not a wheel, not the image)."""
    src = source_dir()
    if src.is_dir():
        return None
    return (
        f"migpart {command}: needs a checkout of the migpart repository (hack/testbed, built "
        f"with Go; {src} does not exist), so it does not run from an installed package or the "
        "image; run it from a clone, or set $MIGPART_TESTBED_SRC to a clone's hack/testbed"
    )


def module_dir(src: Path, version: str) -> Path:
    """The directory of a version's go.mod and go.sum (hack/testbed/v1.37 for 1.37.2)."""
    major, minor, _ = version.split(".")
    return src / f"v{major}.{minor}"


def cache_dir() -> Path:
    return Path(os.environ.get("MIGPART_CACHE", Path.home() / ".cache" / "migpart"))


def _build_files(src: Path, version: str) -> list[Path]:
    module = module_dir(src, version)
    if not (module / "go.mod").exists():
        raise TestbedBuildError(f"no go.mod for Kubernetes {version} in {module}; {BUILD_HINT}")
    shared = sorted(src.glob("*.go"))
    own = sorted(p for p in module.iterdir() if p.is_file())
    return shared + own


def build_key(src: Path, version: str) -> str:
    digest = hashlib.sha256(version.encode())
    for path in _build_files(src, version):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def binary_path(src: Path | None = None, version: str | None = None) -> Path:
    src = src or source_dir()
    version = kube_version(version)
    return cache_dir() / f"testbed-{version}-{build_key(src, version)}" / "testbed"


def build(src: Path | None = None, *, version: str | None = None, quiet: bool = False) -> Path:
    """Return the cached binary for this version, building it first if this source was never
    built."""
    src = src or source_dir()
    version = kube_version(version)
    target = binary_path(src, version)
    if target.exists():
        return target
    go = shutil.which("go")
    if go is None:
        raise TestbedBuildError(f"`go` is not on PATH; {BUILD_HINT}")
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.parent / ".lock"
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building the same key
        if target.exists():
            return target
        if not quiet:
            print(f"building the testbed (v{version}) into {target} ...", file=sys.stderr)
        staging = target.parent / "src"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        for path in _build_files(src, version):
            shutil.copy2(path, staging / path.name)
        major, minor, _ = version.split(".")
        pkg = "k8s.io/component-base/version"
        ldflags = (
            f"-X {pkg}.gitVersion=v{version} -X {pkg}.gitMajor={major} "
            f"-X {pkg}.gitMinor={minor} -X {pkg}.gitTreeState=clean"
        )
        partial = target.with_suffix(".partial")
        proc = subprocess.run(
            [go, "build", "-trimpath", "-ldflags", ldflags, "-o", str(partial), "."],
            cwd=staging,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).splitlines()[-20:])
            raise TestbedBuildError(f"go build for v{version} failed:\n{tail}\n{BUILD_HINT}")
        partial.rename(target)
    return target

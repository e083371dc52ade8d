"""Build the testbed binary, cached outside the repo and keyed by the Go module's content."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from migpart.errors import MigpartError

KUBE_VERSION = "v1.34.4"
BUILD_HINT = (
    "build it with `make testbed` (needs Go >= 1.24 on PATH and access to the Go module proxy; "
    "the first build takes several minutes, later runs reuse the cache in $MIGPART_CACHE, "
    "default ~/.cache/migpart)"
)


class TestbedBuildError(MigpartError):
    """The Go testbed could not be built; the message carries the compiler's last lines."""

    __test__ = False  # not a pytest test class


def source_dir() -> Path:
    """hack/testbed in the checkout this package was installed from (editable install)."""
    env = os.environ.get("MIGPART_TESTBED_SRC")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "hack" / "testbed"


def cache_dir() -> Path:
    return Path(os.environ.get("MIGPART_CACHE", Path.home() / ".cache" / "migpart"))


def build_key(src: Path) -> str:
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum", "main.go"):
        digest.update((src / name).read_bytes())
    return digest.hexdigest()[:16]


def binary_path(src: Path | None = None) -> Path:
    src = src or source_dir()
    return cache_dir() / f"testbed-{build_key(src)}" / "testbed"


def build(src: Path | None = None, *, quiet: bool = False) -> Path:
    """Return the cached binary, building it first if this go.sum was never built."""
    src = src or source_dir()
    if not (src / "go.mod").exists():
        raise TestbedBuildError(f"no Go module at {src}; {BUILD_HINT}")
    target = binary_path(src)
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
            print(f"building the testbed ({KUBE_VERSION}) into {target} ...", file=sys.stderr)
        version = "k8s.io/component-base/version"
        ldflags = (
            f"-X {version}.gitVersion={KUBE_VERSION} -X {version}.gitMajor=1 "
            f"-X {version}.gitMinor=34 -X {version}.gitTreeState=clean"
        )
        partial = target.with_suffix(".partial")
        proc = subprocess.run(
            [go, "build", "-trimpath", "-ldflags", ldflags, "-o", str(partial), "."],
            cwd=src,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).splitlines()[-20:])
            raise TestbedBuildError(f"go build in {src} failed:\n{tail}\n{BUILD_HINT}")
        partial.rename(target)
    return target

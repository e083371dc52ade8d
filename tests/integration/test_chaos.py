"""The chaos harness, short and seeded: agents and the operator SIGKILLed and restarted,
claims deleted mid-plan, a second writer on a MigNode spec and injected NVML failures, under
a stream of pods; every invariant holds and every pod is served.

It runs bench/chaos.py as a process with its own control plane (the harness starts and kills
real `migpart agent` and `migpart operator` processes; none of this suite's fixtures)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SUMMARY = re.compile(
    r"^faults (\d+), pods served (\d+)/(\d+), destroyed-in-use (\d+), leaked (\d+),"
    r" stuck (\d+), double-allocated (\d+)$"
)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """The agents' unix sockets live under it: paths are limited to 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="chaos-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_short_seeded_chaos_keeps_every_invariant(short_dir: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "chaos.py"),
            "--duration=60",
            "--drain=120",
            "--seed=3",
            "--nodes=2",
            "--gpus-per-node=2",
            "--pods=14",
            "--fault-every=4",
            f"--dir={short_dir}",
        ],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr[-3000:]
    summary = SUMMARY.match(lines[-1])
    assert summary, (lines[-5:], proc.stderr[-3000:])
    faults, served, total, *counters = map(int, summary.groups())
    assert counters == [0, 0, 0, 0], "\n".join(lines[-6:])
    assert served == total, "\n".join(lines[-6:])
    assert total > 0
    assert faults >= 5, "\n".join(lines[-6:])
    assert proc.returncode == 0, proc.stderr[-3000:]

"""Stopping the testbed's processes is bounded: SIGTERM, a grace, then SIGKILL, said aloud."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace
from typing import IO, TYPE_CHECKING, Any, cast

import pytest

from migpart.testbed.run import terminate_all

if TYPE_CHECKING:
    from pathlib import Path

IGNORES_SIGTERM = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(3600)\n"
)
STOPS_ON_SIGTERM = "import time\nprint('ready', flush=True)\ntime.sleep(3600)\n"


def _start(script: str, log_path: Path) -> tuple[subprocess.Popen[bytes], IO[bytes]]:
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, start_new_session=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"
    return proc, log


def test_a_process_that_ignores_sigterm_is_killed_and_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stubborn, stubborn_log = _start(IGNORES_SIGTERM, tmp_path / "stubborn.log")
    polite, polite_log = _start(STOPS_ON_SIGTERM, tmp_path / "polite.log")
    killed = terminate_all([(stubborn, stubborn_log), (polite, polite_log)], grace_s=0.5)
    assert killed == [stubborn]
    assert (stubborn.returncode, polite.returncode) == (-9, -15)
    note = f"migpart: pid {stubborn.pid} did not stop within 0.5 s of SIGTERM; killed"
    assert note in (tmp_path / "stubborn.log").read_text()
    assert note in capsys.readouterr().err
    assert (tmp_path / "polite.log").read_text() == ""
    for proc in (stubborn, polite):
        assert proc.stdout is not None
        proc.stdout.close()


def test_the_testbed_stops_etcd_last(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """All components but etcd first (newest first), then etcd: a kube-apiserver that lost
    etcd mid-shutdown kept redialling it and was killed after its grace (end of every demo)."""
    from migpart.testbed import run

    stages: list[list[int]] = []

    def record(procs: list[tuple[subprocess.Popen[bytes], IO[bytes]]], grace_s: float) -> list[Any]:
        stages.append([proc.pid for proc, _ in procs])
        return []

    monkeypatch.setattr(run, "terminate_all", record)
    bed = run.Testbed(tmp_path)
    names = ["etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager"]
    for pid, name in enumerate(names):
        bed._procs.append((name, cast(Any, SimpleNamespace(pid=pid)), cast(Any, None)))
    bed.stop()
    assert stages == [[3, 2, 1], [0]]
    assert bed._procs == []

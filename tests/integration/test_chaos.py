"""The chaos harness, short and seeded: agents and the operator SIGKILLed and restarted,
claims deleted mid-plan, a second writer on a MigNode spec and injected NVML failures, under
a stream of pods; every invariant holds and every pod is served. With `--offer` (offer mode
served from 1.36), agents also end inside a prepare, at the simulator's crash points.

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

from migpart.testbed.build import kube_version

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SUMMARY = re.compile(
    r"^faults (\d+), pods served (\d+)/(\d+), destroyed-in-use (\d+), leaked (\d+),"
    r" stuck (\d+), double-allocated (\d+), non-leader-writes (\d+)$"
)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """The agents' unix sockets live under it: paths are limited to 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="chaos-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _chaos(work: Path, *flags: str) -> tuple[subprocess.CompletedProcess[str], re.Match[str]]:
    """Run bench/chaos.py; the process and its summary line."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench.chaos", *flags, f"--dir={work}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    summary = SUMMARY.match(lines[-1]) if lines else None
    assert summary, (lines[-5:], proc.stderr[-3000:])
    return proc, summary


def _assert_clean(
    proc: subprocess.CompletedProcess[str], summary: re.Match[str], min_faults: int
) -> None:
    """Every counter 0, every pod served, at least `min_faults` faults, exit status 0."""
    tail = proc.stdout[-1500:]
    faults, served, total, *counters = map(int, summary.groups())
    assert counters == [0, 0, 0, 0, 0], tail
    assert served == total > 0, tail
    assert faults >= min_faults, tail
    assert proc.returncode == 0, proc.stderr[-3000:]


CRASH_FAULTS = (
    "agent-kill,operator-kill,apiserver-restart,etcd-restart,claim-delete,second-writer,"
    "node-delete,gpu-lost"
)


def test_short_seeded_chaos_keeps_every_invariant(short_dir: Path) -> None:
    proc, summary = _chaos(
        short_dir,
        f"--faults={CRASH_FAULTS}",
        "--duration=60",
        "--drain=120",
        "--seed=3",
        "--nodes=2",
        "--gpus-per-node=2",
        "--pods=14",
        "--fault-every=4",
    )
    _assert_clean(proc, summary, min_faults=5)


def test_leader_election_faults_keep_every_invariant(short_dir: Path) -> None:
    """A second operator, the leader frozen past its Lease (a standby takes over, the woken
    one writes nothing), an agent frozen past its node Lease, the operators cut off from the
    API server: every counter 0, non-leader writes included."""
    proc, summary = _chaos(
        short_dir,
        "--faults=second-operator,operator-freeze,agent-freeze,apiserver-partition",
        "--duration=150",
        "--drain=120",
        "--seed=6",
        "--nodes=2",
        "--gpus-per-node=2",
        "--pods=14",
        "--fault-every=3",
        "--nvml-faults=",
    )
    _assert_clean(proc, summary, min_faults=3)


def test_lost_gpus_come_back_and_keep_every_invariant(short_dir: Path) -> None:
    """GPU_IS_LOST, injected alone: GPUs fall off the bus (mid-spec where it can) and come
    back; nothing in use is destroyed, nothing leaks, every pod is served."""
    proc, summary = _chaos(
        short_dir,
        "--duration=50",
        "--drain=120",
        "--seed=4",
        "--nodes=2",
        "--gpus-per-node=2",
        "--pods=12",
        "--fault-every=5",
        "--faults=gpu-lost",
        "--nvml-faults=",
    )
    _assert_clean(proc, summary, min_faults=1)
    assert re.search(r"faults by kind: gpu-lost [1-9]", proc.stdout), proc.stdout[-1500:]


def test_offer_mode_keeps_every_invariant_with_agents_ended_inside_a_prepare(
    short_dir: Path,
) -> None:
    """Offer mode (every placement listed, instances made at prepare): agents ended right
    after a prepare's destroy or create and started again, SIGKILLed agents, deleted claims;
    every counter 0, overlapping placements of one GPU counted as double-allocated. On 1.34
    offer mode is not served: the harness says so and injects nothing (exit 2)."""
    flags = (
        "--offer",
        "--faults=prepare-crash,agent-kill,claim-delete",
        "--duration=60",
        "--drain=120",
        "--seed=7",
        "--nodes=2",
        "--gpus-per-node=2",
        "--pods=16",
        "--fault-every=3",
    )
    if tuple(int(p) for p in kube_version().split(".")[:2]) < (1, 36):
        proc = subprocess.run(
            [sys.executable, "-m", "bench.chaos", *flags, f"--dir={short_dir}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=280,
            check=False,
        )
        assert proc.returncode == 2, (proc.stdout[-1500:], proc.stderr[-3000:])
        assert "allocation in effect: Reactive" in proc.stdout
        assert "offer mode is not in effect" in proc.stdout
        return
    proc, summary = _chaos(short_dir, *flags)
    assert "allocation in effect: Offer" in proc.stdout
    _assert_clean(proc, summary, min_faults=5)
    assert re.search(r"faults by kind: .*prepare-crash [1-9]", proc.stdout), proc.stdout[-1500:]


def test_the_monitor_counts_an_instance_destroyed_in_use(short_dir: Path) -> None:
    """The monitor is not blind: an instance in use removed from its GPU behind the agent's
    back (what a buggy agent would do) is counted, and the harness fails."""
    proc, summary = _chaos(
        short_dir,
        "--duration=40",
        "--drain=30",
        "--seed=5",
        "--nodes=1",
        "--gpus-per-node=2",
        "--pods=8",
        "--fault-every=5",
        "--faults=sabotage",
        "--nvml-faults=",
    )
    assert int(summary.group(4)) >= 1, proc.stdout[-1500:]
    assert proc.returncode == 1

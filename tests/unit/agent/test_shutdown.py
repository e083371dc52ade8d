"""The agent stops when told to, whatever it is doing at that moment, and a stop that does not
end is bounded: in-process by `stop_tasks`/`bounded`, as a process by `run_until_signalled`."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from typing import TYPE_CHECKING

import pytest
from structlog.testing import capture_logs

from migpart.agent.app import bounded, stop_tasks
from migpart.agent.metrics import AgentMetrics
from migpart.agent.runner import Agent
from migpart.aio import wait_until_set
from migpart.commands.agent import main as agent_main
from migpart.commands.stopping import EXIT_STUCK
from migpart.testing.mignodes import InMemoryMigNodes

if TYPE_CHECKING:
    from migpart.agent.checkpoint import Checkpoint
    from migpart.agent.simulator import SimulatedNvml

# Bounds on waits for something that must happen; nothing is asserted about how long it took.
ENDS_S = 30.0


async def test_a_cancel_in_the_same_iteration_as_the_event_goes_through() -> None:
    """`asyncio.wait_for` (Python 3.11) returns the finished wait and drops the cancel here."""
    event = asyncio.Event()
    waiter = asyncio.create_task(wait_until_set(event, 3600))
    await asyncio.sleep(0)  # parked on the event
    event.set()
    waiter.cancel()
    done, _ = await asyncio.wait({waiter}, timeout=ENDS_S)
    assert waiter in done
    assert waiter.cancelled()


async def test_wait_until_set_tells_a_timeout_from_the_event() -> None:
    event = asyncio.Event()
    assert await wait_until_set(event, 0.01) is False
    event.set()
    assert await wait_until_set(event, 3600) is True


async def test_an_agent_poked_as_it_is_cancelled_stops(
    sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    """What hung the integration suite: the agent's own status write comes back on its watch
    and pokes it just as it is cancelled; the loop went on and `serve` waited for it forever."""
    store = InMemoryMigNodes()
    agent = Agent("node-a", sim, checkpoint, store, AgentMetrics("node-a"), resync_s=3600)
    task = asyncio.create_task(agent.run())
    await store.wait_for(lambda s: bool(s.gpus))
    for _ in range(20):  # let the loop park on its trigger
        await asyncio.sleep(0)
    assert agent.metrics.ready  # its pass has ended
    agent.poke()
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=ENDS_S)
    assert task in done, "the agent loop went on after it was cancelled"
    assert task.cancelled()
    assert not agent.metrics.alive


async def test_stop_tasks_names_a_task_that_ignores_cancellation() -> None:
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue

    async def polite() -> None:
        await asyncio.Event().wait()

    tasks = [
        asyncio.create_task(stubborn(), name="stubborn"),
        asyncio.create_task(polite(), name="polite"),
    ]
    await asyncio.sleep(0)
    with capture_logs() as logs:
        await stop_tasks(tasks, 0.05)
    assert [(e["event"], e["tasks"]) for e in logs] == [("agent_tasks_did_not_stop", ["stubborn"])]
    assert tasks[1].cancelled()
    release.set()
    await tasks[0]


async def test_stop_tasks_reraises_a_failed_task() -> None:
    async def fails() -> None:
        raise RuntimeError("lease task failed")

    task = asyncio.create_task(fails(), name="failing")
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="lease task failed"):
        await stop_tasks([task], ENDS_S)


async def test_a_shutdown_step_that_hangs_is_logged_and_left() -> None:
    async def hangs() -> None:
        await asyncio.Event().wait()

    with capture_logs() as logs:
        await bounded("kubelet plugin", hangs, grace_s=0.05)
    assert [(e["event"], e["step"]) for e in logs] == [
        ("agent_stop_step_timed_out", "kubelet plugin")
    ]


def _signalled(body: str, grace_s: float) -> subprocess.CompletedProcess[str]:
    """Run `body` (defines `async def main()`) under `run_until_signalled` in a process,
    SIGTERM it once it printed "ready", and return how it ended."""
    script = textwrap.dedent(body) + textwrap.dedent(
        f"""
        from migpart.commands.stopping import run_until_signalled
        run_until_signalled(main, "test", {grace_s})
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=ENDS_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_a_process_that_stops_on_sigterm_exits_0() -> None:
    done = _signalled(
        """
        import asyncio
        async def main():
            print("ready")
            await asyncio.Event().wait()
        """,
        grace_s=ENDS_S,
    )
    assert (done.returncode, done.stderr) == (0, "")


def test_a_process_stuck_after_sigterm_exits_70_saying_where() -> None:
    done = _signalled(
        """
        import asyncio
        async def never_stops():
            while True:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    pass
        async def main():
            asyncio.create_task(never_stops(), name="stuck-task")
            print("ready")
            await asyncio.Event().wait()
        """,
        grace_s=0.5,
    )
    assert done.returncode == EXIT_STUCK
    assert "migpart test: did not stop within 0.5 s of SIGTERM; exiting with 70" in done.stderr
    assert "stuck-task" in done.stderr
    assert "Thread 0x" in done.stderr or "Current thread 0x" in done.stderr


def test_the_stop_grace_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    assert agent_main(["--node-name", "n1", "--stop-grace-seconds", "0"]) == 2
    assert "--stop-grace-seconds must be above 0, not 0" in capsys.readouterr().err

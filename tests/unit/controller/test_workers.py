"""The per-policy loops: started once, woken, stopped after their round, never two at once."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from migpart.controller.core.workers import Signals, Workers


@dataclass
class Probe:
    """A loop that counts its rounds and records how many copies of it run at once."""

    rounds: int = 0
    running: int = 0
    most_at_once: int = 0
    finished: bool = False
    round_s: float = 0.0
    started: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, signals: Signals) -> None:
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        try:
            while not signals.stopped.is_set():
                signals.wake.clear()
                self.rounds += 1
                self.started.set()
                await asyncio.sleep(self.round_s)  # the round; a stop does not cut it
                if signals.stopped.is_set():
                    break
                await signals.wake.wait()
            self.finished = True
        finally:
            self.running -= 1


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def started(workers: Workers, probe: Probe) -> tuple[Workers, Probe]:
    """`probe` started as the loop of "p", its first round under way."""
    workers.ensure("p", probe)
    await probe.started.wait()
    return workers, probe


async def test_ensure_starts_one_loop_per_name() -> None:
    workers, probe = Workers(), Probe()
    workers.ensure("p", probe)
    workers.ensure("p", probe)
    await probe.started.wait()
    await settle()
    assert workers.names() == {"p"}
    assert probe.running == 1
    await workers.close()


async def test_wake_all_runs_another_round() -> None:
    workers, probe = await started(Workers(), Probe())
    workers.wake_all()
    await settle()
    assert probe.rounds == 2
    await workers.close()


async def test_stop_lets_the_round_finish() -> None:
    workers, probe = await started(Workers(grace_s=5.0), Probe(round_s=0.05))
    workers.stop("p")
    assert workers.names() == frozenset()
    await workers.close()
    assert probe.finished  # it returned by itself: not cancelled mid-round
    assert probe.running == 0


async def test_a_loop_that_ignores_stop_is_cancelled_after_the_grace() -> None:
    cancelled = asyncio.Event()

    async def stubborn(signals: Signals) -> None:
        try:
            await asyncio.Event().wait()  # never looks at `stopped`
        except asyncio.CancelledError:
            cancelled.set()
            raise

    workers = Workers(grace_s=0.01)
    workers.ensure("p", stubborn)
    await settle()
    workers.stop("p")
    await workers.close()
    assert cancelled.is_set()


async def test_a_recreated_name_waits_for_the_old_loop_to_end() -> None:
    workers, probe = await started(Workers(grace_s=5.0), Probe(round_s=0.05))
    workers.stop("p")
    workers.ensure("p", probe)  # deleted and made again while the old round still runs
    await asyncio.sleep(0.2)
    assert probe.most_at_once == 1
    assert probe.running == 1
    await workers.close()
    assert probe.running == 0


async def test_a_crashed_loop_starts_again() -> None:
    calls = 0
    again = asyncio.Event()

    async def flaky(signals: Signals) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a bug")
        again.set()
        await signals.stopped.wait()

    workers = Workers(restart_s=0.01)
    workers.ensure("p", flaky)
    await again.wait()
    assert calls == 2
    await workers.close()


async def test_a_crashed_loop_that_is_stopped_does_not_start_again() -> None:
    calls = 0

    async def broken(signals: Signals) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("a bug")

    workers = Workers(restart_s=60.0)
    workers.ensure("p", broken)
    await settle()
    workers.stop("p")
    await workers.close()
    assert calls == 1


async def test_stopping_an_unknown_name_does_nothing() -> None:
    workers = Workers()
    workers.stop("nobody")
    await workers.close()
    assert workers.names() == frozenset()

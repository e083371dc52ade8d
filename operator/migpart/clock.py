"""Time, behind one small port: what time it is, and waiting for some of it to pass.

The operator's decisions depend on time (a policy's batch window, the pacing of its plans, how
long a quorum-read sighting stands, the grace of the destroy protocol, the planning loop's
ticks). They read it from a `Clock` handed to them, as kueue's reconcilers take a
`clock.Clock`: `RealClock` in the process (made only where the operator is composed:
`migpart operator`, the demo, the benchmarks, the tests' operators), `ManualClock` in unit
tests, where time moves only when the test advances it, so that a batch window or a pace is a
step of the test rather than a wait.

What a piece of work costs (a plan's CPU time, which paces the next plan and feeds the
plan-duration metric) is measured around the work with `time.perf_counter`, not read from the
clock: a manual clock cannot make work take time.

A leaf beside `aio`: the controller and whatever else needs time may import it; the pure core
(`mig/`, `planning/`) may not (pyproject.toml's import-linter contracts).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol

from migpart.aio import wait_until_set


class Clock(Protocol):
    """When it is, and waiting."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (deadlines and intervals)."""
        ...

    def now(self) -> datetime:
        """The wall-clock time, UTC (timestamps written to API objects, claims' ages)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Let `seconds` pass."""
        ...

    async def wait(self, event: asyncio.Event, timeout_s: float) -> bool:
        """Wait for `event` up to `timeout_s`; False when the time ran out first."""
        ...


class RealClock:
    """The process's clocks (`time.monotonic`, the UTC wall clock) and asyncio's waits."""

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait(self, event: asyncio.Event, timeout_s: float) -> bool:
        return await wait_until_set(event, timeout_s)


# the manual clock's wall time when its monotonic time is 0
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class ManualClock:
    """A clock for tests: its time moves only by `advance` (and by `sleep`).

    `wait` returns once the event is set, or once the clock was advanced to its deadline; so a
    planning loop that holds a plan back waits until the test moves time on, however long the
    test takes meanwhile. `sleep` lets its time pass at once (it advances the clock, and
    returns): a round that sleeps through the destroy protocol's grace runs to its end, and
    the test reads how long it slept in `slept_s`.
    """

    at: float = 0.0
    slept_s: float = 0.0
    # (deadline, set when the clock reaches it) of each `wait` in progress
    _deadlines: list[tuple[float, asyncio.Event]] = field(default_factory=list)
    # set when a wait begins (`waiting`)
    _waited: asyncio.Event = field(default_factory=asyncio.Event)

    def monotonic(self) -> float:
        return self.at

    def now(self) -> datetime:
        return EPOCH + timedelta(seconds=self.at)

    def advance(self, seconds: float) -> None:
        """Move time on by `seconds`: the waits whose deadline it reaches end."""
        self.at += seconds
        for deadline, due in self._deadlines:
            if deadline <= self.at:
                due.set()

    def deadlines(self) -> list[float]:
        """The deadlines of the waits in progress, earliest first (a test advances to one)."""
        return sorted(deadline for deadline, _ in self._deadlines)

    async def waiting(self) -> list[float]:
        """Until some task waits on this clock (at once if one does); the deadlines then."""
        while not self._deadlines:
            self._waited.clear()
            await self._waited.wait()
        return self.deadlines()

    async def sleep(self, seconds: float) -> None:
        self.slept_s += seconds
        self.advance(max(0.0, seconds))
        await asyncio.sleep(0)

    async def wait(self, event: asyncio.Event, timeout_s: float) -> bool:
        if event.is_set():
            return True
        entry = (self.at + timeout_s, asyncio.Event())
        if entry[0] <= self.at:
            await asyncio.sleep(0)
            return event.is_set()
        self._deadlines.append(entry)
        self._waited.set()
        waits = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(entry[1].wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
            self._deadlines.remove(entry)
        return event.is_set()

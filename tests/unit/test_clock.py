"""migpart.clock.ManualClock: time moves when the test says so."""

from __future__ import annotations

import asyncio

from migpart.clock import EPOCH, ManualClock


async def test_a_wait_ends_when_the_clock_reaches_its_deadline_or_the_event_is_set() -> None:
    clock = ManualClock()
    event = asyncio.Event()
    waiting = asyncio.create_task(clock.wait(event, 5.0))
    assert await clock.waiting() == [5.0]
    clock.advance(4.9)
    await asyncio.sleep(0)
    assert not waiting.done()
    clock.advance(0.1)
    assert await waiting is False
    assert clock.deadlines() == []
    waiting = asyncio.create_task(clock.wait(event, 5.0))
    await asyncio.sleep(0)
    event.set()
    assert await waiting is True
    assert await clock.wait(event, 0.0) is True  # already set


async def test_a_sleep_passes_its_time_at_once_and_ends_the_waits_it_passes() -> None:
    clock = ManualClock(at=10.0)
    waiting = asyncio.create_task(clock.wait(asyncio.Event(), 1.0))
    await asyncio.sleep(0)
    await clock.sleep(2.5)
    assert (clock.monotonic(), clock.slept_s) == (12.5, 2.5)
    assert await waiting is False
    assert (clock.now() - EPOCH).total_seconds() == 12.5


async def test_a_cancelled_wait_leaves_no_deadline_behind() -> None:
    clock = ManualClock()
    waiting = asyncio.create_task(clock.wait(asyncio.Event(), 1.0))
    await asyncio.sleep(0)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert clock.deadlines() == []

"""asyncio helpers both sides (operator and agent) use."""

from __future__ import annotations

import asyncio


async def wait_until_set(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait for `event` up to `timeout_s`; False on timeout. A cancellation always goes
    through: `asyncio.wait_for` on Python 3.11 drops one that arrives in the same loop
    iteration as the event (it returns the finished wait instead of raising), and a loop
    waiting that way may never stop (an agent cancelled right after a status write, whose own
    watch event poked it, looped on until the test timed out)."""
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return False
    return True

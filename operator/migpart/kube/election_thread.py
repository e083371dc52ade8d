"""The leader election in a thread of its own (`ElectionThread`): why, in its docstring."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from migpart.kube.election import Callback, LeaderElector, Term
from migpart.kube.election_lease import LeaseStore

# (store, close): a Lease store on a client of its own, and how to close that client
StoreOpener = Callable[[], Awaitable[tuple[LeaseStore, Callable[[], Awaitable[None]]]]]


class ElectionThread:
    """A `LeaderElector` run in a thread of its own, with its own event loop and API client.

    The operator's event loop is busy exactly when renewals matter: a burst brings thousands of
    watch events and rounds that plan for seconds at a time. A renewal that waits behind them
    for its turn on that loop comes back late, the term ends and the next one republishes what
    differs (measured at 1,000 nodes: two Lease losses in each of two bursts). client-go runs
    its renewals in a goroutine of their own; this is that goroutine. The fence is unchanged:
    `holds` reads the term and the start of its last renewal, which the thread writes (a
    reader that sees the new term before its renewal time refuses, the safe side).

    `on_change` callbacks run on the loop that called `start`, in the order the terms changed."""

    def __init__(self, elector: LeaderElector, open_store: StoreOpener) -> None:
        self.elector = elector
        self.on_change: list[Callback] = []
        self._open_store = open_store
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._campaign: asyncio.Task[None] | None = None  # on the thread's loop

    @property
    def identity(self) -> str:
        return self.elector.identity

    def holds(self, term: Term | None) -> bool:
        return self.elector.holds(term)

    def current(self) -> Term | None:
        return self.elector.current()

    async def start(self) -> None:
        """Start the thread, open its client and begin campaigning; raises what opening the
        client raised (the thread is then stopped)."""
        caller = asyncio.get_running_loop()

        def tell(term: Term | None) -> None:
            with contextlib.suppress(RuntimeError):  # the caller's loop closed: it exits
                caller.call_soon_threadsafe(self._deliver, term)

        self.elector.on_change.append(tell)
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=loop.run_forever, name="leader-election", daemon=True
        )
        self._thread.start()
        try:
            await self._on_thread(self._begin())
        except BaseException:
            await self._end_thread()
            raise

    def _deliver(self, term: Term | None) -> None:
        for callback in self.on_change:
            callback(term)

    async def _on_thread(self, work: Coroutine[Any, Any, None]) -> None:
        if self._loop is None:
            raise RuntimeError("the election thread is not running")
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self._loop))

    async def _begin(self) -> None:
        self.elector.store, close = await self._open_store()

        async def campaign() -> None:
            try:
                await self.elector.run()
            finally:
                await self.elector.release()  # a standby takes over at once
                await close()

        self._campaign = asyncio.create_task(campaign(), name="leader-election")

    async def _finish(self) -> None:
        campaign = self._campaign
        if campaign is not None:
            campaign.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await campaign

    async def _end_thread(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        await asyncio.to_thread(thread.join)
        loop.close()
        self._loop = self._thread = None

    async def stop(self) -> None:
        """End the term, release the Lease, close the thread's client and end the thread."""
        if self._loop is None:
            return
        await self._on_thread(self._finish())
        await self._end_thread()

"""One long-running loop per named object, started and stopped by the operator itself.

The planning loop of each GpuPartitionPolicy runs here rather than as a kopf daemon: kopf
puts its finalizer on every object that has a daemon, and then a policy (or the CRD, during an
uninstall) cannot be deleted while the operator is down, although nothing needs cleaning up
when a policy goes. Nothing here writes to the policy.

A loop gets its `Signals`: `wake` is set whenever something it watches changed (`wake_all`),
`stopped` when it must end. It checks `stopped` between rounds; `stop` sets both, and cancels
the loop only if it has not returned within `grace_s` (a round in the middle of the destroy
protocol should finish rather than be cut).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import structlog

from migpart.aio import wait_until_set

log = structlog.get_logger(__name__)

# How long a stopping loop may take to finish its round before it is cancelled.
STOP_GRACE_S = 10.0
# How long after a loop crashed (a bug: loops handle their expected errors) it starts again.
RESTART_S = 5.0


@dataclass(frozen=True, slots=True)
class Signals:
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    stopped: asyncio.Event = field(default_factory=asyncio.Event)


Loop = Callable[[Signals], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class _Worker:
    task: asyncio.Task[None]
    signals: Signals


class Workers:
    def __init__(self, grace_s: float = STOP_GRACE_S, restart_s: float = RESTART_S) -> None:
        self._grace_s = grace_s
        self._restart_s = restart_s
        self._running: dict[str, _Worker] = {}
        # name -> the task that stops its previous loop: a new loop of the same name (the
        # object was deleted and made again) waits for it, so two never run at once
        self._stopping: dict[str, asyncio.Task[None]] = {}

    def names(self) -> frozenset[str]:
        return frozenset(self._running)

    def ensure(self, name: str, loop: Loop) -> None:
        """Start `loop` for `name` unless one runs. A loop that returned on its own is started
        again: the object is still there."""
        worker = self._running.get(name)
        if worker is not None and not worker.task.done():
            return
        if worker is not None:
            log.warning("worker_restarted", name=name)
        signals = Signals()
        previous = self._stopping.get(name)
        task = asyncio.create_task(self._run(name, loop, signals, previous), name=f"loop:{name}")
        self._running[name] = _Worker(task, signals)

    def wake_all(self) -> None:
        for worker in self._running.values():
            worker.signals.wake.set()

    def stop(self, name: str) -> None:
        """Ask the loop for `name` to end (it finishes its round) without waiting for it."""
        worker = self._running.pop(name, None)
        if worker is None:
            return
        worker.signals.stopped.set()
        worker.signals.wake.set()
        stopping = asyncio.create_task(self._finish(name, worker), name=f"stop:{name}")
        self._stopping[name] = stopping

        def forget(task: asyncio.Task[None]) -> None:
            if self._stopping.get(name) is task:
                del self._stopping[name]

        stopping.add_done_callback(forget)

    async def close(self) -> None:
        """Stop every loop and wait until all have ended."""
        for name in list(self._running):
            self.stop(name)
        if self._stopping:
            await asyncio.gather(*self._stopping.values(), return_exceptions=True)

    async def _run(
        self, name: str, loop: Loop, signals: Signals, previous: asyncio.Task[None] | None
    ) -> None:
        if previous is not None:
            await asyncio.wait({previous})  # not cancelled with us: it ends on its own
        while True:
            try:
                await loop(signals)
                return
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not end the loop for good: log, pause, go on
                log.exception("worker_crashed", name=name, restart_in_s=self._restart_s)
            await wait_until_set(signals.stopped, self._restart_s)
            if signals.stopped.is_set():
                return

    async def _finish(self, name: str, worker: _Worker) -> None:
        done, _ = await asyncio.wait({worker.task}, timeout=self._grace_s)
        if not done:
            log.warning("worker_cancelled", name=name, grace_s=self._grace_s)
            worker.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker.task

"""The agent's `MigNodeStore` in memory: the test sets the spec, the statuses are recorded."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from migpart.api.models import MigNodeSpec, MigNodeStatus


class InMemoryMigNodes:
    """`MigNodeStore` twin: the spec is set by the test, statuses are recorded."""

    def __init__(self, spec: MigNodeSpec | None = None, leader_term: int | None = None) -> None:
        self.spec = spec
        self.created = 0
        self.leader_term = leader_term
        self.warnings: list[tuple[str, str]] = []
        self.statuses: list[MigNodeStatus] = []
        self._changed = asyncio.Condition()  # the spec changed
        self._written = asyncio.Condition()  # a status was written

    async def set_spec(self, spec: MigNodeSpec | None) -> None:
        async with self._changed:
            self.spec = spec
            self._changed.notify_all()

    async def ensure(self) -> MigNodeSpec | None:
        return self.spec

    async def recreate(self) -> None:
        """The MigNode was deleted and created again: no spec, no status."""
        async with self._changed:
            self.spec = None
            self.created += 1
            self._changed.notify_all()

    async def specs(self) -> AsyncIterator[MigNodeSpec | None]:
        while True:
            async with self._changed:
                await self._changed.wait()
                spec = self.spec
            yield spec

    async def write_status(self, status: MigNodeStatus) -> None:
        async with self._written:
            self.statuses.append(status)
            self._written.notify_all()

    async def warn(self, reason: str, message: str) -> None:
        async with self._written:
            self.warnings.append((reason, message))
            self._written.notify_all()

    async def wait_for_warning(self) -> tuple[str, str]:
        """The first Warning Event posted (existing or future)."""
        async with self._written:
            while not self.warnings:
                await self._written.wait()
            return self.warnings[0]

    async def wait_for(self, predicate: Any) -> MigNodeStatus:
        """The first recorded status (existing or future) for which `predicate` is true."""
        async with self._written:
            while True:
                for status in self.statuses:
                    if predicate(status):
                        return status
                await self._written.wait()

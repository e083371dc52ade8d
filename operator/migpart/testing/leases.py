"""The election's `LeaseStore` in memory, with the API server's optimistic concurrency."""

from __future__ import annotations

from dataclasses import dataclass, replace

from migpart.kube.election_lease import Conflict, LeaseRecord


@dataclass
class InMemoryLeaseStore:
    """`LeaseStore` twin with the API server's optimistic concurrency (for unit tests)."""

    record: LeaseRecord | None = None
    writes: int = 0
    reads: int = 0
    _version: int = 0

    def _stored(self, record: LeaseRecord) -> LeaseRecord:
        self._version += 1
        self.writes += 1
        self.record = replace(record, resource_version=str(self._version))
        return self.record

    async def get(self) -> LeaseRecord | None:
        self.reads += 1
        return self.record

    async def create(self, record: LeaseRecord) -> LeaseRecord:
        if self.record is not None:
            raise Conflict("exists")
        return self._stored(record)

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        if self.record is None or record.resource_version != self.record.resource_version:
            raise Conflict("changed")
        return self._stored(record)

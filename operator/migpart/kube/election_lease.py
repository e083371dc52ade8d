"""The election's Lease: its record, and where it is kept (`LeaseStore`).

`LeaseRecord` is the spec of the `coordination.k8s.io/v1` Lease the operators campaign for
(`kube/election.py`), with the resourceVersion it was read at: every write of it is an update at
that resourceVersion, so of two writers one gets `Conflict`. `KubeLeaseStore` keeps it on the
API server, the tests' twin in memory (`migpart.testing.leases`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from kubernetes_asyncio.client import ApiClient, CoordinationV1Api
from kubernetes_asyncio.client.exceptions import ApiException

LEASE_NAME = "migpart-operator"
# the Lease's namespace outside a pod (no $POD_NAMESPACE, no service account): the manifests'
DEFAULT_NAMESPACE = "migpart-system"
LEASE_DURATION_S = 15.0


class Conflict(Exception):
    """The Lease changed (or was created) since it was read: read it again."""


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The spec of the election Lease, and the resourceVersion it was read at."""

    holder: str = ""
    duration_s: int = int(LEASE_DURATION_S)
    acquire_time: str | None = None
    renew_time: str | None = None
    transitions: int = 0
    resource_version: str = ""

    @staticmethod
    def of(body: dict[str, Any]) -> LeaseRecord:
        spec = body.get("spec") or {}
        return LeaseRecord(
            holder=str(spec.get("holderIdentity") or ""),
            duration_s=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            transitions=int(spec.get("leaseTransitions") or 0),
            resource_version=str((body.get("metadata") or {}).get("resourceVersion") or ""),
        )

    def spec(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.duration_s,
            "leaseTransitions": self.transitions,
        }
        if self.acquire_time is not None:
            out["acquireTime"] = self.acquire_time
        if self.renew_time is not None:
            out["renewTime"] = self.renew_time
        return out

    def seen_as(self) -> tuple[str, str | None, int, str]:
        """What makes a record new to an observer (client-go compares the whole record)."""
        return (self.holder, self.renew_time, self.transitions, self.resource_version)


class LeaseStore(Protocol):
    """The election Lease on the API server (`KubeLeaseStore`) or in memory (tests)."""

    async def get(self) -> LeaseRecord | None:
        """The Lease now (None: there is none)."""
        ...

    async def create(self, record: LeaseRecord) -> LeaseRecord:
        """Create it; raises `Conflict` when it exists."""
        ...

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        """Replace it at `record.resource_version`; raises `Conflict` when it changed."""
        ...


class KubeLeaseStore:
    """`LeaseStore` on the API server; bodies read as plain JSON."""

    def __init__(self, api: ApiClient, namespace: str, name: str, timeout_s: float) -> None:
        self.namespace = namespace
        self.name = name
        self.timeout_s = timeout_s
        self._leases: Any = CoordinationV1Api(api)

    async def _call(self, method: Callable[..., Awaitable[Any]], *args: Any) -> dict[str, Any]:
        response = await method(*args, _preload_content=False, _request_timeout=self.timeout_s)
        try:
            body = await response.read()
        finally:
            response.release()
        if response.status == 409:
            raise Conflict(body.decode(errors="replace")[:200])
        if not 200 <= response.status <= 299:
            raise ApiException(status=response.status, reason=body.decode(errors="replace"))
        parsed: dict[str, Any] = json.loads(body)
        return parsed

    def _body(self, record: LeaseRecord) -> dict[str, Any]:
        metadata: dict[str, Any] = {
            "name": self.name,
            "namespace": self.namespace,
            "labels": {"app.kubernetes.io/managed-by": "migpart"},
        }
        if record.resource_version:
            metadata["resourceVersion"] = record.resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": record.spec(),
        }

    async def get(self) -> LeaseRecord | None:
        try:
            body = await self._call(self._leases.read_namespaced_lease, self.name, self.namespace)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return LeaseRecord.of(body)

    async def create(self, record: LeaseRecord) -> LeaseRecord:
        body = self._body(replace(record, resource_version=""))
        created = await self._call(self._leases.create_namespaced_lease, self.namespace, body)
        return LeaseRecord.of(created)

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        body = self._body(record)
        try:
            replaced = await self._call(
                self._leases.replace_namespaced_lease, self.name, self.namespace, body
            )
        except ApiException as err:
            if err.status == 404:  # deleted since it was read
                raise Conflict("the Lease was deleted") from err
            raise
        return LeaseRecord.of(replaced)


class UnopenedLeaseStore:
    """The store of an elector whose client a thread opens later (`ElectionThread`)."""

    async def get(self) -> LeaseRecord | None:
        raise RuntimeError("the election's Lease store is not open yet")

    async def create(self, record: LeaseRecord) -> LeaseRecord:
        raise RuntimeError("the election's Lease store is not open yet")

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        raise RuntimeError("the election's Lease store is not open yet")

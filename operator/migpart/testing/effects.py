"""The operator's `Effects` port in memory: a round runs against it and it records the writes.

The twin keeps the real port's fence (`FencedPort`): a write refused by it is recorded in
`refused` and not carried out.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from migpart.api.models import Condition, GpuPartitionPolicyStatus, MigNodeSpec
from migpart.controller.core.effects import FencedPort, stamped
from migpart.kube.election import Leadership, Term, Unelected
from migpart.kube.slice_publisher import Published
from migpart.types import Body


@dataclass(frozen=True, slots=True)
class Refused:
    """A write the fence stopped (in-memory twin): what, and of which object."""

    write: str
    target: str


@dataclass(frozen=True, slots=True)
class PostedEvent:
    object: str
    type: str
    reason: str
    message: str


@dataclass
class InMemoryEffects(FencedPort):
    """`Effects` in memory, for unit tests: records what a round did.

    `claims` is what the quorum read returns (`claim_reads` counts the reads);
    `on_withdraw(node, devices)` runs after a withdrawal (a test allocates a claim there, as a
    racing scheduler would). Written specs come back as MigNode bodies at increasing
    resourceVersions (above the one they replace), on top of `mignodes`; a spec written over a
    resourceVersion that is no longer the body's raises a 409, as the API server does.
    `leadership` and `term` fence it as they fence `KubeEffects`; refused writes are recorded
    in `refused` (and not carried out).
    """

    mignodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    claims: list[dict[str, Any]] = field(default_factory=list)
    claim_reads: int = 0
    on_withdraw: Callable[[str, frozenset[str]], Awaitable[None]] | None = None
    specs: list[tuple[str, MigNodeSpec]] = field(default_factory=list)
    statuses: list[tuple[str, GpuPartitionPolicyStatus]] = field(default_factory=list)
    events: list[PostedEvent] = field(default_factory=list)
    withdrawals: list[tuple[str, frozenset[str]]] = field(default_factory=list)
    restores: list[tuple[str, frozenset[str]]] = field(default_factory=list)
    published: list[str] = field(default_factory=list)
    # (node, resourceVersion, conditions) of each condition write
    conditions: list[tuple[str, str, list[Condition]]] = field(default_factory=list)
    leadership: Leadership = field(default_factory=Unelected)
    term: Term | None = None
    refused: list[Refused] = field(default_factory=list)
    _withdrawn: dict[str, set[str]] = field(default_factory=dict)
    _revision: int = 1000

    def under(self, term: Term | None) -> InMemoryEffects:
        """A view bound to `term` that records into the same lists."""
        view = replace(self, term=term)
        view._withdrawn = self._withdrawn
        return view

    def refused_write(self, write: str, target: str) -> None:
        self.refused.append(Refused(write, target))

    def withdrawing(self) -> list[str]:
        return sorted(n for n, devices in self._withdrawn.items() if devices)

    def withdrawn(self, node: str) -> frozenset[str]:
        return frozenset(self._withdrawn.get(node, set()))

    async def withdraw(self, node: str, devices: frozenset[str]) -> int:
        self._withdrawn.setdefault(node, set()).update(devices)
        self._fence("withdrawal", node)
        self.withdrawals.append((node, devices))
        if self.on_withdraw is not None:
            await self.on_withdraw(node, devices)
        return len(self.withdrawals)

    async def restore(self, node: str, devices: frozenset[str]) -> None:
        self._withdrawn.setdefault(node, set()).difference_update(devices)
        self._fence("restore", node)
        self.restores.append((node, devices))

    async def publish(self, node: str) -> Published:
        self._fence("slice", node)
        self.published.append(node)
        return Published(node, len(self.published), True, frozenset(), None)

    async def write_conditions(
        self, node: str, resource_version: str, conditions: list[Condition]
    ) -> None:
        self._fence("conditions", node)
        self.conditions.append((node, resource_version, conditions))

    async def read_claims(self) -> list[dict[str, Any]]:
        self.claim_reads += 1
        return list(self.claims)

    async def write_spec(
        self, node: str, spec: MigNodeSpec, resource_version: str | None = None
    ) -> dict[str, Any]:
        self._fence("spec", node)
        body = dict(self.mignodes.get(node) or {"metadata": {"name": node}})
        current = str((body.get("metadata") or {}).get("resourceVersion") or "")
        if resource_version is not None and resource_version != current:
            raise ApiException(status=409, reason="Conflict")
        spec = stamped(spec, self.term)
        self.specs.append((node, spec))
        self._revision = max(self._revision, int(current) if current.isdigit() else 0) + 1
        body["metadata"] = {**body.get("metadata", {}), "resourceVersion": str(self._revision)}
        body["spec"] = spec.model_dump(by_alias=True, exclude_none=True, mode="json")
        self.mignodes[node] = body
        self._withdrawn.pop(node, None)  # the spec dropped them: the withdrawal is complete
        return body

    async def write_status(self, policy: str, status: GpuPartitionPolicyStatus) -> None:
        self._fence("policy status", policy)
        self.statuses.append((policy, status))

    def event(self, body: Body, type: str, reason: str, message: str) -> None:
        name = str((body.get("metadata") or {}).get("name", ""))
        self._fence("event", name)
        self.events.append(PostedEvent(name, type, reason, message))

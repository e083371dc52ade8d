"""The round's effects on the world, behind one narrow port.

A planning round decides from the indexes (pure, `scope.py` and the planner) and then acts:
it withdraws and restores slice devices, reads the claims with a quorum read, waits, writes
MigNode specs, posts events and writes the policy status. All of that goes through `Effects`,
so that a round can run against `InMemoryEffects` in a unit test (the pattern of the agent's
`NvmlBackend` and `MigNodeStore`): the operator's decisions get tests that need no API server.
`KubeEffects` is the real one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import kopf

from migpart.api.models import GpuPartitionPolicyStatus, MigNode, MigNodeSpec
from migpart.controller.bodies import strip
from migpart.controller.scope import ScopeCache
from migpart.kube.claims import list_claims_quorum
from migpart.kube.objects import patch_mignode_spec, patch_policy_status
from migpart.kube.slices import SlicePublisher

Body = Mapping[str, Any]


class Effects(Protocol):
    """What a round does to the world (besides reading the indexes)."""

    def withdrawing(self) -> list[str]:
        """Nodes that have devices withdrawn from their slice."""
        ...

    def withdrawn(self, node: str) -> frozenset[str]: ...

    async def withdraw(self, node: str, devices: frozenset[str]) -> int:
        """Publish the node's slice without `devices`; returns the pool generation."""
        ...

    async def restore(self, node: str, devices: frozenset[str]) -> None:
        """Publish `devices` again."""
        ...

    async def read_claims(self) -> list[dict[str, Any]]:
        """Every ResourceClaim, by a quorum read (newer than any write before the call)."""
        ...

    async def sleep(self, seconds: float) -> None: ...

    async def write_spec(self, node: str, spec: MigNodeSpec) -> dict[str, Any]:
        """Replace the MigNode's spec; returns the whole object as written."""
        ...

    async def write_status(self, policy: str, status: GpuPartitionPolicyStatus) -> None: ...

    def event(self, body: Body, type: str, reason: str, message: str) -> None:
        """Post a Kubernetes Event about `body`."""
        ...


def as_body(body: Body) -> kopf.Body:
    """kopf posts events for its own Body type; index values are plain dicts."""
    return body if isinstance(body, kopf.Body) else kopf.Body(cast("kopf.RawBody", dict(body)))


@dataclass
class KubeEffects:
    """`Effects` on the API server: the slice publisher, patches, kopf's event poster."""

    api: Any  # kubernetes_asyncio ApiClient
    publisher: SlicePublisher
    # parses the written MigNode once for the publisher and the watch event that follows
    scopes: ScopeCache = field(default_factory=ScopeCache)

    def withdrawing(self) -> list[str]:
        return self.publisher.withdrawing()

    def withdrawn(self, node: str) -> frozenset[str]:
        return self.publisher.withdrawn(node)

    async def withdraw(self, node: str, devices: frozenset[str]) -> int:
        return (await self.publisher.withdraw(node, devices)).generation

    async def restore(self, node: str, devices: frozenset[str]) -> None:
        await self.publisher.restore(node, devices)

    async def read_claims(self) -> list[dict[str, Any]]:
        return await list_claims_quorum(self.api)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def write_spec(self, node: str, spec: MigNodeSpec) -> dict[str, Any]:
        written = await patch_mignode_spec(self.api, node, spec)
        view = self.scopes.node(node, written)
        self.publisher.observe(view.node if view else MigNode.model_validate(strip(written)))
        return written

    async def write_status(self, policy: str, status: GpuPartitionPolicyStatus) -> None:
        await patch_policy_status(self.api, policy, status)

    def event(self, body: Body, type: str, reason: str, message: str) -> None:
        kopf.event(as_body(body), type=type, reason=reason, message=message)


@dataclass(frozen=True, slots=True)
class PostedEvent:
    object: str
    type: str
    reason: str
    message: str


@dataclass
class InMemoryEffects:
    """`Effects` in memory, for unit tests: records what a round did.

    `claims` is what the quorum read returns; `on_withdraw(node, devices)` runs after a
    withdrawal (a test allocates a claim there, as a racing scheduler would). Written specs
    come back as MigNode bodies at increasing resourceVersions, on top of `mignodes`.
    """

    mignodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    claims: list[dict[str, Any]] = field(default_factory=list)
    on_withdraw: Callable[[str, frozenset[str]], Awaitable[None]] | None = None
    specs: list[tuple[str, MigNodeSpec]] = field(default_factory=list)
    statuses: list[tuple[str, GpuPartitionPolicyStatus]] = field(default_factory=list)
    events: list[PostedEvent] = field(default_factory=list)
    slept_s: float = 0.0
    withdrawals: list[tuple[str, frozenset[str]]] = field(default_factory=list)
    restores: list[tuple[str, frozenset[str]]] = field(default_factory=list)
    _withdrawn: dict[str, set[str]] = field(default_factory=dict)
    _revision: int = 1000

    def withdrawing(self) -> list[str]:
        return sorted(n for n, devices in self._withdrawn.items() if devices)

    def withdrawn(self, node: str) -> frozenset[str]:
        return frozenset(self._withdrawn.get(node, set()))

    async def withdraw(self, node: str, devices: frozenset[str]) -> int:
        self._withdrawn.setdefault(node, set()).update(devices)
        self.withdrawals.append((node, devices))
        if self.on_withdraw is not None:
            await self.on_withdraw(node, devices)
        return len(self.withdrawals)

    async def restore(self, node: str, devices: frozenset[str]) -> None:
        self._withdrawn.setdefault(node, set()).difference_update(devices)
        self.restores.append((node, devices))

    async def read_claims(self) -> list[dict[str, Any]]:
        return list(self.claims)

    async def sleep(self, seconds: float) -> None:
        self.slept_s += seconds

    async def write_spec(self, node: str, spec: MigNodeSpec) -> dict[str, Any]:
        self.specs.append((node, spec))
        self._revision += 1
        body = dict(self.mignodes.get(node) or {"metadata": {"name": node}})
        body["metadata"] = {**body.get("metadata", {}), "resourceVersion": str(self._revision)}
        body["spec"] = spec.model_dump(by_alias=True, exclude_none=True, mode="json")
        self.mignodes[node] = body
        self._withdrawn.pop(node, None)  # the spec dropped them: the withdrawal is complete
        return body

    async def write_status(self, policy: str, status: GpuPartitionPolicyStatus) -> None:
        self.statuses.append((policy, status))

    def event(self, body: Body, type: str, reason: str, message: str) -> None:
        name = str((body.get("metadata") or {}).get("name", ""))
        self.events.append(PostedEvent(name, type, reason, message))

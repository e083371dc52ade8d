"""The round's effects on the world, behind one narrow port.

A planning round decides from the indexes (pure, `scope.py` and the planner) and then acts:
it withdraws and restores slice devices, reads the claims with a quorum read, writes MigNode
specs, posts events and writes the policy status. All of that goes through `Effects` (its
waits go through the round's clock, `migpart.clock`), so that a round can run against
`migpart.testing.effects.InMemoryEffects` in a unit test (the pattern of the agent's
`NvmlBackend` and `MigNodeStore`): the operator's decisions get tests that need no API server.
`KubeEffects` is the real one.

Every write of the operator goes through this port, the node-health and resync slice
publishes and the `Stale` condition included, because the port is where the *fence* is: an
`Effects` is bound to the leadership term (`kube.election.Term`) it was made for (`under`),
and each write asks `Leadership.holds(term)` right before it is sent. A round keeps the port of
the term it started under, so a leader that lost its Lease mid-round (renewals failed, process
frozen, Lease taken) sends nothing more: the write raises `NotLeader` instead, and the in-memory
twin records it in `refused`. A spec is stamped with the term's token (`spec.leaderTerm`), which
the agent checks as well (docs/destroy-protocol.md, "The fence"). Both sides share that fence
(`FencedPort`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import aiohttp
import structlog
from kubernetes_asyncio.client.exceptions import ApiException

from migpart.api.models import Condition, GpuPartitionPolicyStatus, MigNode, MigNodeSpec
from migpart.controller.core.bodies import strip
from migpart.errors import NotLeader
from migpart.kube.claims import list_claims_quorum
from migpart.kube.election import Leadership, Term, Unelected
from migpart.kube.events import post_event
from migpart.kube.objects import (
    patch_mignode_conditions,
    patch_mignode_spec,
    patch_policy_status,
)
from migpart.kube.slice_publisher import Published, SlicePublisher
from migpart.types import Body

log = structlog.get_logger(__name__)

# Events being posted (KubeEffects.event): kept until done
_POSTING: set[asyncio.Task[None]] = set()


class ParsedNodes(Protocol):
    """Where a written MigNode is parsed once (`rounds.scope.ScopeCache.parsed`), so that the
    watch event that follows finds it parsed."""

    def parsed(self, name: str, body: Body) -> MigNode | None: ...


class Effects(Protocol):
    """What the operator does to the world (besides reading the indexes)."""

    term: Term | None

    def under(self, term: Term | None) -> Effects:
        """This port bound to `term` (None: to no term, every write refused)."""
        ...

    def leading(self) -> bool:
        """Whether this port's term still holds (its writes would be sent)."""
        ...

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

    async def write_spec(
        self, node: str, spec: MigNodeSpec, resource_version: str | None = None
    ) -> dict[str, Any]:
        """Replace the MigNode's spec; returns the whole object as written. With
        `resource_version`, only over the MigNode as it was read (else ApiException 409)."""
        ...

    async def write_status(self, policy: str, status: GpuPartitionPolicyStatus) -> None: ...

    async def publish(self, node: str) -> Published:
        """Write the node's slice if its content changed (the MigNode watch, node health and
        the periodic resync)."""
        ...

    async def write_conditions(
        self, node: str, resource_version: str, conditions: list[Condition]
    ) -> None:
        """Write a MigNode's status conditions over `resource_version` (the `Stale` mark)."""
        ...

    def event(self, body: Body, type: str, reason: str, message: str) -> None:
        """Post a Kubernetes Event about `body`."""
        ...


def fenced(leadership: Leadership, term: Term | None, write: str, target: str) -> None:
    """Raise `NotLeader` unless `term` still holds: called right before each write."""
    if not leadership.holds(term):
        log.warning("write_fenced", write=write, target=target)
        raise NotLeader(f"{write} {target}: not written, this operator no longer leads")


class FencedPort:
    """The fence of both `Effects` (`KubeEffects`, the tests' `InMemoryEffects`): each is a
    dataclass with `leadership` and `term` fields, and says what a refused write leaves behind
    (`refused_write`)."""

    leadership: Leadership
    term: Term | None

    def __post_init__(self) -> None:
        if self.term is None and isinstance(self.leadership, Unelected):
            self.term = self.leadership.term

    def leading(self) -> bool:
        return self.leadership.holds(self.term)

    def refused_write(self, write: str, target: str) -> None:
        """Called when the fence refuses `write` of `target`, before `NotLeader` is raised."""

    def _fence(self, write: str, target: str) -> None:
        try:
            fenced(self.leadership, self.term, write, target)
        except NotLeader:
            self.refused_write(write, target)
            raise


def stamped(spec: MigNodeSpec, term: Term | None) -> MigNodeSpec:
    """The spec with the term's fencing token (none without election)."""
    token = term.token if term is not None else None
    return spec if token is None else spec.model_copy(update={"leader_term": token})


@dataclass
class KubeEffects(FencedPort):
    """`Effects` on the API server: the slice publisher, patches, Events (`kube.events`)."""

    api: Any  # kubernetes_asyncio ApiClient
    publisher: SlicePublisher
    # parses the written MigNode once for the publisher and the watch event that follows
    scopes: ParsedNodes
    leadership: Leadership = field(default_factory=Unelected)
    term: Term | None = None
    # writes refused by the fence (a metric)
    on_refused: list[Callable[[str], None]] = field(default_factory=list)

    def under(self, term: Term | None) -> KubeEffects:
        return replace(self, term=term)

    def refused_write(self, write: str, target: str) -> None:
        for hook in self.on_refused:
            hook(write)

    def withdrawing(self) -> list[str]:
        return self.publisher.withdrawing()

    def withdrawn(self, node: str) -> frozenset[str]:
        return self.publisher.withdrawn(node)

    async def withdraw(self, node: str, devices: frozenset[str]) -> int:
        fence = functools.partial(self._fence, "withdrawal", node)
        return (await self.publisher.withdraw(node, devices, fence=fence)).generation

    async def restore(self, node: str, devices: frozenset[str]) -> None:
        await self.publisher.restore(
            node, devices, fence=functools.partial(self._fence, "restore", node)
        )

    async def publish(self, node: str) -> Published:
        return await self.publisher.publish(
            node, fence=functools.partial(self._fence, "slice", node)
        )

    async def read_claims(self) -> list[dict[str, Any]]:
        return await list_claims_quorum(self.api)

    async def write_spec(
        self, node: str, spec: MigNodeSpec, resource_version: str | None = None
    ) -> dict[str, Any]:
        self._fence("spec", node)
        written = await patch_mignode_spec(
            self.api, node, stamped(spec, self.term), resource_version
        )
        parsed = self.scopes.parsed(node, written)
        self.publisher.observe(parsed or MigNode.model_validate(strip(written)))
        return written

    async def write_status(self, policy: str, status: GpuPartitionPolicyStatus) -> None:
        self._fence("policy status", policy)
        await patch_policy_status(self.api, policy, status)

    async def write_conditions(
        self, node: str, resource_version: str, conditions: list[Condition]
    ) -> None:
        self._fence("conditions", node)
        await patch_mignode_conditions(self.api, node, resource_version, conditions)

    def event(self, body: Body, type: str, reason: str, message: str) -> None:
        self._fence("event", str((body.get("metadata") or {}).get("name", "")))
        task = asyncio.create_task(self._post(body, type, reason, message))
        _POSTING.add(task)
        task.add_done_callback(_POSTING.discard)

    async def _post(self, body: Body, type: str, reason: str, message: str) -> None:
        try:
            await post_event(self.api, body, type, reason, message)
        except (ApiException, aiohttp.ClientError, TimeoutError) as error:
            log.warning("event_failed", reason=reason, error=str(error)[:200])

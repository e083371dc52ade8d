"""Offer mode, the acting half of the relay (the decisions are `controller/relay.py`).

Not a planning round: a claim event that shows an allocation of one of our devices, and every
MigNode event of a node such a claim holds devices on, make the node *settle* (one task per
node at a time, an event meanwhile asks for one more pass):

1. the MigNode spec gets the allocated placements that have no instance (`relay.relay`),
   written through the fenced effects port as a round writes specs (and remembered in
   `state.written`, so that a round started meanwhile plans on it);
2. each claim allocated a device on the node that waits for a binding condition gets the
   verdict the MigNode gives (`relay.verdict`) in its `status.devices`, through the port;
   a failure is told once more as a Warning Event on the claim;
3. a placement the agent could not create that no claim holds any more (its claim was sent
   back, or deleted) is dropped from the spec (`relay.abandoned`), in the same write as 1.
   Nothing exists there: the write goes over the MigNode as read (resourceVersion
   precondition), so a retry the agent reported created meanwhile makes it a 409, and the
   next pass sees a free instance, which only a round's destroy protocol may take away. The
   dropped placement is kept out of the node's offer, and out of the rounds' plans, for
   `FAILED_BACKOFF_S` (`backing_off`, known before the write is sent; forgotten if it
   fails): a claim given it meanwhile fails at once (`PlacementBackingOff`). The back-off
   lives in this process: an operator started again offers it at once, and one more claim
   may fail on it.

A round that planned before the relay wrote would drop a placement not created yet with its
spec: right before each spec write it checks that the node's spec is still the one it planned
on (`PolicyRound.spec_moved`), and plans again otherwise; from then on the snapshot counts the
allocated placement as used.

Level-triggered: a pass reads the newest MigNode and claims it has; what is there already is
not written again, so passes are idempotent, and a write that failed (a 409, the API server
away) is tried again on the next event of the node or the claim. A standby settles nothing:
the leader that takes over settles every node with a claim or a failed placement
(`settle_all`).

Which nodes are in offer mode is the policy's `spec.allocation` (`controller.offers`);
`OfferRelay` takes it as the predicate `offered(node)`. In reactive mode every allocated device
exists already, so the relay finds nothing to do there either way. It tells `changed(node)`
when the devices claims hold on a node, or the placements it refused there, change (the
node's offer depends on both), and a failure condition is written only after
`publish_first(node)` returned: the failed placement must be tainted in the slice before the
scheduler sends the pod back, or it allocates the same placement again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import aiohttp
import structlog
from kubernetes_asyncio.client.exceptions import ApiException

from migpart.controller.indexes import newest_mignode
from migpart.controller.relay import BACKING_OFF, Verdict, binding_entries, relay, verdict
from migpart.dra import (
    INSTANCE_FAILED,
    DeviceId,
    allocation_results,
    as_iso,
    awaiting_binding,
    ours,
)
from migpart.errors import MigpartError
from migpart.kube.claims import body_key
from migpart.kube.watch import Index
from migpart.types import Body

if TYPE_CHECKING:
    from migpart.api.models import MigNode, MigNodeSpec
    from migpart.controller.state import OperatorState

log = structlog.get_logger(__name__)

# How long a placement the relay dropped because the agent could not create it stays out of
# its node's offer and out of the rounds' plans. NVML refuses a create for a reason that
# rarely passes within seconds (INSUFFICIENT_RESOURCES, a GPU in trouble); the agent itself
# retries at most every 60 s. Five minutes spares the pods that would be sent there meanwhile,
# and the space is given back after.
FAILED_BACKOFF_S = 300.0

# What a pass may meet that the next event tries again: a 409 (the object changed), the API
# server away, or no longer leading
DEFERRED = (ApiException, aiohttp.ClientError, TimeoutError, MigpartError)


def held_devices(claim: Body) -> dict[str, list[str]]:
    """Pool (node) -> our device names the claim's allocation holds there."""
    out: dict[str, list[str]] = {}
    for result in ours(allocation_results(claim)):
        if result.pool and result.device:
            out.setdefault(result.pool, []).append(result.device)
    return out


class OfferRelay:
    """Which claims hold our devices on which node, and each node's settling task."""

    def __init__(
        self,
        state: OperatorState,
        offered: Callable[[str], bool] = lambda node: True,
        changed: Callable[[str], None] | None = None,
        publish_first: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self.state = state
        self.offered = offered
        self.changed = changed
        self.publish_first = publish_first
        # node -> the placements the last pass refused there (conflicts, back-offs)
        self.refused: dict[str, frozenset[str]] = {}
        # node -> placement dropped from its spec -> until when it backs off (clock.monotonic)
        self.backoffs: dict[str, dict[str, float]] = {}
        # node -> claim key -> the claim's newest body, for claims holding devices there
        self.claims: dict[str, dict[str, Body]] = {}
        self._nodes_of: dict[str, frozenset[str]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()

    # ------------------------------------------------------------ what the watches tell

    def held(self, node: str) -> frozenset[str]:
        """The device names that claims hold on `node`."""
        return frozenset(
            d
            for claim in self.claims.get(node, {}).values()
            for d in held_devices(claim).get(node, [])
        )

    def claim_changed(self, kind: str, claim: Body) -> None:
        key = body_key(claim)
        held = {} if kind == "DELETED" else held_devices(claim)
        before = self._nodes_of.get(key, frozenset())
        moved = [
            node
            for node in sorted(before | held.keys())
            if sorted(self._held_by(key, node)) != sorted(held.get(node, []))
        ]
        for node in before - held.keys():
            self.claims.get(node, {}).pop(key, None)
            if not self.claims.get(node):
                self.claims.pop(node, None)
        for node in held:
            self.claims.setdefault(node, {})[key] = claim
        self._nodes_of[key] = frozenset(held)
        if not held:
            self._nodes_of.pop(key, None)
        for node in moved:
            if self.changed is not None:
                self.changed(node)
        # a node the claim left too: a placement it held there may be abandoned now
        for node in sorted(held.keys() | set(moved)):
            self.settle(node)

    def _held_by(self, key: str, node: str) -> list[str]:
        known = self.claims.get(node, {}).get(key)
        return held_devices(known).get(node, []) if known is not None else []

    def claims_listed(self, claims: list[Body]) -> None:
        self.claims.clear()
        self._nodes_of.clear()
        for claim in claims:
            self.claim_changed("ADDED", claim)

    def node_changed(self, name: str) -> None:
        if name in self.claims or self.failing(name):
            self.settle(name)

    def settle_all(self) -> None:
        index = self.state.mignode_index()
        for name in sorted(set(self.claims) | {n for n in index if self.failing(n)}):
            self.settle(name)

    def failing(self, name: str) -> bool:
        """Whether the agent of node `name` reports placements it could not create."""
        body = self.mignode(name)
        return bool(((body or {}).get("status") or {}).get("failedInstances"))

    # ------------------------------------------------------------ back-offs

    def backing_off(self, node: str) -> frozenset[str]:
        """The placements dropped from `node`'s spec whose back-off has not ended: not offered
        (`controller.offers`), and not added again for a claim."""
        now = self.state.clock.monotonic()
        return frozenset(d for d, until in self.backoffs.get(node, {}).items() if until > now)

    def backing_off_devices(self) -> frozenset[DeviceId]:
        """Every placement backing off, as a device of its node's pool: a round counts it as a
        used instance (`kube.snapshot`), so it plans nothing over it meanwhile, and leaves it
        out of the specs it writes (`PolicyRound.without_backoffs`)."""
        return frozenset(
            DeviceId(node, device) for node in self.backoffs for device in self.backing_off(node)
        )

    def expire(self) -> None:
        """Forget the back-offs that ended: their nodes offer those placements again and the
        rounds may plan there (the periodic slice resync calls it)."""
        now = self.state.clock.monotonic()
        ended: list[str] = []
        for node, until in list(self.backoffs.items()):
            left = {d: t for d, t in until.items() if t > now}
            if len(left) == len(until):
                continue
            ended.append(node)
            if left:
                self.backoffs[node] = left
            else:
                del self.backoffs[node]
        for node in ended:
            if self.changed is not None:
                self.changed(node)
        if ended:
            self.state.wake_all()

    def _back_off(self, node: str, devices: Sequence[str]) -> None:
        until = self.state.clock.monotonic() + FAILED_BACKOFF_S
        self.backoffs.setdefault(node, {}).update(dict.fromkeys(devices, until))
        if self.changed is not None:
            self.changed(node)

    def _forgive(self, node: str, devices: Sequence[str]) -> None:
        """The drop was not written: its placements are still wanted, and retried."""
        known = self.backoffs.get(node, {})
        for device in devices:
            known.pop(device, None)
        if not known:
            self.backoffs.pop(node, None)
        if self.changed is not None:
            self.changed(node)

    # ------------------------------------------------------------ settling

    def settle(self, name: str) -> None:
        """Settle node `name` soon: one task per node, an event meanwhile asks for one more.
        A node that does not offer has nothing to settle: no task (every allocated claim's
        event comes here, offer publishing on or off)."""
        if not self.offered(name):
            return
        if name in self._tasks:
            self._again.add(name)
            return
        self._tasks[name] = asyncio.create_task(self._run(name), name=f"relay-{name}")

    async def idle(self) -> None:
        """Until no node is settling (tests)."""
        while self._tasks:
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    async def _run(self, name: str) -> None:
        try:
            while True:
                self._again.discard(name)
                try:
                    await self.settle_now(name)
                except DEFERRED as error:  # the next event of the node or a claim tries again
                    log.info("offer_relay_deferred", node=name, error=str(error)[:300])
                except Exception:  # a bug must not end the relay of every other node
                    log.exception("offer_relay_crashed", node=name)
                if name not in self._again:
                    return
        finally:
            del self._tasks[name]

    def mignode(self, name: str) -> Body | None:
        """The newest body of MigNode `name`: the watch's, or our own last write if newer."""
        index = self.state.mignode_index()
        return newest_mignode(index, self.state.written, name)

    async def settle_now(self, name: str) -> None:
        """One pass over node `name` (module docstring)."""
        state = self.state
        claims = dict(self.claims.get(name, {}))
        if not state.leading() or not self.offered(name):
            return
        body = self.mignode(name)
        view = state.scopes.node(name, body) if body is not None else None
        if body is None or view is None:
            return
        node = view.node
        held = sorted((key, d) for key, c in claims.items() for d in held_devices(c).get(name, []))
        decision = relay(node, held, self.backing_off(name))
        refusals = {
            k: Verdict(INSTANCE_FAILED, BACKING_OFF, m) for k, m in decision.backed_off.items()
        }
        refusals.update(
            (k, Verdict(INSTANCE_FAILED, "PlacementConflict", m))
            for k, m in decision.conflicts.items()
        )
        refused = frozenset(device for _, device in refusals)
        if refused != self.refused.get(name, frozenset()):
            if refused:
                self.refused[name] = refused
            else:
                self.refused.pop(name, None)
            if self.changed is not None:
                self.changed(name)
        if decision.spec is not None:
            written = await self._write(name, body, decision.spec, decision.dropped)
            log.info(
                "offer_placements_relayed",
                node=name,
                devices=list(decision.added),
                dropped=list(decision.dropped),
                plan_id=decision.spec.plan_id,
            )
            state.wake_all()  # the rounds plan on the new spec
            view = state.scopes.node(name, written)
            node = view.node if view is not None else node
        for key, claim in sorted(claims.items()):
            await self._bind(node, name, claim, refusals, key)

    async def _write(
        self, name: str, body: Body, spec: MigNodeSpec, dropped: Sequence[str]
    ) -> dict[str, Any]:
        """Write the relayed spec; one that drops placements only over `body` (module
        docstring), their back-off known before it is sent and forgotten if it was not."""
        if not dropped:
            written = await self.state.effects.write_spec(name, spec)
        else:
            self._back_off(name, dropped)
            version = str((body.get("metadata") or {}).get("resourceVersion") or "")
            try:
                written = await self.state.effects.write_spec(name, spec, version)
            except DEFERRED:
                self._forgive(name, dropped)
                raise
        self.state.written[name] = written
        return written

    async def _bind(
        self,
        node: MigNode,
        name: str,
        claim: Body,
        refusals: Mapping[tuple[str, str], Verdict],
        key: str,
    ) -> None:
        """Write the binding verdicts of the claim's devices on node `name` that wait for one."""
        verdicts: dict[DeviceId, Verdict] = {}
        for device in awaiting_binding(claim):
            if device.pool != name:
                continue
            got = refusals.get((key, device.device)) or verdict(node, device)
            if got is not None:
                verdicts[device] = got
        if not verdicts:
            return
        devices = binding_entries(claim, verdicts, as_iso(self.state.clock.now()))
        if devices is None:
            return
        failing = any(v.type == INSTANCE_FAILED for v in verdicts.values())
        if failing and self.publish_first is not None:
            # the failed placement is tainted in the slice before the pod is sent back
            await self.publish_first(name)
        await self.state.effects.write_claim_devices(claim, devices)
        for device, got in verdicts.items():
            log.info(
                "binding_condition_set",
                claim=key,
                device=device.device,
                condition=got.type,
                reason=got.reason,
            )
            if got.type == INSTANCE_FAILED:
                message = f"{device.device} on node {name}: {got.message}"
                self.state.effects.event(claim, "Warning", got.reason, message[:1000])


class RelayingIndex(Index):
    """The `claims_index`, telling the relay each claim event as well."""

    def __init__(
        self,
        relay: OfferRelay,
        entry: Callable[[Body], Mapping[str, Any] | None],
        on_change: Callable[[], None],
    ) -> None:
        super().__init__(entry, on_change)
        self.relay = relay

    def listed(self, objects: Sequence[Body]) -> None:
        super().listed(objects)
        self.relay.claims_listed(list(objects))

    def changed(self, kind: str, obj: Body) -> None:
        super().changed(kind, obj)
        self.relay.claim_changed(kind, obj)

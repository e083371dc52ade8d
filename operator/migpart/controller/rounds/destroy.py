"""The destroy protocol: no instance leaves a MigNode spec while a claim may hold it.

kube-scheduler may allocate a free device in the very moment a plan decides to destroy it
(docs/destroy-protocol.md). So, for each node whose new layout drops existing instances:

1. withdraw: republish the node's slice without those devices (pool generation + 1);
2. grace: wait `grace_s`, so that scheduling cycles that read the old slice land their
   allocation (PreBind) before we look;
3. confirm: read every ResourceClaim with a quorum read; if one names a withdrawn device, the
   device is restored (published again), remembered as used (a *sighting*, see below) and the
   round plans again (`Redo`);
4. only then may the caller write the spec that drops them.

Sightings: the quorum read may see an allocation before the claim watch does. Until the watch
shows it (or FRESH_S passed, e.g. because the claim was deleted in between), the claim counts
as allocated and its devices as used, whatever the index says.

`DestroyProtocol` owns all of it: the withdrawn devices (through the `Effects` port), the
sightings, and the devices left withdrawn by a round that failed before its spec write
(`restore_leftovers`). Every policy has its own planning loop, and their rounds run at the
same time: a withdrawal is a leftover only once the round that made it has ended. Until then
its nodes are in `active` (shared by every round), and no other round publishes them again;
otherwise the scheduler could allocate a device after the owning round's quorum read, and
the spec would drop it while in use.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import structlog

from migpart.api.models import MigNode
from migpart.clock import Clock
from migpart.controller.core.bodies import uid_of
from migpart.controller.core.effects import Effects
from migpart.controller.core.metrics import Metrics
from migpart.controller.core.state import (
    FRESH_S,
    DestroyMemory,
    Hooks,
    JournalEntry,
    Sighting,
)
from migpart.kube.claims import body_key, is_allocated
from migpart.kube.snapshot import node_name
from migpart.mig import Instance
from migpart.planning.model import GpuPlan
from migpart.slices.dra import DeviceId, allocated_ids
from migpart.types import Body

log = structlog.get_logger(__name__)


class Redo(Exception):
    """A device chosen for destruction was allocated meanwhile: plan again from scratch."""


def removed_devices(node: MigNode, targets: Iterable[GpuPlan]) -> frozenset[DeviceId]:
    """Created instances (status) that the target layout drops: these need the protocol."""
    name = node_name(node)
    want = {g.index: set(g.instances) for g in targets}
    gone: set[DeviceId] = set()
    for gpu in node.status.gpus if node.status else []:
        target = want.get(gpu.index)
        if target is None:
            continue
        for inst in gpu.instances:
            if Instance(inst.profile, inst.start) not in target:
                gone.add(DeviceId.of(name, gpu.index, inst.profile, inst.start))
    return frozenset(gone)


@dataclass
class DestroyProtocol:
    effects: Effects
    hooks: Hooks
    metrics: Metrics
    clock: Clock
    # what every round's protocol shares: the grace, the quorum reads' sightings, the claim
    # index's devices, and the nodes whose withdrawal belongs to a round still running
    memory: DestroyMemory

    @contextmanager
    def owning(self, nodes: Collection[str]) -> Iterator[None]:
        """While the block runs, withdrawals on `nodes` are this round's, not leftovers: from
        the first withdrawal until the specs that drop the devices are written."""
        mine = set(nodes) - self.memory.withdrawing
        self.memory.withdrawing.update(mine)
        try:
            yield
        finally:
            self.memory.withdrawing.difference_update(mine)

    async def restore_leftovers(self) -> None:
        """Devices still withdrawn at the start of a round, on a node no running round owns,
        belong to a round that failed before writing its spec: publish them again; this round
        withdraws anew if needed."""
        for name in self.effects.withdrawing():
            if name in self.memory.withdrawing:
                continue  # mid-protocol in another policy's round
            leftover = self.effects.withdrawn(name)
            if leftover:
                await self.effects.restore(name, leftover)
                self.hooks.record(JournalEntry("restored", name, leftover))

    def fresh(self, claims: Mapping[str, Body]) -> dict[str, Sighting]:
        """The sightings the claim index has not caught up with yet (those it has, and stale
        ones, are forgotten here)."""
        sightings = self.memory.fresh_allocations
        if not sightings:
            return sightings
        caught_up = {uid_of(c) for c in claims.values() if is_allocated(c)}
        now = self.clock.monotonic()
        for uid in [u for u, s in sightings.items() if u in caught_up or now - s.seen > FRESH_S]:
            del sightings[uid]
        return sightings

    def allocated(self, claims: Mapping[str, Body]) -> frozenset[DeviceId]:
        """Every device a claim holds: as the index shows, plus the sightings."""
        indexed = self.memory.allocations.of(claims)
        return indexed.union(*(s.devices for s in self.fresh(claims).values()))

    def unseen_claims(self, claims: Mapping[str, Body]) -> frozenset[str]:
        """Keys of the claims a quorum read saw allocated while the index still shows them
        unallocated (by uid: a claim made again under the same name is not one of them)."""
        fresh = self.fresh(claims)
        if not fresh:
            return frozenset()
        return frozenset(
            body_key(c) for c in claims.values() if not is_allocated(c) and uid_of(c) in fresh
        )

    async def clear(
        self, work: list[tuple[MigNode, list[GpuPlan]]], policy: Body
    ) -> tuple[list[str], list[str]]:
        """Steps 1-3 for the nodes of one plan at once: each node's withdrawal, then one grace
        and one quorum read for all of them (a round that reconfigures 50 nodes waits one
        grace, not 50, and lists the claims once). Returns (cleared, kept): the nodes whose
        spec may now be written (nothing dropped, or nothing they drop is held), and the
        nodes where a device got allocated in the window. Those devices are published again
        and count as used in the next plan; the caller writes the cleared nodes and then
        plans again (`Redo`). The Event about kept devices goes to `policy`."""
        removing: dict[str, frozenset[DeviceId]] = {}
        for node, targets in work:
            removed = removed_devices(node, targets)
            if removed:
                removing[node_name(node)] = removed
        if not removing:
            return [node_name(node) for node, _ in work], []
        # The slice, the port and the journal name devices within the node's pool.
        gone = {name: frozenset(d.device for d in removed) for name, removed in removing.items()}
        generations = await asyncio.gather(
            *(self.effects.withdraw(name, devices) for name, devices in gone.items())
        )
        for (name, devices), generation in zip(gone.items(), generations, strict=True):
            self.hooks.record(JournalEntry("withdrawn", name, devices, f"generation {generation}"))
            if self.hooks.after_withdraw is not None:
                await self.hooks.after_withdraw(name, devices)
        await self.clock.sleep(self.memory.grace_s)
        claims = await self.effects.read_claims()
        held: dict[str, dict[str, frozenset[DeviceId]]] = {}  # node -> claim uid -> devices
        for claim in claims:
            ids = allocated_ids(claim)
            for name, removed in removing.items():
                if ids & removed:
                    held.setdefault(name, {})[uid_of(claim)] = ids & removed
        now = self.clock.monotonic()
        for name in removing:
            if name not in held:
                self.hooks.record(JournalEntry("confirmed", name, gone[name]))
                continue
            for claim_uid, ids in held[name].items():
                self.memory.fresh_allocations[claim_uid] = Sighting(ids, now)
            kept = frozenset(d.device for ids in held[name].values() for d in ids)
            await self.effects.restore(name, kept)
            self.metrics.destroy_aborted.inc(len(kept))
            self.hooks.record(JournalEntry("kept", name, kept))
            self.effects.event(
                policy,
                "Warning",
                "DestroyAborted",
                f"node {name}: {', '.join(sorted(kept))} got allocated while being withdrawn; "
                "kept, planning again",
            )
            log.warning("destroy_aborted", node=name, devices=sorted(kept))
        cleared = [node_name(node) for node, _ in work if node_name(node) not in held]
        return cleared, sorted(held)

"""Offer mode's wiring: which nodes publish offers, and what their pools list.

Off unless the operator runs with `--offer-publishing` (`OperatorState.offer_publishing`):
then every node in the scope of a policy whose mode in effect is Offer
(`controller.allocation.resolve_allocation`) publishes, through the one `SlicePublisher`,
`migpart.offer_content.offer_slices` with the offer `migpart.planning.offer.offer` computes
for it; every other node keeps reactive mode's `node_slices`, byte for byte.

What the pool depends on besides the MigNode (which the publisher sees): the policy that covers
the node (a round tells it, `Offers.assign`), the devices claims hold there, the placements
the relay refused and those it dropped and backs off from (the relay tells them,
`Offers.touch`). Each change makes the publisher compute the node's slices again
(`on_change`: invalidate and publish). Not every change is written at once: `Offers.needs`,
given to the publisher as its `needs`, lets one that kube-scheduler cannot act on while the
node's allocations stand wait a few seconds (`migpart.offer_content.scheduler_needs`;
docs/offer-mode.md, "What may wait").

What is not offered (docs/offer-mode.md, "Turning it on"): placements that would displace free
instances (the relay creates a placement only where nothing is; destroying a free instance is
the destroy protocol's, i.e. a planning round's), placements whose creation failed (while the
agent reports it, and for the relay's back-off once it dropped them from the spec), and, on a
GPU a multi-GPU request holds whole, nothing is held back yet. A round of an offering policy
plans only for claims whose pods the scheduler found unschedulable (`unschedulable_requests`):
the others are served from the offer, and a round would only race the scheduler for them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from migpart.api.models import MigNode
from migpart.controller.relay import placements
from migpart.kube.placement import Placement
from migpart.mig import Instance, device_name
from migpart.offer_content import offer_slices, scheduler_needs
from migpart.planning.model import InstanceState, PolicyView, Request
from migpart.planning.offer import (
    DEFAULT_DEPTH,
    NO_DISPLACING,
    Holdback,
    OfferGpu,
    node_spares,
    offer,
)
from migpart.slice_content import DeviceCache, SliceContent, node_slices


@dataclass(frozen=True, slots=True)
class NodeOffer:
    """Why a node publishes offers: the policy whose scope it is in, and what it permits."""

    policy: str
    view: PolicyView


def offer_gpus(node: MigNode, held: Iterable[str] = ()) -> list[OfferGpu]:
    """The node's MIG GPUs as the steering sees them: the instances the GPU keeps (what the
    spec wants, or what exists where the spec does not list the GPU), plus every instance in
    use or held by a claim, plus every placement a claim holds that is not created yet (used:
    nothing is offered over it)."""
    holding = set(held)
    desired = node.desired()
    where = placements(node)
    out: list[OfferGpu] = []
    for gpu in node.status.gpus if node.status else []:
        if not gpu.mig_enabled or not gpu.profiles:
            continue
        table = gpu.table()
        used: set[Instance] = set()
        now: set[Instance] = set()
        for inst in gpu.instances:
            geometry = Instance(inst.profile, inst.start)
            now.add(geometry)
            name = device_name(gpu.index, inst.profile, inst.start)
            if inst.state != "Free" or name in holding:
                used.add(geometry)
        used |= {p.instance for n, p in where.items() if p.gpu == gpu.index and n in holding}
        kept = set(desired[gpu.index]) if gpu.index in desired else now
        instances = tuple(
            InstanceState(i.profile, i.start, used=i in used)
            for i in sorted(kept | used)
            if table.has(i.profile)
        )
        out.append(OfferGpu(gpu.index, table, instances))
    return out


def failed_placements(node: MigNode) -> frozenset[str]:
    """The devices of the placements the agent reports it could not create."""
    failures = node.status.failed_instances if node.status else []
    return frozenset(device_name(f.gpu, f.profile, f.start) for f in failures)


def planned_overlaps(node: MigNode) -> frozenset[str]:
    """The placements that overlap an instance the node's spec wants and its agent has not
    made yet (a round's plan, or a placement the relay wrote for a claim): leaving the offer,
    they must leave at once (`Offers.needs`), or one could be allocated over the instance on
    its way."""
    desired = node.desired()
    out: set[str] = set()
    for gpu in node.status.gpus if node.status else []:
        want = desired.get(gpu.index)
        if not want or not gpu.mig_enabled or not gpu.profiles:
            continue
        table = gpu.table()
        have = {Instance(i.profile, i.start) for i in gpu.instances}
        for inst in want - have:
            if not table.has(inst.profile):
                continue
            mask = table.profile(inst.profile).mask(inst.start)
            out.update(
                device_name(gpu.index, p.name, start)
                for p in table.profiles
                for start in p.placements
                if p.mask(start) & mask
            )
    return frozenset(out)


def node_offer(
    node: MigNode, view: PolicyView, held: Iterable[str] = (), depth: int = DEFAULT_DEPTH
) -> list[tuple[int, Instance]]:
    """The placements node `node` offers under `view`, best first (`planning.offer.offer`),
    at most `depth` per profile (whole-GPU profiles: at least one per GPU)."""
    gpus = offer_gpus(node, held)
    holdback = Holdback(spares=node_spares(gpus, view.spares))
    offered = offer(gpus, view, holdback, waiting=NO_DISPLACING, depth=depth)
    return [(o.gpu, o.instance) for o in offered]


def offer_pool(
    node: MigNode,
    view: PolicyView,
    withdrawn: frozenset[str],
    available: bool,
    held: frozenset[str],
    refused: frozenset[str],
    cache: DeviceCache | None = None,
    backing_off: frozenset[str] = frozenset(),
    depth: int = DEFAULT_DEPTH,
) -> list[SliceContent]:
    """The slices of an offering node's pool (pure): its offer, every device a claim holds,
    and the placements that failed (the agent's, the relay's `refused`, and those it dropped
    and backs off from: `backing_off`) left out of the offer, tainted where a claim holds
    one."""
    return offer_slices(
        node,
        node_offer(node, view, held, depth),
        withdrawn,
        available,
        allocated=held,
        cache=cache,
        # a refused placement no claim holds any more is not offered again by itself (it
        # overlaps what the GPU keeps); a dropped one is free space again, hence the back-off
        failed=failed_placements(node) | (refused & held) | backing_off,
    )


def unschedulable_requests(
    requests: Sequence[Request], waiting: Mapping[str, Sequence[Placement]]
) -> tuple[Request, ...]:
    """What a round of an offering policy plans for: the requests of claims a waiting pod of
    which kube-scheduler found unschedulable (`PodScheduled=False/Unschedulable`: no offered
    device fits, e.g. it needs free instances displaced). Any other pending claim is being
    served from the offer, with no round in its path."""
    return tuple(
        r for r in requests if any(p.get("unschedulable") for p in waiting.get(r.name, ()))
    )


def _none(_node: str) -> frozenset[str]:
    return frozenset()


def _ignore(_node: str) -> None:
    return None


@dataclass
class Offers:
    """The nodes that publish offers now, and the publisher's `slices` function.

    `held(node)`: the device names claims hold on the node; `refused(node)`: placements the
    relay refused there; `backing_off(node)`: placements the relay dropped there lately
    because they could not be created; `on_change(node)`: the node's slices must be computed
    again. `depth`: new placements offered per profile and node (`node_offer`).
    """

    held: Callable[[str], frozenset[str]] = _none
    refused: Callable[[str], frozenset[str]] = _none
    on_change: Callable[[str], None] = _ignore
    backing_off: Callable[[str], frozenset[str]] = _none
    depth: int = DEFAULT_DEPTH
    _nodes: dict[str, NodeOffer] = field(default_factory=dict)
    # node -> `planned_overlaps` of the MigNode its slices were last computed from (`slices`)
    _planned: dict[str, frozenset[str]] = field(default_factory=dict)

    def offered(self, node: str) -> bool:
        """Whether node `node` publishes offers (the relay's predicate)."""
        return node in self._nodes

    def of(self, node: str) -> NodeOffer | None:
        return self._nodes.get(node)

    def assign(self, policy: str, nodes: Iterable[str], offer: NodeOffer | None) -> list[str]:
        """A round of `policy` says which nodes its scope holds and whether they offer (None:
        they do not). Returns the nodes whose offer changed (told to `on_change`)."""
        scope = set(nodes)
        changed: set[str] = set()
        for name, known in list(self._nodes.items()):
            if known.policy == policy and (offer is None or name not in scope):
                del self._nodes[name]
                changed.add(name)
        if offer is not None:
            for name in scope:
                if self._nodes.get(name) != offer:
                    self._nodes[name] = offer
                    changed.add(name)
        for name in sorted(changed):
            self.on_change(name)
        return sorted(changed)

    def drop(self, policy: str) -> list[str]:
        """The policy is gone: its nodes publish reactively again."""
        return self.assign(policy, (), None)

    def touch(self, node: str) -> None:
        """The devices held on `node`, or the placements refused or backing off there,
        changed."""
        if node in self._nodes:
            self.on_change(node)

    def slices(
        self, node: MigNode, withdrawn: frozenset[str], available: bool, cache: DeviceCache
    ) -> list[SliceContent]:
        """`SlicePublisher.slices`: offer mode's pool for an offering node, else reactive
        mode's slice."""
        name = str(node.metadata.get("name", ""))
        known = self._nodes.get(name)
        if known is None:
            self._planned.pop(name, None)
            return node_slices(node, withdrawn, available, cache)
        self._planned[name] = planned_overlaps(node)
        return offer_pool(
            node,
            known.view,
            withdrawn,
            available,
            self.held(name),
            self.refused(name),
            cache,
            self.backing_off(name),
            self.depth,
        )

    def needs(self, node: str, published: list[SliceContent], wanted: list[SliceContent]) -> bool:
        """`SlicePublisher.needs`: for an offering node, whether kube-scheduler can act now on
        the change from `published` to `wanted`, with the devices claims hold there
        (`offer_content.scheduler_needs`); any change of another node's slice is needed.
        A placement may not linger in the offer once it failed, was refused, or overlaps an
        instance the spec wants made (`planned_overlaps` of the MigNode `wanted` was computed
        from: the publisher computes a node's slices before it asks)."""
        if node not in self._nodes:
            return True
        unusable = (
            self.refused(node) | self.backing_off(node) | self._planned.get(node, frozenset())
        )
        return scheduler_needs(published, wanted, self.held(node), unusable)

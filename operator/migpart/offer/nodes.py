"""Which nodes offer, under which policy, and what their pools list.

Every node in the scope of a policy whose mode in effect is Offer (`migpart.offer.mode`) is
told here by that policy's rounds (`OfferingNodes.assign`), which give it the offering spec.
The one `SlicePublisher` asks `OfferingNodes.slices` for every node's slices: the stable pool
(`migpart.offer.pool.stable_pool`, its placements in the planner's order) for a node whose
MigNode spec says `allocation: Offer`, every other node's reactive slice
(`migpart.slices.content.node_slices`), byte for byte as without offer mode. The pool follows
the spec, not the assignment, because the agent does: a node joins offer mode once its agent
makes room at prepare, and leaves it once a round handed it back (`PolicyRound.write_modes`,
which waits until every placement a claim holds there is made), never with an allocation of
the pool in flight that reactive mode's slice would not count. Its policy's view is the
assigned one, or the last one known (every profile if none).

Besides the MigNode (which the publisher hands over), an offering node's pool depends on its
policy and on the devices claims hold there that the policy's order does not list (a claim
allocated before the policy changed): the claim index tells every claim event
(`HoldingIndex`), and only a held device outside the node's order makes the pool be computed
again (`on_change`). An allocation of a listed placement changes nothing here: that is the
point of the design.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from migpart.api.models import MigNode
from migpart.kube.claims import body_key
from migpart.kube.watch import Index
from migpart.mig import device_name
from migpart.mig.profiles import ModelTable
from migpart.offer.pool import node_gpus, stable_pool
from migpart.planning.listing import planner_order
from migpart.planning.model import DeviceRef, PolicyView
from migpart.slices.content import DeviceCache, SliceContent, node_slices
from migpart.slices.dra import allocation_results, ours
from migpart.types import Body

# Orders kept (one per GPU set and policy view; a fleet has few).
_ORDERS_KEPT = 256


@dataclass(frozen=True, slots=True)
class NodeOffer:
    """Why a node offers: the policy whose scope it is in, and what that policy permits."""

    policy: str
    view: PolicyView


def held_devices(claim: Body) -> dict[str, frozenset[str]]:
    """Pool (node) -> our device names the claim's allocation holds there."""
    out: dict[str, set[str]] = {}
    for result in ours(allocation_results(claim)):
        if result.pool and result.device:
            out.setdefault(result.pool, set()).add(result.device)
    return {node: frozenset(devices) for node, devices in out.items()}


def _ignore(_node: str) -> None:
    return None


class OfferingNodes:
    """The nodes that offer now, the devices claims hold on every node, and the publisher's
    `slices` function. `on_change(node)`: the node's slices must be computed again; `taints`:
    the API server serves device taints (`stable_pool`)."""

    def __init__(self, on_change: Callable[[str], None] = _ignore, taints: bool = True) -> None:
        self.on_change = on_change
        self.taints = taints
        self._nodes: dict[str, NodeOffer] = {}
        # claim key -> node -> the devices it holds there; node -> claim key -> the same
        self._claims: dict[str, dict[str, frozenset[str]]] = {}
        self._held: dict[str, dict[str, frozenset[str]]] = {}
        # node -> the device names its pool listed from the order when last computed
        self._listed: dict[str, frozenset[str]] = {}
        # node -> the view it last offered under (a node whose spec still says Offer after
        # its policy let it go offers under it until handed back)
        self._views: dict[str, PolicyView] = {}
        self._orders: dict[tuple[Any, ...], tuple[tuple[DeviceRef, ...], frozenset[str]]] = {}

    # ------------------------------------------------------------------ which nodes offer

    def offered(self, node: str) -> bool:
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
                    self._views[name] = offer.view
                    changed.add(name)
        for name in sorted(changed):
            self.on_change(name)
        return sorted(changed)

    def drop(self, policy: str) -> list[str]:
        """The policy is gone: its nodes publish reactively again."""
        return self.assign(policy, (), None)

    # ------------------------------------------------------------------ what claims hold

    def held(self, node: str) -> frozenset[str]:
        """The device names that claims hold on `node`."""
        return frozenset().union(*self._held.get(node, {}).values())

    def claim_changed(self, kind: str, claim: Body) -> None:
        key = body_key(claim)
        now = {} if kind == "DELETED" else held_devices(claim)
        before = self._claims.pop(key, {})
        if now:
            self._claims[key] = now
        for node in before.keys() | now.keys():
            was, held = before.get(node, frozenset()), now.get(node, frozenset())
            if was == held:
                continue
            on_node = self._held.setdefault(node, {})
            if held:
                on_node[key] = held
            else:
                on_node.pop(key, None)
                if not on_node:
                    del self._held[node]
            if node in self._listed and not (was ^ held) <= self._listed[node]:
                self.on_change(node)  # a held device outside the order came or went

    def claims_listed(self, claims: Sequence[Body]) -> None:
        nodes = set(self._held)
        self._claims.clear()
        self._held.clear()
        for claim in claims:
            self.claim_changed("ADDED", claim)
        for node in sorted((nodes | set(self._held)) & self._listed.keys()):
            self.on_change(node)

    # ------------------------------------------------------------------ the pool

    def order(self, gpus: Mapping[int, ModelTable], view: PolicyView) -> tuple[DeviceRef, ...]:
        """`planner_order` of a node's GPUs under `view`, computed once per GPU set."""
        return self._order(gpus, view)[0]

    def _order(
        self, gpus: Mapping[int, ModelTable], view: PolicyView
    ) -> tuple[tuple[DeviceRef, ...], frozenset[str]]:
        key = (tuple(sorted(gpus.items(), key=lambda item: item[0])), view)
        known = self._orders.get(key)
        if known is None:
            order = planner_order(gpus, view)
            names = frozenset(device_name(r.gpu, r.profile, r.start) for r in order)
            if len(self._orders) >= _ORDERS_KEPT:
                self._orders.clear()
            known = self._orders[key] = (order, names)
        return known

    def slices(
        self, node: MigNode, withdrawn: frozenset[str], available: bool, cache: DeviceCache
    ) -> list[SliceContent]:
        """`SlicePublisher.slices`: the stable pool of a node whose spec says Offer, else
        reactive mode's slice (`withdrawn` is the destroy protocol's, which never acts on an
        offering node)."""
        name = str(node.metadata.get("name", ""))
        if node.spec is None or node.spec.allocation != "Offer":
            self._listed.pop(name, None)
            return node_slices(node, withdrawn, available, cache)
        known = self._nodes.get(name)
        view = known.view if known is not None else self._views.get(name, PolicyView())
        order, names = self._order(node_gpus(node), view)
        self._listed[name] = names
        return stable_pool(node, order, self.held(name), available, cache, self.taints)


class HoldingIndex(Index):
    """The `claims_index`, telling `OfferingNodes` each claim event as well."""

    def __init__(
        self,
        nodes: OfferingNodes,
        entry: Callable[[Body], Mapping[str, Any] | None],
        on_change: Callable[[], None],
    ) -> None:
        super().__init__(entry, on_change)
        self.nodes = nodes

    def listed(self, objects: Sequence[Body]) -> None:
        super().listed(objects)
        self.nodes.claims_listed(list(objects))

    def changed(self, kind: str, obj: Body) -> None:
        super().changed(kind, obj)
        self.nodes.claim_changed(kind, obj)

"""The indexes: in-memory maps of the watched objects that every planning round reads.

Each index keeps what a round needs of one object and wakes the planning loops (a change
counts as one: see `OperatorState.changes`). All of them are kept by the operator's own
plain-JSON watches (`WATCHED`, `kube.watch`; MigNodes: `controller/watching/mignodes.py`), not by
kopf's indexes: they cost a fraction of kopf's per-event handling, and a relist replaces
what they hold, where a kopf index keeps the objects deleted while its watch was down (a
policy deleted then would go on owning its nodes). kopf still runs the policies' event
handler (`handlers.policy_changed`: a planning loop per policy). `cluster_from` turns the
live indexes into the `Cluster` value a round works on, and `with_own_writes` lays over it
the MigNodes the operator wrote that the watch has not shown yet.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kubernetes_asyncio.client import ApiClient, CustomObjectsApi

from migpart.api.models import GROUP, POLICY_PLURAL, VERSION
from migpart.controller.core.bodies import name_of
from migpart.controller.core.state import OperatorState
from migpart.kube.claims import claim_key, pod_claim_keys, pod_waiting
from migpart.kube.placement import NodeFacts, PodPlacement, node_facts, pod_placement
from migpart.kube.watch import (
    Index,
    ListCall,
    all_claims,
    all_device_classes,
    all_nodes,
    all_pods,
    follow,
)
from migpart.types import Body


def state_of(memo: Any) -> OperatorState:
    state: OperatorState = memo.state
    return state


def plain(body: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """Some top-level fields as a plain dict. No copy: kopf parses every watch event into new
    dicts and never changes them afterwards, and nothing in migpart writes to an index value
    (a deep copy per event was a tenth of the operator's CPU at 1,000 nodes)."""
    return {k: body[k] for k in keys if k in body}


def _flatten(index: Mapping[Any, Any]) -> dict[str, Any]:
    """A kopf index (key -> store of values) as key -> the one value per key."""
    out: dict[str, Any] = {}
    for key, store in index.items():
        for value in store:
            out[str(key)] = value
    return out


class _Labels(Mapping[str, Mapping[str, str]]):
    """Node name -> labels, read through the nodes' facts (no copy per round)."""

    def __init__(self, facts: Mapping[str, NodeFacts]) -> None:
        self._facts = facts

    def __getitem__(self, name: str) -> Mapping[str, str]:
        return self._facts[name].labels

    def __iter__(self) -> Iterator[str]:
        return iter(self._facts)

    def __len__(self) -> int:
        return len(self._facts)


@dataclass(frozen=True)
class Cluster:
    """What the indexes hold at the start of a round (plain bodies): the value a round reads."""

    mignodes: Mapping[str, Body]
    node_labels: Mapping[str, Mapping[str, str]]
    policies: Mapping[str, Body]
    claims: Mapping[str, Body]
    # claim key -> the placements (kube.placement) of the waiting pods that use it
    waiting: Mapping[str, tuple[PodPlacement, ...]]
    device_classes: Mapping[str, Body]
    # Node name -> labels and taints
    node_facts: Mapping[str, NodeFacts] = field(default_factory=dict)
    # MigNode name -> why the operator leaves it alone (controller.core.health.NodeHealth)
    unavailable: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Indexes:
    """The live index views a round reads, each key -> the store of its values (a
    `kube.watch.Index`; the tests' plain dicts of lists)."""

    mignodes: Mapping[str, Any]
    nodes: Mapping[str, Any]
    policies: Mapping[str, Any]
    claims: Mapping[str, Any]
    waiting: Mapping[str, Any]
    classes: Mapping[str, Any]

    @staticmethod
    def of(mignodes: Index, watched: Mapping[str, Index]) -> Indexes:
        """The MigNode watch's index and the WATCHED ones, by their ids."""
        return Indexes(
            mignodes=mignodes,
            nodes=watched["nodes_index"],
            policies=watched["policies_index"],
            claims=watched["claims_index"],
            waiting=watched["waiting_index"],
            classes=watched["classes_index"],
        )


def cluster_from(indexes: Indexes) -> Cluster:
    """The round's view of the cluster, read from the live indexes."""
    nodes: dict[str, NodeFacts] = _flatten(indexes.nodes)
    return Cluster(
        mignodes=_flatten(indexes.mignodes),
        node_labels=_Labels(nodes),
        policies=_flatten(indexes.policies),
        claims=_flatten(indexes.claims),
        waiting={str(k): tuple(store) for k, store in indexes.waiting.items()},
        device_classes=_flatten(indexes.classes),
        node_facts=nodes,
    )


def cluster_now(state: OperatorState) -> Cluster:
    """The cluster as the indexes hold it now, with the nodes the operator leaves alone (agent
    Lease expired, plugin not registered): what a round works on."""
    assert state.watches.indexes is not None  # set at startup, before any task reads it
    unavailable = dict(state.health.unavailable())
    return replace(cluster_from(state.watches.indexes), unavailable=unavailable)


def claim_entry(body: Body) -> dict[str, Any]:
    """Claim key -> what a round needs of the claim (the `claims` watched index)."""
    meta = body.get("metadata") or {}
    value = plain(body, ("metadata", "spec", "status"))
    value["apiVersion"] = "resource.k8s.io/v1"
    value["kind"] = "ResourceClaim"
    return {claim_key(str(meta.get("namespace") or ""), str(meta.get("name") or "")): value}


def waiting_entry(body: Body) -> dict[str, Any] | None:
    """Claim key -> the placement and priority of a waiting pod (`pod_waiting`) that uses it
    (the `waiting` watched index)."""
    claims = pod_claim_keys(body)
    if not claims or not pod_waiting(body):
        return None
    placement = pod_placement(body)
    return {key: placement for key in claims}


@dataclass(frozen=True)
class Watched:
    """An index the operator keeps with its own watch (kube.watch), not kopf's."""

    lister: Callable[[ApiClient], ListCall]  # the cluster-wide list call
    entry: Callable[[Body], Mapping[str, Any] | None]
    selectors: Mapping[str, str] = field(default_factory=dict)
    quiet_when_same: bool = False  # see kube.watch.Index


def object_entry(body: Body) -> dict[str, Any]:
    """name -> the whole object, status included (the `policies` watched index, and the
    MigNodes': a restarted operator builds a policy's next status on the last one written)."""
    return {name_of(body): plain(body, ("apiVersion", "kind", "metadata", "spec", "status"))}


def node_entry(body: Body) -> dict[str, Any]:
    """Node name -> its labels and taints (the `nodes` watched index)."""
    return {name_of(body): node_facts(body)}


def class_entry(body: Body) -> dict[str, Any]:
    """DeviceClass name -> its metadata and spec (the `classes` watched index)."""
    return {name_of(body): plain(body, ("metadata", "spec"))}


def all_policies(api: ApiClient) -> ListCall:
    return functools.partial(
        CustomObjectsApi(api).list_cluster_custom_object, GROUP, VERSION, POLICY_PLURAL
    )


# Every index a round reads but the MigNodes' (controller/watching/mignodes.py).
# id -> how to keep it.
WATCHED: dict[str, Watched] = {
    "claims_index": Watched(all_claims, claim_entry),
    # pods no node holds yet: a bound pod leaves the watch (a DELETED event), and the
    # cluster's running pods cost nothing
    "waiting_index": Watched(all_pods, waiting_entry, {"field_selector": "spec.nodeName="}),
    # a Node's status changes often and its labels and taints seldom: only they wake rounds
    "nodes_index": Watched(all_nodes, node_entry, quiet_when_same=True),
    "policies_index": Watched(all_policies, object_entry),
    "classes_index": Watched(all_device_classes, class_entry),
}


class NodeIndex(Index):
    """The `nodes_index`, which also tells node health each Node's labels: a node that does
    not opt in (`--node-selector`) gets no device (`NodeHealth`, `NotOptedIn`)."""

    def __init__(self, state: OperatorState) -> None:
        watched = WATCHED["nodes_index"]
        super().__init__(watched.entry, state.wake_all, quiet_when_same=watched.quiet_when_same)
        self.state = state

    def listed(self, objects: Sequence[Body]) -> None:
        super().listed(objects)
        self.state.health.nodes_listed({name_of(o): _labels(o) for o in objects})

    def changed(self, kind: str, obj: Body) -> None:
        super().changed(kind, obj)
        self.state.health.node_changed(name_of(obj), None if kind == "DELETED" else _labels(obj))


def _labels(body: Body) -> Mapping[str, str]:
    labels: Mapping[str, str] = (body.get("metadata") or {}).get("labels") or {}
    return labels


def watched_indexes(state: OperatorState) -> dict[str, Index]:
    """A fresh `kube.watch.Index` per WATCHED id, waking the planning loops on each change."""
    return {
        index_id: NodeIndex(state)
        if index_id == "nodes_index"
        else Index(w.entry, state.wake_all, quiet_when_same=w.quiet_when_same)
        for index_id, w in WATCHED.items()
    }


async def watch_index(api: ApiClient, index_id: str, index: Index) -> None:
    """Keep one of the WATCHED indexes until cancelled."""
    watched = WATCHED[index_id]
    await follow(watched.lister(api), index, index_id, **watched.selectors)


def _revision(body: Body) -> int | None:
    value = (body.get("metadata") or {}).get("resourceVersion")
    if not isinstance(value, str | int):
        return None
    try:
        return int(value)
    except ValueError:
        return None


def with_own_writes(cluster: Cluster, written: dict[str, dict[str, Any]]) -> Cluster:
    """The cluster with the MigNodes this operator wrote and the watch has not shown yet.

    Watches lag: a round that started right after another one wrote a spec could still see the
    old spec in the index, take the node for idle, and plan it a second time. The patch
    response is the whole object at a newer revision, so it stands in until the index catches
    up (then it is forgotten). Resource versions are etcd revisions; where one is not a number,
    the written body wins until the index shows the same plan.
    """
    if not written:
        return cluster
    mignodes = dict(cluster.mignodes)
    for name, body in list(written.items()):
        seen = mignodes.get(name)
        if seen is None:
            written.pop(name)
            continue
        mine, theirs = _revision(body), _revision(seen)
        if mine is not None and theirs is not None:
            caught_up = theirs >= mine
        else:
            caught_up = (seen.get("spec") or {}).get("planId") == (body.get("spec") or {}).get(
                "planId"
            )
        if caught_up:
            written.pop(name)
        else:
            mignodes[name] = body
    return replace(cluster, mignodes=mignodes)


def newest_mignode(index: Mapping[str, Any], written: Mapping[str, Body], name: str) -> Body | None:
    """MigNode `name` as the newest of what the watch shows (`index`, the `mignodes_index`)
    and what this operator last wrote (`written`), by resourceVersion."""
    seen = next(iter(index[name]), None) if name in index else None
    mine = written.get(name)
    if mine is None:
        return seen
    if seen is None:
        return mine
    return mine if (_revision(mine) or 0) > (_revision(seen) or 0) else seen

"""The kopf indexes: in-memory maps of the watched objects that every planning round reads.

Each index handler keeps what a round needs of one object and wakes the planning loops (a
change counts as one: see `OperatorState.changes`); `cluster_from` turns the live indexes into
the `Cluster` value a round works on, and `with_own_writes` lays over it the MigNodes the
operator wrote that the watch has not shown yet.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import kopf

from migpart.api.models import GROUP, MIGNODE_PLURAL, POLICY_PLURAL, VERSION
from migpart.controller.scope import Cluster
from migpart.controller.state import OperatorState
from migpart.kube.claims import claim_key, pod_claim_keys, pod_waiting
from migpart.kube.placement import NodeFacts, node_facts, pod_placement

RESOURCE = ("resource.k8s.io", "v1")
Body = Mapping[str, Any]


def state_of(memo: Any) -> OperatorState:
    state: OperatorState = memo.state
    return state


def _plain(body: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
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


def cluster_from(indexes: Mapping[str, Any]) -> Cluster:
    """The round's view of the cluster, read from the live indexes."""
    nodes = {
        name: NodeFacts(facts["labels"], tuple(facts["taints"]))
        for name, facts in _flatten(indexes["nodes_index"]).items()
    }
    return Cluster(
        mignodes=_flatten(indexes["mignodes_index"]),
        node_labels={name: facts.labels for name, facts in nodes.items()},
        policies=_flatten(indexes["policies_index"]),
        claims=_flatten(indexes["claims_index"]),
        waiting={str(k): tuple(store) for k, store in indexes["waiting_index"].items()},
        device_classes=_flatten(indexes["classes_index"]),
        node_facts=nodes,
    )


async def claims_index(
    namespace: str | None, name: str, body: kopf.Body, memo: Any, **_: Any
) -> Any:
    state_of(memo).wake_all()
    value = _plain(body, ("metadata", "spec", "status"))
    value["apiVersion"] = "resource.k8s.io/v1"
    value["kind"] = "ResourceClaim"
    return {claim_key(namespace or "", name): value}


async def waiting_index(body: kopf.Body, memo: Any, **_: Any) -> Any:
    """Claim key -> the placement and priority of a waiting pod (`pod_waiting`) that uses it."""
    claims = pod_claim_keys(body)
    if not claims:
        return None
    state_of(memo).wake_all()  # also when it stops waiting: the claim may be served
    if not pod_waiting(body):
        return None
    placement = pod_placement(body)
    return {key: placement for key in claims}


async def mignodes_index(name: str, body: kopf.Body, memo: Any, **_: Any) -> Any:
    state_of(memo).wake_all()
    return {name: _plain(body, ("apiVersion", "kind", "metadata", "spec", "status"))}


async def nodes_index(name: str, body: kopf.Body, memo: Any, **_: Any) -> Any:
    state_of(memo).wake_all()
    return {name: node_facts(body)}


async def policies_index(name: str, body: kopf.Body, memo: Any, **_: Any) -> Any:
    state_of(memo).wake_all()
    # status too: a restarted operator builds the next status on the last one written
    return {name: _plain(body, ("apiVersion", "kind", "metadata", "spec", "status"))}


async def classes_index(name: str, body: kopf.Body, memo: Any, **_: Any) -> Any:
    state_of(memo).wake_all()
    return {name: _plain(body, ("metadata", "spec"))}


# (group, version, plural) and handler of every index; the handler's name is the index id.
INDEXES: tuple[tuple[tuple[str, str, str], Any], ...] = (
    ((*RESOURCE, "resourceclaims"), claims_index),
    (("", "v1", "pods"), waiting_index),
    ((GROUP, VERSION, MIGNODE_PLURAL), mignodes_index),
    (("", "v1", "nodes"), nodes_index),
    ((GROUP, VERSION, POLICY_PLURAL), policies_index),
    ((*RESOURCE, "deviceclasses"), classes_index),
)
INDEX_IDS = tuple(handler.__name__ for _, handler in INDEXES)


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

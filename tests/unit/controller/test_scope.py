"""Scoping, and that the cache behind it redoes only what changed."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from migpart.api.models import MigInstanceStatus, MigNode, MigNodeStatus
from migpart.controller.rounds.scope import ScopeCache
from migpart.controller.watching.indexes import Cluster
from migpart.kube.placement import NodeFacts
from migpart.slices.dra import DRIVER
from tests.unit.controller.factories import DEVICE_CLASS, claim, mignode, placement, policy
from tests.unit.kube.factories import gpu


def cluster(**changes: Any) -> Cluster:
    labels = {"a1": {"pool": "a", "zone": "1"}, "a2": {"pool": "a"}, "b1": {"pool": "b"}}
    base = Cluster(
        mignodes={"a1": mignode("a1", 1), "a2": mignode("a2", 2), "b1": mignode("b1", 3)},
        node_labels=labels,
        policies={"pa": policy("pa", "a"), "pb": policy("pb", "b")},
        claims={
            "ns/c1": claim("c1", "1g.10gb"),
            "ns/c2": claim("c2", "3g.40gb"),
            "ns/c3": claim("c3", "7g.80gb"),
        },
        waiting={
            "ns/c1": (placement(pool="a"),),
            "ns/c2": (placement(pool="a", zone="1"),),
            "ns/c3": (placement(pool="b"),),
        },
        device_classes={DRIVER: DEVICE_CLASS},
        node_facts={name: NodeFacts(values, ()) for name, values in labels.items()},
    )
    return replace(base, **changes)


def requests(cache: ScopeCache, name: str, world: Cluster) -> dict[str, Any]:
    scope = cache.scope(name, world)
    assert scope is not None
    return {r.name: r for r in scope.demand.requests}


def test_claims_fall_under_the_policy_of_the_nodes_their_pods_may_use() -> None:
    cache = ScopeCache()
    a, b = requests(cache, "pa", cluster()), requests(cache, "pb", cluster())
    assert set(a) == {"ns/c1", "ns/c2"}
    assert set(b) == {"ns/c3"}
    assert a["ns/c1"].nodes == {"a1", "a2"}
    assert a["ns/c2"].nodes == {"a1"}  # its pod's zone selector


def test_a_repeated_round_computes_no_claim_again() -> None:
    cache = ScopeCache()
    requests(cache, "pa", cluster())
    requests(cache, "pb", cluster())
    assert cache.computed == 3  # each claim once, for both policies' rounds
    requests(cache, "pa", cluster())
    requests(cache, "pb", cluster())
    assert cache.computed == 3


def test_only_a_changed_claim_is_computed_again() -> None:
    cache = ScopeCache()
    requests(cache, "pa", cluster())
    claims = {**cluster().claims, "ns/c1": claim("c1", "2g.20gb", revision=2)}
    got = requests(cache, "pa", cluster(claims=claims))
    assert cache.computed == 4
    assert got["ns/c1"].profiles[0] == "2g.20gb"


def test_agent_status_updates_keep_every_outcome() -> None:
    cache = ScopeCache()
    requests(cache, "pa", cluster())
    busy = mignode("a1", 10, ("1g.10gb", 0, "Prepared"))
    requests(cache, "pa", cluster(mignodes={**cluster().mignodes, "a1": busy}))
    assert cache.computed == 3


def test_a_policy_change_or_a_label_change_computes_every_claim_again() -> None:
    cache = ScopeCache()
    requests(cache, "pa", cluster())
    policies = {**cluster().policies, "pa": policy("pa", "a", generation=2)}
    requests(cache, "pa", cluster(policies=policies))
    assert cache.computed == 6
    labels = {**cluster().node_labels, "a2": {"pool": "b"}}
    facts = {n: NodeFacts(v, ()) for n, v in labels.items()}
    moved = requests(cache, "pb", cluster(node_labels=labels, node_facts=facts))
    assert cache.computed == 9
    assert moved["ns/c3"].nodes == {"a2", "b1"}


def test_our_own_status_writes_do_not_count_as_a_policy_change() -> None:
    cache = ScopeCache()
    requests(cache, "pa", cluster())
    written = {**policy("pa", "a"), "status": {"pendingRequests": 2}}
    written["metadata"] = {**written["metadata"], "resourceVersion": "99"}
    requests(cache, "pa", cluster(policies={**cluster().policies, "pa": written}))
    assert cache.computed == 3


def test_the_cached_scope_is_the_scope_from_scratch() -> None:
    cache = ScopeCache()
    worlds = [
        cluster(),
        cluster(claims={**cluster().claims, "ns/c2": claim("c2", "2g.20gb", revision=5)}),
        cluster(policies={**cluster().policies, "pb": policy("pb", "a", 2, priority=5)}),
        cluster(waiting={"ns/c1": (placement(pool="a"),)}),
    ]
    for world in worlds:
        for name in ("pa", "pb"):
            assert cache.scope(name, world) == ScopeCache().scope(name, world)


def test_pod_priority_becomes_the_request_priority() -> None:
    waiting = {
        "ns/c1": (placement(pool="a"), placement(priority=1000, pool="a")),
        "ns/c2": (placement(priority=-5, pool="a", zone="1"),),
    }
    got = requests(ScopeCache(), "pa", cluster(waiting=waiting))
    assert got["ns/c1"].priority == 1000  # the most important pod waiting for it
    assert got["ns/c2"].priority == -5


def test_a_request_on_every_node_of_its_policy_names_the_policy_node_set() -> None:
    """The planner sees the policy's own node set (one object), not a copy per claim."""
    cache = ScopeCache()
    waiting = {"ns/c1": (placement(),), "ns/c2": (placement(),)}
    got = requests(cache, "pa", cluster(waiting=waiting))
    assert got["ns/c1"].nodes is got["ns/c2"].nodes


def test_claims_prepared_on_a_node_are_not_pending() -> None:
    node = MigNode(
        metadata={"name": "a1", "resourceVersion": "7"},
        status=MigNodeStatus(
            gpus=[
                gpu(0).model_copy(
                    update={
                        "instances": [
                            MigInstanceStatus(
                                profile="1g.10gb",
                                start=0,
                                uuid="MIG-x",
                                state="Prepared",
                                claims=["ns/c1"],
                            )
                        ]
                    }
                )
            ]
        ),
    ).model_dump(by_alias=True, exclude_none=True, mode="json")
    got = requests(ScopeCache(), "pa", cluster(mignodes={**cluster().mignodes, "a1": node}))
    assert set(got) == {"ns/c2"}

"""Requests restricted to node sets (the operator restricts every one): they stay inside their
set, a set holding every node changes nothing, and the heaps find the node the direct scan of
the set finds, so the plans are the same."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from migpart.mig import CATALOG, Instance, addable_placements
from migpart.planning.greedy import Greedy
from migpart.planning.model import Plan, PolicyView, Request, Snapshot
from migpart.planning.planner import plan
from tests.unit.planning.contract import check_plan
from tests.unit.planning.factories import gpu, req, snap
from tests.unit.planning.strategies import policies, request_lists, snapshots

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MODELS = ["NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA A100-SXM4-80GB"]


def heaps_and_scan(
    snapshot: Snapshot, requests: list[Request], policy: PolicyView
) -> tuple[Plan, Plan]:
    """The greedy (with its repair) planned with the heaps and with the direct scan."""
    return (
        Greedy(snapshot, requests, policy).run(),
        Greedy(snapshot, requests, policy, scan=True).run(),
    )


def everywhere(requests: list[Request], names: list[str]) -> list[Request]:
    """The unrestricted requests restricted to every node, each with its own set object."""
    return [r if r.nodes is not None else replace(r, nodes=frozenset(names)) for r in requests]


def cluster(rng: random.Random, nodes: int, requests: int) -> tuple[Snapshot, list[Request]]:
    """Random nodes of 1 to 4 GPUs, partly cut and used; requests as the operator sends them:
    most restricted to every node (a policy's), some to a labelled half or a few nodes (a
    node selector), a few unrestricted; single, multi-device and same-GPU."""
    gpus = []
    for n in range(nodes):
        model = rng.choice(MODELS)
        table = CATALOG[model]
        for g in range(rng.randint(1, 4)):
            layout: list[Instance] = []
            while rng.random() < 0.6:
                options = [i for i in addable_placements(table, layout) if "+" not in i.profile]
                if not options:
                    break
                layout.append(rng.choice(options))
            instances = [(i.profile, i.start, rng.random() < 0.5) for i in layout]
            gpus.append(gpu(f"n{n}", g, *instances, model=model))
    snapshot = snap(*gpus)
    names = [n.name for n in snapshot.nodes]
    labelled = [name for name in names if rng.random() < 0.5]
    profiles = sorted({p.name for m in MODELS for p in CATALOG[m].profiles if "+" not in p.name})
    reqs = []
    for i in range(requests):
        count = rng.choice([1, 1, 1, 1, 2, 3, 4])
        kind = rng.random()
        if kind < 0.6:
            nodes: frozenset[str] | None = frozenset(names)
        elif kind < 0.8:
            nodes = frozenset(labelled)
        elif kind < 0.9:
            nodes = frozenset(rng.sample(names, rng.randint(1, 5)))
        else:
            nodes = None
        reqs.append(
            req(
                f"r{i}",
                *rng.sample(profiles, rng.randint(1, 3)),
                count=count,
                priority=rng.choice([0, 0, 1]),
                nodes=nodes,
                same_gpu=count > 1 and rng.random() < 0.3,
            )
        )
    return snapshot, reqs


@SETTINGS
@given(data=st.data())
def test_heaps_give_the_plan_the_scan_gives(data: st.DataObject) -> None:
    snapshot = data.draw(snapshots(max_nodes=8))
    names = tuple(n.name for n in snapshot.nodes)
    requests = data.draw(request_lists(names, restricted_one_in=2, most=20))
    policy = data.draw(policies())
    heaps, scan = heaps_and_scan(snapshot, requests, policy)
    assert heaps == scan
    check_plan(snapshot, requests, policy, heaps)


@SETTINGS
@given(data=st.data())
def test_a_set_of_every_node_is_no_restriction(data: st.DataObject) -> None:
    snapshot = data.draw(snapshots())
    names = [n.name for n in snapshot.nodes]
    requests = data.draw(request_lists(tuple(names), restricted_one_in=2))
    policy = data.draw(policies())
    unrestricted = plan(snapshot, requests, policy)
    assert plan(snapshot, everywhere(requests, names), policy) == unrestricted
    # names the snapshot does not hold change nothing either
    beyond = everywhere(requests, [*names, "elsewhere"])
    assert plan(snapshot, beyond, policy) == unrestricted


@pytest.mark.parametrize("seed", range(4))
def test_large_clusters_heaps_and_scan_agree(seed: int) -> None:
    """Clusters beyond the exact search, where the greedy alone decides."""
    snapshot, requests = cluster(random.Random(seed), 120, 300)
    policy = PolicyView()
    heaps, scan = heaps_and_scan(snapshot, requests, policy)
    assert heaps == scan
    result = plan(snapshot, requests, policy)
    assert result == heaps  # 120 nodes x 300 requests: plan() is this greedy
    check_plan(snapshot, requests, policy, result)
    assert result.assignments, "the instance places something"


@pytest.mark.parametrize("seed", range(2))
def test_large_clusters_every_node_or_none_same_plan(seed: int) -> None:
    snapshot, requests = cluster(random.Random(100 + seed), 120, 300)
    names = [n.name for n in snapshot.nodes]
    unrestricted = [r if r.nodes is None or len(r.nodes) < len(names) else replace(r, nodes=None)
                    for r in requests]  # fmt: skip
    result = plan(snapshot, requests)
    assert plan(snapshot, unrestricted) == result
    assert plan(snapshot, everywhere(unrestricted, names)) == result


@pytest.mark.parametrize("seed", range(2))
def test_deterministic_with_fresh_but_equal_sets(seed: int) -> None:
    """The operator builds a new set per claim: equal sets in new objects plan the same."""
    snapshot, requests = cluster(random.Random(200 + seed), 80, 200)
    fresh = [
        r if r.nodes is None else replace(r, nodes=frozenset(sorted(r.nodes))) for r in requests
    ]
    first = plan(snapshot, requests)
    assert plan(snapshot, fresh) == first
    assert plan(snapshot, requests) == first


def test_set_deep_in_the_heap_still_gets_its_cheapest_node() -> None:
    """Sixty nodes outside the set offer a free 1g.10gb (the cheapest device there is); the
    set's forty nodes must create one. The heap walk passes over the sixty, gives up, and the
    set's own heap answers: every request lands in the set, best fit first, as the scan."""
    outside = [gpu(f"out{n}", 0, ("1g.10gb", 0, False)) for n in range(60)]
    inside = [gpu(f"in{n}", 0, ("3g.40gb", 0, True)) for n in range(40)]
    snapshot = snap(*outside, *inside)
    the_set = frozenset(f"in{n}" for n in range(40))
    requests = [req(f"r{k}", "1g.10gb", nodes=the_set) for k in range(50)]
    requests.append(req("free", "1g.10gb"))
    greedy = Greedy(snapshot, requests, PolicyView())
    result = greedy.run()
    check_plan(snapshot, requests, PolicyView(), result)
    assert {a.request for a in result.assignments} == {r.name for r in requests}
    assert {a.node for a in result.assignments if a.request != "free"} <= the_set
    assert next(a.node for a in result.assignments if a.request == "free").startswith("out")
    assert any(nodes is not None for *_, nodes in greedy.index.shape_heaps), (
        "the set's heap answered"
    )
    assert result == Greedy(snapshot, requests, PolicyView(), scan=True).run()


def test_sets_outside_the_snapshot() -> None:
    """Names the snapshot does not hold are ignored; a set of none of its nodes fits nowhere."""
    snapshot = snap(gpu("a", 0, ("7g.80gb", 0, True)), gpu("b", 0))
    requests = [
        req("nowhere", "1g.10gb", nodes=frozenset({"z"})),
        req("empty", "1g.10gb", nodes=frozenset()),
        req("a-or-z", "1g.10gb", nodes=frozenset({"a", "z"})),
        req("b-or-z", "1g.10gb", count=2, nodes=frozenset({"b", "z"})),
        req("same-b-or-z", "1g.10gb", count=2, nodes=frozenset({"b", "z"}), same_gpu=True),
    ]
    result = plan(snapshot, requests)
    check_plan(snapshot, requests, PolicyView(), result)
    assert set(result.unsatisfied) == {"nowhere", "empty", "a-or-z"}
    assert {a.node for a in result.assignments} == {"b"}

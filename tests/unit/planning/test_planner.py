"""Table-driven tests of the planner's objective: reuse, no destruction, priorities, policy."""

from __future__ import annotations

import gc
from dataclasses import dataclass

import pytest

from migpart.mig import Instance
from migpart.planning.model import (
    PolicyView,
    Request,
    Snapshot,
    Spare,
)
from migpart.planning.planner import plan
from tests.unit.planning.contract import check_plan
from tests.unit.planning.factories import A30, A100, H200, gpu, req, snap


@dataclass
class Case:
    name: str
    snapshot: Snapshot
    requests: list[Request]
    satisfied: set[str]
    destroyed: int
    created: int
    policy: PolicyView = PolicyView()  # noqa: RUF009 - frozen dataclass, safe default
    gpus_changed: int | None = None


CASES = [
    Case("empty cluster, no requests", snap(gpu("a", 0)), [], set(), 0, 0, gpus_changed=0),
    Case(
        "reuses a free instance before creating",
        snap(gpu("a", 0, ("1g.10gb", 0, False)), gpu("a", 1)),
        [req("r", "1g.10gb")],
        {"r"},
        0,
        0,
        gpus_changed=0,
    ),
    Case(
        "never hands out a used instance",
        snap(gpu("a", 0, ("7g.80gb", 0, True))),
        [req("r", "7g.80gb")],
        set(),
        0,
        0,
    ),
    Case(
        "creates in free space without destroying",
        snap(gpu("a", 0, ("3g.40gb", 0, True), ("1g.10gb", 4, False))),
        [req("r", "2g.20gb", "1g.20gb")],
        {"r"},
        0,
        1,
    ),
    Case(
        "destroys a free instance only when it must",
        snap(gpu("a", 0, ("3g.40gb", 0, True), ("1g.10gb", 4, False))),
        [req("r", "3g.40gb")],
        {"r"},
        1,
        1,
    ),
    Case(
        "prefers the GPU already being changed",
        snap(gpu("a", 0), gpu("a", 1)),
        [req("r1", "1g.10gb"), req("r2", "1g.10gb")],
        {"r1", "r2"},
        0,
        2,
        gpus_changed=1,
    ),
    Case(
        "multi-device request stays on one node",
        snap(gpu("a", 0, ("7g.80gb", 0, True)), gpu("b", 0), gpu("b", 1)),
        [req("r", "7g.80gb", count=2)],
        {"r"},
        0,
        2,
    ),
    Case(
        "multi-device request that no single node can hold",
        snap(gpu("a", 0), gpu("b", 0)),
        [req("r", "7g.80gb", count=2)],
        set(),
        0,
        0,
    ),
    Case(
        "higher priority wins over any number of lower",
        snap(gpu("a", 0)),
        [req(f"small{i}", "1g.10gb") for i in range(7)] + [req("big", "7g.80gb", priority=1)],
        {"big"},
        0,
        1,
    ),
    Case(
        "alternatives across models",
        snap(gpu("a", 0, model=H200)),
        [req("r", "3g.40gb", "3g.71gb")],
        {"r"},
        0,
        1,
    ),
    Case(
        "a denied profile is never created",
        snap(gpu("a", 0)),
        [req("r", "1g.10gb")],
        set(),
        0,
        0,
        PolicyView(denied=frozenset({"1g.10gb"})),
    ),
    Case(
        "an existing free instance of a denied profile may still be assigned",
        snap(gpu("a", 0, ("1g.10gb", 0, False))),
        [req("r", "1g.10gb")],
        {"r"},
        0,
        0,
        PolicyView(denied=frozenset({"1g.10gb"})),
    ),
    Case(
        "only allowed profiles are created",
        snap(gpu("a", 0)),
        [req("r", "1g.10gb", "2g.20gb")],
        {"r"},
        0,
        1,
        PolicyView(allowed=frozenset({"2g.20gb"})),
    ),
    Case(
        "node restriction",
        snap(gpu("a", 0), gpu("b", 0)),
        [req("r", "1g.10gb", nodes=frozenset({"b"}))],
        {"r"},
        0,
        1,
    ),
    Case(
        "spares are created in free space",
        snap(gpu("a", 0, ("3g.40gb", 0, True))),
        [],
        set(),
        0,
        2,
        PolicyView(spares=(Spare("1g.10gb", 2),)),
    ),
    Case(
        "existing free instances count as spares",
        snap(gpu("a", 0, ("1g.10gb", 0, False), ("1g.10gb", 1, False))),
        [],
        set(),
        0,
        0,
        PolicyView(spares=(Spare("1g.10gb", 2),)),
    ),
    Case(
        "spares never destroy",
        snap(gpu("a", 0, ("7g.80gb", 0, False))),
        [],
        set(),
        0,
        0,
        PolicyView(spares=(Spare("1g.10gb", 1),)),
    ),
    Case(
        # Greedy puts the high-priority small request on the A30 (its preferred profile) and
        # then the three 2g.12gb no longer fit anywhere; packed exactly, the small ones take
        # the A100 and every request is served.
        "small requests give way to a request only one node can serve",
        snap(
            gpu("a30", 0, ("1g.6gb", 0, True), ("1g.6gb", 1, True), model=A30),
            gpu("a30", 1, model=A30),
            gpu("a100", 0, model=A100),
        ),
        [
            req("big", "2g.12gb", count=3),
            req("small-high", "1g.6gb", "1g.10gb", priority=1),
            req("small", "1g.6gb", "1g.10gb"),
        ],
        {"big", "small-high", "small"},
        0,
        5,
    ),
    Case(
        # Greedy gives the 1g.18gb the empty GPU first and then must destroy the free
        # 1g.35gb for the third 3g.71gb; the exact packing puts the 1g.18gb beside it.
        "a free instance survives when the devices are packed around it",
        snap(gpu("n", 0, model=H200), gpu("n", 1, ("1g.35gb", 6, False), model=H200)),
        [req("one", "1g.18gb", priority=1), req("three", "3g.71gb", count=3)],
        {"one", "three"},
        0,
        4,
    ),
    Case(
        "same-GPU devices go to the one GPU that can hold them all",
        snap(gpu("a", 0, ("4g.40gb", 0, True), ("2g.20gb", 4, True)), gpu("a", 1)),
        [req("r", "1g.10gb", count=2, same_gpu=True)],
        {"r"},
        0,
        2,
        gpus_changed=1,
    ),
    Case(
        "same-GPU request that fits the node but no single GPU",
        snap(gpu("a", 0, ("4g.40gb", 0, True)), gpu("a", 1, ("4g.40gb", 0, True))),
        [req("r", "1g.10gb", count=4, same_gpu=True)],
        set(),
        0,
        0,
    ),
    Case(
        "the same request without same-GPU spreads over the GPUs",
        snap(gpu("a", 0, ("4g.40gb", 0, True)), gpu("a", 1, ("4g.40gb", 0, True))),
        [req("r", "1g.10gb", count=4)],
        {"r"},
        0,
        4,
    ),
    Case(
        "zero-count request is unsatisfied, not an error",
        snap(gpu("a", 0)),
        [req("r", "1g.10gb", count=0)],
        set(),
        0,
        0,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_planner_cases(case: Case) -> None:
    result = plan(case.snapshot, case.requests, case.policy)
    check_plan(case.snapshot, case.requests, case.policy, result)
    assert {a.request for a in result.assignments} == case.satisfied
    assert result.stats.destroyed == case.destroyed
    assert result.stats.created == case.created
    if case.gpus_changed is not None:
        assert result.stats.gpus_changed == case.gpus_changed


def test_best_fit_keeps_a_whole_gpu_free() -> None:
    """Small requests go beside the used instance, leaving the empty GPU whole for a 7g."""
    snapshot = snap(gpu("a", 0), gpu("a", 1, ("3g.40gb", 0, True)))
    result = plan(snapshot, [req("small", "1g.10gb"), req("big", "7g.80gb")])
    assert {a.request for a in result.assignments} == {"small", "big"}
    small = next(a for a in result.assignments if a.request == "small")
    assert small.devices[0].gpu == 1


def test_devices_in_preference_order_on_ties() -> None:
    result = plan(snap(gpu("a", 0)), [req("r", "2g.20gb", "1g.20gb")])
    assert result.assignments[0].devices[0].profile == "2g.20gb"


def test_free_instance_at_target_is_kept() -> None:
    snapshot = snap(gpu("a", 0, ("1g.10gb", 6, False)))
    result = plan(snapshot, [req("r", "3g.40gb")])
    assert Instance("1g.10gb", 6) in result.gpus[0].instances
    assert result.stats.destroyed == 0


def test_every_gpu_listed_even_untouched() -> None:
    snapshot = snap(gpu("a", 0), gpu("a", 1), gpu("b", 3, ("1g.10gb", 0, True)))
    result = plan(snapshot, [])
    assert [(g.node, g.index) for g in result.gpus] == [("a", 0), ("a", 1), ("b", 3)]
    assert result.gpus[2].instances == (Instance("1g.10gb", 0),)


def test_large_cluster_uses_equivalence_classes() -> None:
    """Many identical nodes: everything that fits is placed (no wall-clock assertion)."""
    gpus = [gpu(f"n{n}", g) for n in range(200) for g in range(8)]
    requests = [req(f"r{i}", "1g.10gb", "1g.18gb") for i in range(400)]
    requests += [req(f"m{i}", "3g.40gb", count=2) for i in range(100)]
    result = plan(snap(*gpus), requests)
    assert not result.unsatisfied
    check_plan(snap(*gpus), requests, PolicyView(), result)


def test_same_gpu_on_a_cluster_too_big_for_the_search() -> None:
    """The greedy alone (no exact search beyond 64 GPUs) honours same-GPU requests too."""
    gpus = [
        gpu(f"n{n}", g, ("4g.40gb", 0, True), ("2g.20gb", 4, True))
        for n in range(9)
        for g in range(7)
    ]
    gpus += [gpu(f"n{n}", 7, ("4g.40gb", 0, True)) for n in range(9)]
    requests = [req(f"r{i}", "1g.10gb", count=3, same_gpu=True) for i in range(10)]
    result = plan(snap(*gpus), requests)
    check_plan(snap(*gpus), requests, PolicyView(), result)
    assert len(result.assignments) == 9  # one per node: only GPU 7 has three free slices
    for a in result.assignments:
        assert {d.gpu for d in a.devices} == {7}


def test_planning_makes_no_reference_cycles() -> None:
    """`plan()` pauses the cyclic garbage collector while it runs, which is free only while
    planning makes no reference cycles: its objects must all go when it returns."""
    gpus = [gpu(f"n{n}", g, ("3g.40gb", 0, g % 2 == 0)) for n in range(10) for g in range(8)]
    large = [req(f"r{i}", "1g.10gb", "2g.20gb", count=1 + i % 3) for i in range(40)]
    small = [req(f"s{i}", "1g.10gb", "3g.40gb", count=2, same_gpu=i % 2 == 0) for i in range(6)]
    problems = [(snap(*gpus), large), (snap(*gpus[:8]), small)]  # the greedy, and the search
    for snapshot, requests in problems:
        plan(snapshot, requests, PolicyView(spares=(Spare("1g.10gb", 2),)))
    gc.collect()
    gc.disable()
    try:
        for snapshot, requests in problems:
            plan(snapshot, requests, PolicyView(spares=(Spare("1g.10gb", 2),)))
        assert gc.collect() == 0
    finally:
        gc.enable()
    assert gc.isenabled()

"""The objective over time: ageing, withdrawing freed instances, spares from the mix."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from migpart.planning.model import GpuState, InstanceState, NodeState, Request, Snapshot, Spare
from migpart.planning.overtime import (
    AGE_LEVELS,
    Hold,
    age_level,
    aged,
    held_node,
    kept_off,
    spares_from_mix,
    withdraw_on_release,
)

H100 = "NVIDIA H100 80GB HBM3"


def test_age_levels_double_and_stop_at_the_top() -> None:
    assert [age_level(w, 100) for w in (0, 99, 100, 299, 300, 699, 700)] == [0, 0, 1, 1, 2, 2, 3]
    assert age_level(1e12, 100) == AGE_LEVELS - 1
    assert age_level(1e12, 0) == 0


def test_ageing_never_lifts_a_request_above_a_higher_priority() -> None:
    old_low = Request("old", ("1g.10gb",), priority=0)
    new_high = Request("new", ("1g.10gb",), priority=1)
    young_low = Request("young", ("1g.10gb",), priority=0)
    out = {r.name: r.priority for r in aged([old_low, new_high, young_low],
                                           {"old": 1e9, "new": 0, "young": 0}, 60)}  # fmt: skip
    assert out["new"] > out["old"] > out["young"]


def test_a_freed_instance_is_withdrawn_only_for_a_request_that_waited_much_longer() -> None:
    small = Request("small", ("3g.40gb",))
    whole = Request("whole", ("7g.80gb",))
    assert withdraw_on_release(["7g.80gb"], [(small, 5000), (whole, 100)], 1200)
    assert not withdraw_on_release(["7g.80gb"], [(small, 1000), (whole, 100)], 1200)
    assert not withdraw_on_release(["7g.80gb"], [(small, 5000), (whole, 4000)], 1200)
    # Nobody could take it now: it stays, and the next round may repartition it.
    assert not withdraw_on_release(["7g.80gb"], [(small, 5000)], 1200)
    # A multi-device request cannot take one freed device, so it does not count as served.
    eight = Request("eight", ("7g.80gb",), count=8)
    assert withdraw_on_release(["7g.80gb"], [(small, 5000), (eight, 100)], 1200) is False


def test_spares_follow_the_recent_mix() -> None:
    recent = [Request(f"r{i}", ("1g.10gb",)) for i in range(6)]
    recent += [Request(f"s{i}", ("3g.40gb",)) for i in range(3)]
    recent += [Request("multi", ("7g.80gb",), count=8)]
    assert spares_from_mix(recent, 3) == (Spare("1g.10gb", 2), Spare("3g.40gb", 1))
    assert spares_from_mix([], 3) == ()
    assert spares_from_mix(recent, 0) == ()


def _node(
    name: str, used: Sequence[tuple[str, int]], free: Sequence[tuple[str, int]] = ()
) -> NodeState:
    """A node of two H100s: `used` and `free` instances (profile, start) on GPU 0."""
    instances = tuple(
        [InstanceState(p, s, used=True) for p, s in used] + [InstanceState(p, s) for p, s in free]
    )
    return NodeState(name, (GpuState(name, 0, H100, instances), GpuState(name, 1, H100)))


def test_the_emptiest_node_is_held_for_the_oldest_multi_gpu_request() -> None:
    snapshot = Snapshot(
        (
            _node("a", [("1g.10gb", 0)]),
            _node("b", [], [("3g.40gb", 4)]),  # free instances do not count
            _node("c", []),
            _node("d", [("3g.40gb", 4)]),
        )
    )
    young = Request("young", ("7g.80gb",), count=2, priority=1)
    old = Request("old", ("7g.80gb",), count=2, priority=3)
    small = Request("small", ("1g.10gb",), priority=2)
    hold = held_node(snapshot, [young, small, old], max_used=0.5)
    # b and c are both empty: the last of them, since new instances go to the first nodes
    assert hold == Hold("c", old)
    out = {r.name: r for r in kept_off([young, small, old], hold, ["a", "b", "c", "d"])}
    assert out["small"].nodes == frozenset({"a", "b", "d"})
    assert out["young"].nodes == frozenset({"a", "b", "d"})
    assert out["old"].nodes is None
    # a request that outranks the held one keeps every node, and so does one that could go
    # nowhere else
    urgent = Request("urgent", ("1g.10gb",), priority=4)
    only_c = Request("only-c", ("1g.10gb",), nodes=frozenset({"c"}))
    kept = kept_off([urgent, only_c], hold, ["a", "b", "c", "d"])
    assert [r.nodes for r in kept] == [None, frozenset({"c"})]


def test_no_node_is_held_when_every_candidate_is_too_busy_or_nobody_needs_one() -> None:
    busy = Snapshot((_node("a", [("4g.40gb", 0)]), _node("b", [("7g.80gb", 0)])))
    multi = Request("multi", ("7g.80gb",), count=2)
    # a: 4 of 14 compute slices in use, b: 7 of 14
    assert held_node(busy, [multi], max_used=0.25) is None
    assert held_node(busy, [multi], max_used=0.3) == Hold("a", multi)
    assert held_node(busy, [Request("one", ("7g.80gb",))], max_used=1.0) is None
    # a node with fewer GPUs than the request needs, or outside its nodes, is never held
    assert held_node(busy, [replace(multi, count=3)], max_used=1.0) is None
    assert held_node(busy, [replace(multi, nodes=frozenset({"b"}))], max_used=1.0) == Hold(
        "b", replace(multi, nodes=frozenset({"b"}))
    )


def test_a_node_is_held_only_behind_pods_younger_than_the_wait_and_the_patience() -> None:
    snapshot = Snapshot((_node("a", [("1g.10gb", 0)]), _node("b", [("3g.40gb", 4)])))
    multi = Request("multi", ("7g.80gb",), count=2)
    running = {"a": 5000.0, "b": 100.0}
    # a is emptier, but its pod has run longer than the request has waited: b is held
    assert held_node(snapshot, [multi], 1.0, running, {"multi": 1000}) == Hold("b", multi)
    # b's pod has run longer than the request has waited: nothing is held
    assert held_node(snapshot, [multi], 1.0, running, {"multi": 50}) is None
    # the patience bounds the wait that counts
    assert held_node(snapshot, [multi], 1.0, running, {"multi": 1e9}, patience_s=6000) == Hold(
        "a", multi
    )
    assert held_node(snapshot, [multi], 1.0, running, {"multi": 1e9}, patience_s=60) is None

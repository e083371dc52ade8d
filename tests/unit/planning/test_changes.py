"""Which GPUs and nodes a plan changes, and which changed nodes reconfigure now (the operator's
rounds and the simulator both decide with these)."""

from __future__ import annotations

from migpart.mig import Instance
from migpart.planning.changes import changed_nodes, choose_nodes, layout_changes
from migpart.planning.model import (
    Assignment,
    GpuPlan,
    GpuState,
    InstanceState,
    NodeState,
    Plan,
    PlanStats,
    Snapshot,
)

H100 = "NVIDIA H100 80GB HBM3"


def plan(*gpus: GpuPlan, served: tuple[str, ...] = ()) -> Plan:
    assignments = tuple(Assignment(f"ns/c{k}", node, ()) for k, node in enumerate(served))
    return Plan(gpus=gpus, assignments=assignments, unsatisfied=(), stats=PlanStats())


def test_changed_nodes_are_those_whose_layout_the_plan_changes() -> None:
    snapshot = Snapshot(
        nodes=(
            NodeState("a", (GpuState("a", 0, H100, (InstanceState("1g.10gb", 0),)),)),
            NodeState("b", (GpuState("b", 0, H100),)),
            NodeState("c", (GpuState("c", 0, H100),)),
        )
    )
    same = GpuPlan("a", 0, (Instance("1g.10gb", 0),))
    new = GpuPlan("b", 0, (Instance("7g.80gb", 0),))
    empty = GpuPlan("c", 0, ())
    changes = layout_changes(snapshot, plan(same, new, empty))
    assert changes == {("b", 0): (frozenset(), frozenset({(0, "7g.80gb")}))}
    assert changed_nodes(changes) == ["b"]


def test_choose_nodes_skips_nodes_still_reconfiguring_and_respects_the_limit() -> None:
    assert choose_nodes(["busy", "x", "y", "z"], {"busy"}, plan(), 3) == ["x", "y"]
    assert choose_nodes(["x", "y"], set(), plan(), 1) == ["x"]
    assert choose_nodes(["x"], {"a", "b"}, plan(), 2) == []


def test_nodes_serving_more_requests_go_first_ties_in_the_given_order() -> None:
    served = plan(served=("z", "z", "x"))
    assert choose_nodes(["y", "x", "z"], set(), served, 2) == ["z", "x"]
    assert choose_nodes(["node-2", "node-10"], set(), plan(), 1) == ["node-2"]

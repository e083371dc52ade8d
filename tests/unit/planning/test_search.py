"""The local search over exactly packed nodes, driven directly (the planner hides it)."""

from __future__ import annotations

from migpart.planning.classes import GpuClasses
from migpart.planning.greedy import Greedy
from migpart.planning.model import PolicyView
from migpart.planning.packer import Packer
from migpart.planning.search import NodeSearch
from tests.unit.planning.contract import check_plan
from tests.unit.planning.factories import gpu, req, snap


def test_gives_up_one_request_for_two() -> None:
    """From a plan that serves the 7g alone, only trading it for both 3g serves more."""
    snapshot = snap(gpu("a", 0))
    requests = [req("whole", "7g.80gb"), req("half-1", "3g.40gb"), req("half-2", "3g.40gb")]
    policy = PolicyView()
    packer = Packer(snapshot, requests, policy)
    solution = NodeSearch(packer).run([0, 1, 2], 100_000, seed={0: 0})
    assert solution.members == ((1, 2),)
    result = Greedy(snapshot, requests, policy, GpuClasses(policy)).adopt(solution, packer)
    check_plan(snapshot, requests, policy, result)
    assert {a.request for a in result.assignments} == {"half-1", "half-2"}


def test_moves_several_requests_to_make_room() -> None:
    """Three 1g requests sit on the A30's free instances; the 2g.12gb x3 needs that node, so
    all three move to the A100 at once (no single move does it)."""
    snapshot = snap(
        gpu("a30", 0, ("1g.6gb", 0, True), ("1g.6gb", 1, True), ("1g.6gb", 2, False),
            ("1g.6gb", 3, False), model="NVIDIA A30"),
        gpu("a30", 1, ("1g.6gb", 0, False), ("1g.6gb", 1, False), model="NVIDIA A30"),
        gpu("a100", 0, model="NVIDIA A100-SXM4-80GB"),
    )  # fmt: skip
    small = [req(f"small-{k}", "1g.6gb", "1g.10gb") for k in range(3)]
    requests = [*small, req("big", "2g.12gb", count=3)]
    policy = PolicyView()
    packer = Packer(snapshot, requests, policy)
    solution = NodeSearch(packer).run([0, 1, 2, 3], 100_000, seed={0: 0, 1: 0, 2: 0})
    assert solution.key[0] == (-4,)
    result = Greedy(snapshot, requests, policy, GpuClasses(policy)).adopt(solution, packer)
    check_plan(snapshot, requests, policy, result)
    assert {a.request: a.node for a in result.assignments} == {
        "small-0": "a100",
        "small-1": "a100",
        "small-2": "a100",
        "big": "a30",
    }


def test_an_exhausted_allowance_still_gives_a_correct_plan() -> None:
    snapshot = snap(gpu("a", 0), gpu("a", 1), gpu("b", 0, ("3g.40gb", 0, True)))
    requests = [req(f"r{k}", "1g.10gb", "2g.20gb", count=2) for k in range(5)]
    policy = PolicyView()
    for steps in (0, 50, 500, 5_000):
        packer = Packer(snapshot, requests, policy)
        solution = NodeSearch(packer).run(list(range(5)), steps)
        result = Greedy(snapshot, requests, policy, GpuClasses(policy)).adopt(solution, packer)
        check_plan(snapshot, requests, policy, result)
        assert len(result.assignments) == -sum(solution.key[0])

"""diff(current, desired): destroys before creates on every GPU, and it round-trips."""

from __future__ import annotations

import pytest

from migpart.mig import Instance
from migpart.planning.diff import Op, apply_ops, current_layouts, diff, gpu_diff
from migpart.planning.model import GpuPlan, GpuState, InstanceState, NodeState, Snapshot

A, B = Instance("1g.10gb", 0), Instance("3g.40gb", 0)
C = Instance("1g.10gb", 4)


@pytest.mark.parametrize(
    ("current", "desired", "expected"),
    [
        ((), (), []),
        ((A,), (A,), []),
        ((), (A,), [Op("create", 0, "1g.10gb", 0, "n")]),
        ((A,), (), [Op("destroy", 0, "1g.10gb", 0, "n")]),
        (
            (A, C),
            (B, C),
            [Op("destroy", 0, "1g.10gb", 0, "n"), Op("create", 0, "3g.40gb", 0, "n")],
        ),
    ],
)
def test_gpu_diff(
    current: tuple[Instance, ...], desired: tuple[Instance, ...], expected: list[Op]
) -> None:
    assert gpu_diff(current, desired, 0, "n") == expected


def test_diff_groups_by_gpu_destroys_first() -> None:
    current = [GpuPlan("n", 1, (A,)), GpuPlan("n", 0, (C,))]
    desired = [GpuPlan("n", 0, (B,)), GpuPlan("n", 1, (B,))]
    ops = diff(current, desired)
    assert ops == [
        Op("destroy", 0, "1g.10gb", 4, "n"),
        Op("create", 0, "3g.40gb", 0, "n"),
        Op("destroy", 1, "1g.10gb", 0, "n"),
        Op("create", 1, "3g.40gb", 0, "n"),
    ]
    assert apply_ops(current, ops) == (GpuPlan("n", 0, (B,)), GpuPlan("n", 1, (B,)))


def test_gpu_missing_on_one_side_counts_as_empty() -> None:
    assert diff([], [GpuPlan("n", 0, (A,))]) == [Op("create", 0, "1g.10gb", 0, "n")]
    assert diff([GpuPlan("n", 0, (A,))], []) == [Op("destroy", 0, "1g.10gb", 0, "n")]


def test_apply_rejects_impossible_ops() -> None:
    with pytest.raises(ValueError, match="absent"):
        apply_ops([GpuPlan("n", 0, ())], [Op("destroy", 0, "1g.10gb", 0, "n")])
    with pytest.raises(ValueError, match="present"):
        apply_ops([GpuPlan("n", 0, (A,))], [Op("create", 0, "1g.10gb", 0, "n")])


def test_current_layouts_of_snapshot() -> None:
    snapshot = Snapshot(
        (
            NodeState(
                "n",
                (GpuState("n", 2, "NVIDIA H100 80GB HBM3", (InstanceState("1g.10gb", 4, True),)),),
            ),
        )
    )
    assert current_layouts(snapshot) == (GpuPlan("n", 2, (C,)),)
    assert Op("create", 0, "1g.10gb", 4).instance == C

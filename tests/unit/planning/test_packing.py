"""The exact node packer against brute force over every combination of reachable layouts."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from migpart.mig import CATALOG, Instance, enumerate_layouts, layout_problems
from migpart.planning.cost import CREATED, cost_of
from migpart.planning.model import PolicyView
from migpart.planning.packing import DeviceDemand, NodePacking, OutOfWork, Work, pack
from migpart.planning.targets import GpuSpace
from tests.unit.planning.strategies import layouts

A30 = "NVIDIA A30"
H100 = "NVIDIA H100 80GB HBM3"
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def space(model: str, *instances: tuple[str, int, bool]) -> GpuSpace:
    return GpuSpace(
        CATALOG[model],
        frozenset(Instance(p, s) for p, s, used in instances if used),
        frozenset(Instance(p, s) for p, s, used in instances if not used),
    )


def lead(destroyed: int, changed: int, created: int) -> int:
    """The (destroyed, GPUs changed, created) fields of a cost, as the packer compares them
    (`cost >> CREATED`: rank and capacity lost only break ties)."""
    return cost_of(destroyed, changed, created, 0, 0) >> CREATED


def top(found: NodePacking | None) -> int | None:
    """`lead` of a packing's cost."""
    return None if found is None else found.cost >> CREATED


def serves(
    supplies: list[dict[str, int]], demands: list[DeviceDemand], k: int = 0, gpu: int | None = None
) -> bool:
    """Whether the per-GPU device counts serve every demand (plain backtracking)."""
    if k == len(demands):
        return True
    demand = demands[k]
    slots = [
        (g, p)
        for g, supply in enumerate(supplies)
        for p in demand.profiles
        if supply.get(p, 0) and (gpu is None or g == gpu)
    ]
    if demand.same_gpu and demand.count > 1 and gpu is None:
        return any(serves(supplies, demands, k, g) for g in range(len(supplies)))
    for picks in itertools.combinations_with_replacement(slots, demand.count):
        if all(supplies[g][p] >= picks.count((g, p)) for g, p in set(picks)):
            for g, p in picks:
                supplies[g][p] -= 1
            ok = serves(supplies, demands, k + 1)
            for g, p in picks:
                supplies[g][p] += 1
            if ok:
                return True
    return False


def brute_force(
    spaces: list[GpuSpace], demands: list[DeviceDemand], policy: PolicyView
) -> tuple[int, int, int] | None:
    """The least (destroyed, GPUs changed, created) over every combination of layouts."""
    per_gpu = []
    for s in spaces:
        options = []
        for layout in enumerate_layouts(s.table, s.used):
            created = layout - s.used - s.free
            if not all(policy.permits(i.profile) for i in created):
                continue
            supply: dict[str, int] = {}
            for inst in layout - s.used:
                supply[inst.profile] = supply.get(inst.profile, 0) + 1
            cost = (len(s.free - layout), int(layout != s.used | s.free), len(created))
            options.append((cost, supply))
        per_gpu.append(options)
    best: tuple[int, int, int] | None = None
    for combo in itertools.product(*per_gpu):
        cost = (
            sum(c[0][0] for c in combo),
            sum(c[0][1] for c in combo),
            sum(c[0][2] for c in combo),
        )
        if best is not None and cost >= best:
            continue
        if serves([dict(supply) for _, supply in combo], demands):
            best = cost
    return best


def check_packing(
    spaces: list[GpuSpace], demands: list[DeviceDemand], policy: PolicyView, found: NodePacking
) -> None:
    assert len(found.layouts) == len(spaces)
    for s, layout in zip(spaces, found.layouts, strict=True):
        assert not layout_problems(s.table, sorted(layout))
        assert s.used <= layout
        assert all(policy.permits(i.profile) for i in layout - s.used - s.free)
    seen: set[tuple[int, Instance]] = set()
    for demand, devices in zip(demands, found.devices, strict=True):
        assert len(devices) == demand.count
        if demand.same_gpu:
            assert len({g for g, _ in devices}) <= 1
        for g, inst in devices:
            assert inst.profile in demand.profiles
            assert inst in found.layouts[g]
            assert inst not in spaces[g].used
            assert (g, inst) not in seen
            seen.add((g, inst))


@st.composite
def node_problems(draw: st.DrawFn) -> tuple[list[GpuSpace], list[DeviceDemand], PolicyView]:
    model = draw(st.sampled_from([A30, H100]))
    table = CATALOG[model]
    count = draw(st.integers(1, 2)) if model == A30 else 1
    spaces = []
    for _ in range(count):
        states = draw(layouts(model))
        spaces.append(
            GpuSpace(
                table,
                frozenset(i.geometry for i in states if i.used),
                frozenset(i.geometry for i in states if not i.used),
            )
        )
    names = [p.name for p in table.profiles]
    demands = [
        DeviceDemand(
            tuple(draw(st.lists(st.sampled_from(names), min_size=1, max_size=2, unique=True))),
            draw(st.integers(1, 3)),
            draw(st.booleans()),
        )
        for _ in range(draw(st.integers(1, 3)))
    ]
    denied = frozenset(draw(st.lists(st.sampled_from(names), max_size=2)))
    return spaces, demands, PolicyView(denied=denied)


@SETTINGS
@given(problem=node_problems())
def test_pack_matches_brute_force(
    problem: tuple[list[GpuSpace], list[DeviceDemand], PolicyView],
) -> None:
    spaces, demands, policy = problem
    found = pack(spaces, demands, policy)
    best = brute_force(spaces, demands, policy)
    assert top(found) == (None if best is None else lead(*best))
    if found is not None:
        check_packing(spaces, demands, policy, found)


def test_reuses_free_instances_and_destroys_nothing() -> None:
    spaces = [space(H100, ("3g.40gb", 0, True), ("1g.10gb", 4, False), ("1g.10gb", 5, False))]
    found = pack(spaces, [DeviceDemand(("1g.10gb",), 2)], PolicyView())
    assert top(found) == lead(0, 0, 0)


def test_destroys_the_least() -> None:
    """A 3g.40gb needs memory 4-7: destroy one of the free 1g instances there, not both."""
    spaces = [space(H100, ("3g.40gb", 0, True), ("1g.10gb", 4, False), ("1g.20gb", 6, False))]
    found = pack(spaces, [DeviceDemand(("3g.40gb",), 1)], PolicyView())
    assert top(found) == lead(2, 1, 1)
    spaces = [space(H100, ("3g.40gb", 0, True), ("1g.10gb", 4, False)), space(H100)]
    found = pack(spaces, [DeviceDemand(("3g.40gb",), 1)], PolicyView())
    assert top(found) == lead(0, 1, 1)
    assert found is not None
    assert found.devices[0][0][0] == 1


def test_prefers_the_first_profile_on_ties() -> None:
    found = pack([space(H100)], [DeviceDemand(("2g.20gb", "1g.20gb"), 1)], PolicyView())
    assert found is not None
    assert found.devices[0][0][1].profile == "2g.20gb"


def test_infeasible_and_denied() -> None:
    assert pack([space(H100)], [DeviceDemand(("7g.80gb",), 2)], PolicyView()) is None
    denied = PolicyView(denied=frozenset({"1g.10gb"}))
    assert pack([space(H100)], [DeviceDemand(("1g.10gb",), 1)], denied) is None
    reuse = [space(H100, ("1g.10gb", 0, False))]
    assert top(pack(reuse, [DeviceDemand(("1g.10gb",), 1)], denied)) == lead(0, 0, 0)


def test_same_gpu_demands_share_one_gpu_each() -> None:
    spaces = [space(H100, ("4g.40gb", 0, True)), space(H100, ("4g.40gb", 0, True))]
    assert pack(spaces, [DeviceDemand(("1g.10gb",), 4, same_gpu=True)], PolicyView()) is None
    found = pack(
        spaces,
        [
            DeviceDemand(("1g.10gb",), 3, same_gpu=True),
            DeviceDemand(("1g.10gb",), 3, same_gpu=True),
        ],
        PolicyView(),
    )
    assert found is not None
    assert [{g for g, _ in devices} for devices in found.devices] in ([{0}, {1}], [{1}, {0}])


def test_a_limit_below_the_cost_finds_nothing() -> None:
    spaces = [space(H100)]
    demands = [DeviceDemand(("3g.40gb",), 2)]
    found = pack(spaces, demands, PolicyView())
    assert found is not None
    assert pack(spaces, demands, PolicyView(), limit=found.cost - 1) is None
    assert pack(spaces, demands, PolicyView(), limit=found.cost) == found


def test_work_allowance_runs_out() -> None:
    spaces = [space(H100)] * 4
    demands = [
        DeviceDemand(("1g.10gb",), 5),
        DeviceDemand(("2g.20gb",), 3),
        DeviceDemand(("3g.40gb",), 2),
    ]
    work = Work(10)
    with pytest.raises(OutOfWork):
        pack(spaces, demands, PolicyView(), work=work)
    assert work.left == 0
    assert pack(spaces, demands, PolicyView(), work=Work(10**9)) is not None

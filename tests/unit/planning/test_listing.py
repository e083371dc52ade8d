"""The order an offering node lists its placements in: migpart's and NVIDIA's name order."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from migpart.mig import CATALOG
from migpart.planning.listing import NodeGpus, name_order, planner_order
from migpart.planning.model import DeviceRef, PolicyView
from tests.unit.planning.strategies import MODELS, policies

H100 = CATALOG["NVIDIA H100 80GB HBM3"]
EVERY = PolicyView()
Order = Callable[[NodeGpus, PolicyView], tuple[DeviceRef, ...]]
ORDERS: list[Order] = [planner_order, name_order]


@st.composite
def nodes(draw: st.DrawFn) -> NodeGpus:
    """A node's GPUs: distinct indices (gaps where a GPU is left out), mixed models."""
    indices = draw(st.lists(st.integers(0, 11), min_size=0, max_size=6, unique=True))
    return {i: CATALOG[draw(st.sampled_from(MODELS))] for i in indices}


def of_profile(listed: Sequence[DeviceRef], profile: str) -> list[tuple[int, int]]:
    return [(d.gpu, d.start) for d in listed if d.profile == profile]


@settings(max_examples=200, deadline=None)
@given(nodes(), policies(), st.sampled_from(ORDERS))
def test_every_allowed_placement_is_listed_once_and_nothing_else(
    gpus: NodeGpus, policy: PolicyView, order: Order
) -> None:
    listed = order(gpus, policy)
    expected = {
        DeviceRef(index, prof.name, start)
        for index, table in gpus.items()
        for prof in table.profiles
        if policy.permits(prof.name)
        for start in prof.placements
    }
    assert len(listed) == len(set(listed))
    assert set(listed) == expected


@settings(max_examples=100, deadline=None)
@given(nodes(), policies(), st.sampled_from(ORDERS))
def test_the_order_depends_on_the_gpus_and_the_policy_only(
    gpus: NodeGpus, policy: PolicyView, order: Order
) -> None:
    shuffled = dict(reversed(list(gpus.items())))
    assert order(gpus, policy) == order(shuffled, policy) == order(dict(gpus), policy)


@settings(max_examples=100, deadline=None)
@given(nodes(), policies(), st.sampled_from(ORDERS))
def test_the_profiles_are_taken_in_turn(gpus: NodeGpus, policy: PolicyView, order: Order) -> None:
    """A profile's k-th placement is listed within the first k rounds of one placement per
    profile: kube-scheduler walks past few other profiles' devices to reach it."""
    listed = order(gpus, policy)
    profiles = list(dict.fromkeys(d.profile for d in listed))
    seen: dict[str, int] = {}
    for position, ref in enumerate(listed):
        rank = seen.get(ref.profile, 0)
        seen[ref.profile] = rank + 1
        assert position < (rank + 1) * len(profiles)


def test_an_h100_node_lists_every_profile_within_its_first_rounds() -> None:
    listed = planner_order({i: H100 for i in range(8)}, EVERY)
    profiles = {d.profile for d in listed}
    assert {d.profile for d in listed[: len(profiles)]} == profiles
    assert len(listed) == 8 * sum(len(p.placements) for p in H100.profiles)


def test_name_order_is_gpu_by_gpu_starts_ascending() -> None:
    listed = name_order({0: H100, 1: H100}, EVERY)
    assert of_profile(listed, "3g.40gb") == [(0, 0), (0, 4), (1, 0), (1, 4)]
    assert of_profile(listed, "7g.80gb") == [(0, 0), (1, 0)]


def test_planner_order_packs_small_profiles_low_and_whole_gpus_high() -> None:
    listed = planner_order({0: H100, 1: H100, 2: H100}, EVERY)
    assert of_profile(listed, "1g.10gb")[:8] == [(0, s) for s in range(7)] + [(1, 0)]
    assert of_profile(listed, "3g.40gb") == [(0, 0), (0, 4), (1, 0), (1, 4), (2, 0), (2, 4)]
    assert of_profile(listed, "4g.40gb") == [(0, 0), (1, 0), (2, 0)]
    assert of_profile(listed, "7g.80gb") == [(2, 0), (1, 0), (0, 0)]


def test_a_denied_profile_is_not_listed() -> None:
    policy = PolicyView(allowed=frozenset({"3g.40gb", "7g.80gb"}), denied=frozenset({"7g.80gb"}))
    assert {d.profile for d in planner_order({0: H100}, policy)} == {"3g.40gb"}

"""The simulator's offer policy on small hand-made workloads: first fit in listing order,
warm reuse, free instances in the way destroyed at prepare, instances kept after."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from migpart.mig import CATALOG, Instance, layout_problems
from migpart.planning.listing import NodeGpus, name_order, planner_order
from migpart.planning.model import DeviceRef, PolicyView
from migpart.sim.cluster import Device, SimCluster
from migpart.sim.engine import Engine, Outcome, Policy
from migpart.sim.offer import Offer, Order
from migpart.sim.policies import FirstFit
from migpart.sim.run import SimConfig, make_policy
from migpart.sim.workload import SimPod, make_pod

H100 = CATALOG["NVIDIA H100 80GB HBM3"]


def pod(name: str, at: float, duration: float, *profiles: str, count: int = 1) -> SimPod:
    return make_pod(H100, name, at, duration, tuple(profiles), count)


class CheckedEngine(Engine):
    """Checks after every creation that the GPU's layout is valid (the scheduler never gave
    two devices whose memory slices overlap), and that every instance destroyed is ready and
    held by no pod; records when each was destroyed and where each pod was bound."""

    def __init__(self, cluster: SimCluster, pods: Sequence[SimPod], policy: Policy) -> None:
        super().__init__(cluster, pods, policy)
        self.destroyed: list[tuple[float, Instance]] = []
        self.given: dict[str, list[Device]] = {}

    def create(
        self, node: int, index: int, inst: Instance, ready_s: float, holder: str | None = None
    ) -> None:
        super().create(node, index, inst, ready_s, holder)
        layout = list(self.cluster.gpus[node][index].instances)
        assert not layout_problems(H100, layout), layout

    def destroy(self, node: int, index: int, inst: Instance) -> None:
        state = self.cluster.gpus[node][index].instances[inst]
        assert state.holder is None, f"{inst} destroyed while {state.holder} holds it"
        assert state.ready, f"{inst} destroyed while being created"
        self.destroyed.append((self.now, inst))
        super().destroy(node, index, inst)

    def bind(self, pod: SimPod, devices: Sequence[Device]) -> None:
        self.given[pod.name] = list(devices)
        super().bind(pod, devices)


def run(
    pods: Sequence[SimPod], policy: Policy, nodes: int = 1, gpus: int = 1
) -> tuple[CheckedEngine, Outcome]:
    engine = CheckedEngine(SimCluster(H100, nodes, gpus), pods, policy)
    return engine, engine.run()


def outcome(pods: Sequence[SimPod], policy: Policy, nodes: int = 1, gpus: int = 1) -> Outcome:
    return run(pods, policy, nodes, gpus)[1]


def test_a_new_placement_waits_the_creation_and_the_next_pod_reuses_the_instance() -> None:
    pods = [pod("a", 0, 100, "3g.40gb"), pod("b", 200, 10, "3g.40gb")]
    engine, out = run(pods, Offer(actuation_s=5))
    assert out.waits_s == [5, 0]  # b is allocated the placement a left, its instance there
    assert (out.creates, out.destroys) == (1, 0)
    assert engine.given["a"] == engine.given["b"] == [(0, 0, Instance("3g.40gb", 0))]
    # the instance stays after b, free, for the next claim of its placement
    (state,) = engine.cluster.gpus[0][0].instances.values()
    assert (state.instance, state.holder, state.ready) == (Instance("3g.40gb", 0), None, True)


def test_placements_are_given_in_listing_order() -> None:
    def backwards(gpus: NodeGpus, policy: PolicyView) -> tuple[DeviceRef, ...]:
        return tuple(reversed(name_order(gpus, policy)))

    pods = [pod("a", 0, 100, "1g.10gb"), pod("b", 0, 100, "1g.10gb")]
    engine, _ = run(pods, Offer(actuation_s=5, order=backwards), gpus=2)
    assert engine.given == {
        "a": [(0, 1, Instance("1g.10gb", 6))],
        "b": [(0, 1, Instance("1g.10gb", 5))],
    }
    engine, _ = run(pods, Offer(actuation_s=5, order=name_order), gpus=2)
    assert engine.given["a"] == [(0, 0, Instance("1g.10gb", 0))]


def test_the_planner_order_puts_whole_gpus_at_the_far_end() -> None:
    pods = [pod("a", 0, 100, "2g.20gb"), pod("b", 0, 100, "7g.80gb")]
    engine, _ = run(pods, Offer(actuation_s=5), gpus=3)
    assert engine.given == {
        "a": [(0, 0, Instance("2g.20gb", 0))],
        "b": [(0, 2, Instance("7g.80gb", 0))],
    }


def test_a_whole_gpu_left_free_at_the_far_end_waits_for_the_next_whole_gpu_pod() -> None:
    # a (7g) and b (3g) run; a leaves at 15; c (3g) comes at 20, d (7g) at 30. In name order
    # a had GPU 0, so c's first fit is there (a's free 7g destroyed) and d waits for b or c
    # to leave; in the planner's order a had GPU 1, c goes beside b and d reuses a's 7g.
    pods = [
        pod("a", 0, 10, "7g.80gb"),
        pod("b", 0, 100, "3g.40gb"),
        pod("c", 20, 100, "3g.40gb"),
        pod("d", 30, 10, "7g.80gb"),
    ]
    planned = outcome(pods, Offer(actuation_s=5), gpus=2)
    assert planned.waits_s == [5, 5, 5, 0]
    assert (planned.creates, planned.destroys) == (3, 0)
    named = outcome(pods, Offer(actuation_s=5, order=name_order), gpus=2)
    assert named.waits_s[3] == 105 - 30 + 5  # b leaves at 105, its 3g destroyed for d
    assert (named.creates, named.destroys) == (4, 2)


def test_a_free_instance_in_the_way_is_destroyed_at_prepare() -> None:
    # a's 1g (at 0) stays free from 15; it takes no counter, so at 20 b is allocated the 7g over it,
    # and prepare destroys the 1g, then creates the 7g: one actuation, as first-fit's.
    pods = [pod("a", 0, 10, "1g.10gb"), pod("b", 20, 10, "7g.80gb")]
    engine, out = run(pods, Offer(actuation_s=5))
    assert out.waits_s == [5, 5]
    assert engine.destroyed == [(20, Instance("1g.10gb", 0))]
    assert (out.creates, out.destroys) == (2, 1)


def test_an_instance_in_use_is_never_given_nor_destroyed() -> None:
    # One GPU: a's 4g at 0, b's 3g at 4 beside it; c's 4g fits only where a runs, so c waits
    # for a to leave at 105 and is given the instance a left.
    pods = [pod("a", 0, 100, "4g.40gb"), pod("b", 0, 100, "3g.40gb"), pod("c", 0, 100, "4g.40gb")]
    out = outcome(pods, Offer(actuation_s=5))
    assert out.waits_s == [5, 5, 105]
    assert (out.creates, out.destroys) == (2, 0)


def test_a_multi_gpu_pod_gets_its_gpus_on_one_node_one_creation_after_another() -> None:
    pods = [pod("a", 0, 10, "7g.80gb", count=2)]
    out = outcome(pods, Offer(actuation_s=5), nodes=2, gpus=2)
    assert out.waits_s == [10]
    assert out.creates == 2


def test_a_profile_the_policy_does_not_allow_is_never_given() -> None:
    policy = PolicyView(allowed=frozenset({"3g.40gb"}))
    pods = [pod("a", 0, 10, "1g.10gb"), pod("b", 0, 10, "1g.10gb", "3g.40gb")]
    out = outcome(pods, Offer(actuation_s=5, policy=policy))
    assert out.served == 1
    assert out.waits_s[1] == 5


@pytest.mark.parametrize(
    ("name", "order"), [("offer", planner_order), ("offer-name-order", name_order)]
)
def test_the_offer_policies_by_name(name: str, order: Order) -> None:
    policy, _ = make_policy(SimConfig(H100, nodes=1), name, [])
    assert isinstance(policy, Offer)
    assert (policy.name, policy.order) == (name, order)


class DestroyingOffer(Offer):
    """NVIDIA's design: `offer` in name order, the instance destroyed when its pod leaves."""

    def released(self, engine: Engine, pod: SimPod, devices: Sequence[Device]) -> None:
        super().released(engine, pod, devices)
        for device in devices:
            engine.destroy(*device)


def _pods(rows: list[tuple[int, int, str, int]]) -> list[SimPod]:
    """Pods p0, p1, ... from (arrival, duration, profile, count) rows."""
    return [pod(f"p{k}", at, d, profile, count=n) for k, (at, d, profile, n) in enumerate(rows)]


workloads = st.lists(
    st.tuples(
        st.integers(0, 50),
        st.integers(1, 60),
        st.sampled_from(["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
        st.integers(1, 2),
    ),
    min_size=1,
    max_size=25,
).map(_pods)


@settings(max_examples=60, deadline=None)
@given(workloads)
def test_every_pod_is_served_on_valid_layouts_destroying_free_instances_only(
    pods: list[SimPod],
) -> None:
    for order in (planner_order, name_order):
        out = outcome(pods, Offer(actuation_s=5, order=order), nodes=2, gpus=2)
        assert out.served == len(pods)
        assert all(w >= 0 for w in out.waits_s)
        assert out.destroys <= out.creates


@settings(max_examples=60, deadline=None)
@given(workloads)
def test_name_order_destroying_on_release_is_first_fit(pods: list[SimPod]) -> None:
    # The model is the scheduler's first fit over NVIDIA's listing: with NVIDIA's destroy on
    # release it gives what `first-fit` gives, pod for pod.
    nvidia = outcome(pods, DestroyingOffer(actuation_s=5, order=name_order), nodes=2, gpus=2)
    first_fit = outcome(pods, FirstFit(actuation_s=5), nodes=2, gpus=2)
    assert nvidia.waits_s == first_fit.waits_s
    assert (nvidia.creates, nvidia.destroys) == (first_fit.creates, first_fit.destroys)

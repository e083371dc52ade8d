"""The simulator's offer policy on small hand-made workloads."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from migpart.mig import CATALOG, Instance, layout_problems
from migpart.planning.model import PolicyView, Spare
from migpart.sim.cluster import SimCluster
from migpart.sim.engine import Engine, Policy
from migpart.sim.offer import Offer
from migpart.sim.run import SimConfig, make_policy
from migpart.sim.workload import SimPod, make_pod

H100 = CATALOG["NVIDIA H100 80GB HBM3"]


def pod(name: str, at: float, duration: float, *profiles: str, count: int = 1) -> SimPod:
    return make_pod(H100, name, at, duration, tuple(profiles), count)


class CheckedEngine(Engine):
    """Checks after every creation that the GPU's layout is valid (the scheduler never gave
    two devices whose memory slices overlap), and that every instance destroyed is ready and
    held by no pod; records when each was destroyed."""

    def __init__(self, cluster: SimCluster, pods: Sequence[SimPod], policy: Policy) -> None:
        super().__init__(cluster, pods, policy)
        self.destroyed: list[tuple[float, Instance]] = []

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


def test_a_new_placement_waits_the_creation_and_a_free_instance_none() -> None:
    pods = [pod("a", 0, 100, "3g.40gb"), pod("b", 200, 10, "3g.40gb")]
    out = CheckedEngine(SimCluster(H100, 1, 1), pods, Offer(actuation_s=5)).run()
    assert out.waits_s == [5, 0]  # b takes the instance a left
    assert (out.creates, out.destroys) == (1, 0)


def test_free_instances_are_reused_before_anything_is_created() -> None:
    pods = [pod("a", 0, 10, "1g.10gb"), pod("b", 0, 10, "3g.40gb"), pod("c", 50, 10, "1g.10gb")]
    out = CheckedEngine(SimCluster(H100, 2, 2), pods, Offer(actuation_s=7)).run()
    assert out.waits_s == [7, 7, 0]
    assert out.creates == 2


def test_overlapping_placements_are_never_both_given() -> None:
    # One GPU: the 4g (start 0 only) and the 3g at 0 overlap; the 3g goes to 4, beside it.
    pods = [pod("a", 0, 100, "4g.40gb"), pod("b", 0, 100, "3g.40gb"), pod("c", 0, 100, "4g.40gb")]
    out = CheckedEngine(SimCluster(H100, 1, 1), pods, Offer(actuation_s=5)).run()
    assert out.waits_s == [5, 5, 105]  # c takes the 4g that a frees at 105
    assert out.creates == 2


def test_a_pod_that_needs_a_free_instance_displaced_waits_for_a_round() -> None:
    # a's 1g is free from 15; at 20 b's 7g would displace it: not offered, so b is
    # unschedulable; a round a batch window later destroys the free 1g and creates the 7g.
    pods = [pod("a", 0, 10, "1g.10gb"), pod("b", 20, 10, "7g.80gb")]
    policy = Offer(actuation_s=5, batch_window_s=2)
    engine = CheckedEngine(SimCluster(H100, 1, 1), pods, policy)
    out = engine.run()
    assert out.waits_s == [5, 2 + 5]
    assert engine.destroyed == [(22, Instance("1g.10gb", 6))]  # free then, held by no pod
    assert (out.creates, out.destroys, policy.rounds) == (2, 1, 1)


def test_the_optimistic_variant_displaces_free_instances_at_once() -> None:
    pods = [pod("a", 0, 10, "1g.10gb"), pod("b", 20, 10, "7g.80gb")]
    engine = CheckedEngine(
        SimCluster(H100, 1, 1), pods, Offer(actuation_s=5, displace_at_once=True)
    )
    out = engine.run()
    assert out.waits_s == [5, 5]  # the 7g over the free 1g is offered and taken at 20
    assert engine.destroyed == [(20, Instance("1g.10gb", 6))]
    assert (out.creates, out.destroys) == (2, 1)
    waiting_only = Offer(
        actuation_s=5, batch_window_s=2, displace_at_once=True, displace_waiting_only=True
    )
    out = CheckedEngine(SimCluster(H100, 1, 1), pods, waiting_only).run()
    assert out.waits_s == [5, 7]  # offered over the 1g once b has waited a batch window
    assert (out.creates, out.destroys) == (2, 1)


def test_pods_the_offer_holds_need_no_round() -> None:
    pods = [pod("a", 0, 100, "3g.40gb"), pod("b", 0, 100, "4g.40gb"), pod("c", 200, 10, "3g.40gb")]
    policy = Offer(actuation_s=5)
    out = CheckedEngine(SimCluster(H100, 1, 1), pods, policy).run()
    assert out.waits_s == [5, 5, 0]
    assert policy.rounds == 0


def test_a_pod_past_the_offer_depth_is_served_by_the_next_node_or_a_round() -> None:
    # Three 1g pods at once, two nodes of one GPU: node 1 offers two 1g placements (the
    # depth), so the third goes to node 2; with depth 1 each node offers one, and the third
    # pod waits for a round (as in a cluster, until the operator offers the next one).
    pods = [pod(n, 0, 100, "1g.10gb") for n in "abc"]
    deep = Offer(actuation_s=5, depth=2)
    out = CheckedEngine(SimCluster(H100, 2, 1), pods, deep).run()
    assert out.waits_s == [5, 5, 5]
    assert deep.rounds == 0
    shallow = Offer(actuation_s=5, batch_window_s=2, depth=1)
    out = CheckedEngine(SimCluster(H100, 2, 1), pods, shallow).run()
    assert out.waits_s[:2] == [5, 5]
    assert out.waits_s[2] > 5
    assert shallow.rounds >= 1


def test_an_unschedulable_pod_waits_for_a_round_that_can_serve_it() -> None:
    # At 20 the GPU holds a free 3g (a's) and b's 4g; c (7g) needs the free 3g displaced and
    # b running to end: unschedulable. d (3g, at 21) takes the free 3g from the offer, so the
    # rounds at 22 and 73 (d left) find nothing to do for c; the one after b left serves it.
    pods = [
        pod("a", 0, 10, "3g.40gb"),
        pod("b", 0, 100, "4g.40gb"),
        pod("c", 20, 10, "7g.80gb"),
        pod("d", 21, 50, "3g.40gb"),
    ]
    policy = Offer(actuation_s=5, batch_window_s=2)
    engine = CheckedEngine(SimCluster(H100, 1, 1), pods, policy)
    out = engine.run()
    assert out.waits_s[3] == 0
    assert out.waits_s[2] == 105 - 20 + 2 + 5  # b leaves at 105, a round at 107, 5 s more
    assert out.destroys == 2  # the free 3g and 4g, once b and d have left


@pytest.mark.parametrize(("name", "at_once"), [("offer", False), ("offer-optimistic", True)])
def test_the_offer_policies_by_name(name: str, at_once: bool) -> None:
    config = SimConfig(H100, nodes=1, max_concurrent_nodes=3)
    policy, _ = make_policy(config, name, [])
    assert isinstance(policy, Offer)
    assert (policy.name, policy.displace_at_once) == (name, at_once)


def test_a_multi_gpu_pod_gets_its_gpus_on_one_node_one_creation_after_another() -> None:
    pods = [pod("a", 0, 10, "7g.80gb", count=2)]
    out = CheckedEngine(SimCluster(H100, 2, 2), pods, Offer(actuation_s=5)).run()
    assert out.waits_s == [10]
    assert out.creates == 2


workloads = st.lists(
    st.tuples(
        st.integers(0, 50),
        st.integers(1, 60),
        st.sampled_from(["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
        st.integers(1, 2),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(workloads, st.booleans())
def test_every_pod_is_served_on_valid_layouts_destroying_free_instances_only(
    rows: list[tuple[int, int, str, int]], at_once: bool
) -> None:
    pods = [pod(f"p{k}", at, d, profile, count=n) for k, (at, d, profile, n) in enumerate(rows)]
    policy = Offer(actuation_s=5, displace_at_once=at_once, max_concurrent_nodes=2)
    out = CheckedEngine(SimCluster(H100, 2, 2), pods, policy).run()
    assert out.served == len(pods)
    assert all(w >= 0 for w in out.waits_s)


def test_a_node_held_for_a_multi_gpu_pod_offers_nothing_else_until_it_drains() -> None:
    pods = [
        pod("a", 0, 100, "3g.40gb"),
        pod("m", 1, 50, "7g.80gb", count=2),
        pod("s", 10, 200, "1g.10gb"),
    ]
    held = Offer(actuation_s=5, hold_used=0.5, displace_at_once=True)
    out = CheckedEngine(SimCluster(H100, 1, 2), pods, held).run()
    # a leaves at 105; m gets both GPUs whole (a's free 3g displaced), s waits for m.
    assert out.waits_s[1] == 105 + 10 - 1
    assert out.waits_s[2] > out.waits_s[1]
    out = CheckedEngine(
        SimCluster(H100, 1, 2), pods, Offer(actuation_s=5, displace_at_once=True)
    ).run()
    assert out.waits_s[2] == 5  # without the hold, s takes the second GPU and m waits for it
    assert out.waits_s[1] > 200
    # The operator's offer holds the node too, but s, unschedulable, goes to the round, which
    # plans it on the held node since it fits nowhere else (`planning.overtime.kept_off`):
    # m waits for s to leave at 217, then a round (2 s) and two creations.
    out = CheckedEngine(SimCluster(H100, 1, 2), pods, Offer(actuation_s=5, hold_used=0.5)).run()
    assert out.waits_s == [5, 217 + 2 + 10 - 1, 2 + 5]


def test_a_spare_is_offered_but_never_displaced() -> None:
    # a's 3g stays free after it leaves. The optimistic model displaces it for b's 7g at once;
    # kept as the policy's spare (as the operator's offer keeps it) it is not displaced.
    pods = [pod("a", 0, 10, "3g.40gb"), pod("b", 20, 10, "7g.80gb"), pod("c", 40, 10, "3g.40gb")]
    free = Offer(actuation_s=5, displace_at_once=True)
    out = CheckedEngine(SimCluster(H100, 1, 1), pods, free).run()
    assert out.waits_s[1] == 5
    kept = PolicyView(spares=(Spare("3g.40gb", 1),))
    spare = Offer(policy=kept, actuation_s=5, displace_at_once=True)
    out = CheckedEngine(SimCluster(H100, 1, 1), pods, spare).run()
    assert out.waits_s[2] == 0  # c takes the spare
    assert not out.destroys

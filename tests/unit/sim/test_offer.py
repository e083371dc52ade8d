"""The simulator's offer policy on small hand-made workloads."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from migpart.mig import CATALOG, Instance, layout_problems
from migpart.sim.cluster import SimCluster
from migpart.sim.engine import Engine
from migpart.sim.offer import Offer
from migpart.sim.workload import SimPod, make_pod

H100 = CATALOG["NVIDIA H100 80GB HBM3"]


def pod(name: str, at: float, duration: float, *profiles: str, count: int = 1) -> SimPod:
    return make_pod(H100, name, at, duration, tuple(profiles), count)


class CheckedEngine(Engine):
    """Checks after every creation that the GPU's layout is valid: the scheduler never gave
    two devices whose memory slices overlap."""

    def create(
        self, node: int, index: int, inst: Instance, ready_s: float, holder: str | None = None
    ) -> None:
        super().create(node, index, inst, ready_s, holder)
        layout = list(self.cluster.gpus[node][index].instances)
        assert not layout_problems(H100, layout), layout


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


def test_free_instances_are_displaced_at_once_or_for_a_pod_that_waited_a_batch_window() -> None:
    pods = [pod("a", 0, 10, "1g.10gb"), pod("b", 20, 10, "7g.80gb")]
    on_demand = Offer(actuation_s=5, batch_window_s=2, displace_waiting_only=True)
    out = CheckedEngine(SimCluster(H100, 1, 1), pods, on_demand).run()
    assert out.waits_s == [5, 7]  # the operator sees b wait, then offers the 7g over the 1g
    assert (out.creates, out.destroys) == (2, 1)
    out = CheckedEngine(SimCluster(H100, 1, 1), pods, Offer(actuation_s=5)).run()
    assert out.waits_s == [5, 5]  # by default the 7g over the free 1g is offered at once
    assert (out.creates, out.destroys) == (2, 1)


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
@given(workloads)
def test_every_pod_is_served_on_valid_layouts(rows: list[tuple[int, int, str, int]]) -> None:
    pods = [pod(f"p{k}", at, d, profile, count=n) for k, (at, d, profile, n) in enumerate(rows)]
    out = CheckedEngine(SimCluster(H100, 2, 2), pods, Offer(actuation_s=5)).run()
    assert out.served == len(pods)
    assert all(w >= 0 for w in out.waits_s)


def test_a_node_held_for_a_multi_gpu_pod_offers_nothing_else_until_it_drains() -> None:
    pods = [
        pod("a", 0, 100, "3g.40gb"),
        pod("m", 1, 50, "7g.80gb", count=2),
        pod("s", 10, 200, "1g.10gb"),
    ]
    held = Offer(actuation_s=5, hold_used=0.5)
    out = CheckedEngine(SimCluster(H100, 1, 2), pods, held).run()
    # a leaves at 105; m gets both GPUs whole (a's free 3g displaced), s waits for m.
    assert out.waits_s[1] == 105 + 10 - 1
    assert out.waits_s[2] > out.waits_s[1]
    out = CheckedEngine(SimCluster(H100, 1, 2), pods, Offer(actuation_s=5)).run()
    assert out.waits_s[2] == 5  # without the hold, s takes the second GPU and m waits for it
    assert out.waits_s[1] > 200

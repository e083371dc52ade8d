"""The event loop and the policies on small hand-made workloads."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from migpart.mig import CATALOG, Instance
from migpart.planning.model import PolicyView, Spare
from migpart.sim.cluster import Device, SimCluster
from migpart.sim.engine import Engine
from migpart.sim.layouts import balanced, uniform, whole
from migpart.sim.migpart import Migpart, MigpartSettings
from migpart.sim.policies import FirstFit, Static, whole_gpu_pods
from migpart.sim.workload import SimPod, make_pod

H100 = CATALOG["NVIDIA H100 80GB HBM3"]


def pod(name: str, at: float, duration: float, *profiles: str, count: int = 1) -> SimPod:
    return make_pod(H100, name, at, duration, tuple(profiles), count)


def test_a_static_layout_serves_what_it_has_and_a_pod_waits_for_a_release() -> None:
    pods = [pod("a", 0, 100, "3g.40gb"), pod("b", 1, 50, "3g.40gb"), pod("c", 2, 10, "3g.40gb")]
    # One GPU of all-balanced holds one 3g.40gb: b waits for a, c for b.
    out = Engine(
        SimCluster(H100, 1, 1), pods, Static("bal", uniform(H100, balanced(H100), 1))
    ).run()
    assert out.served == 3
    assert out.waits_s == [0, 99, 148]
    assert out.creates == out.destroys == 0


def test_a_profile_a_layout_lacks_is_never_served_and_waits_until_the_end() -> None:
    pods = [pod("a", 0, 100, "7g.80gb"), pod("b", 10, 5, "1g.10gb")]
    out = Engine(
        SimCluster(H100, 1, 1), pods, Static("bal", uniform(H100, balanced(H100), 1))
    ).run()
    assert out.served == 1
    assert out.waits_s[0] == pytest.approx(15 - 0)  # the run ends when b leaves at 15


def test_mig_off_gives_each_pod_whole_gpus() -> None:
    pods = whole_gpu_pods(H100, [pod("a", 0, 100, "1g.10gb"), pod("b", 0, 100, "1g.10gb")])
    out = Engine(SimCluster(H100, 1, 1), pods, Static("off", uniform(H100, whole(H100), 1))).run()
    assert out.waits_s == [0, 100]


def test_first_fit_creates_on_demand_waits_the_creation_and_destroys_on_release() -> None:
    pods = [pod("a", 0, 100, "3g.40gb"), pod("b", 0, 100, "3g.40gb"), pod("c", 0, 10, "7g.80gb")]
    out = Engine(SimCluster(H100, 1, 2), pods, FirstFit(actuation_s=5)).run()
    assert out.waits_s[:2] == [5, 5]  # both on GPU 0, at 0 and 4
    assert out.waits_s[2] == 5  # the 7g on GPU 1
    assert out.creates == out.destroys == 3


def test_first_fit_packs_the_first_gpu_and_node() -> None:
    cluster = SimCluster(H100, 2, 2)
    pods = [pod("a", 0, 100, "1g.10gb"), pod("b", 1, 100, "1g.10gb")]
    engine = Engine(cluster, pods, FirstFit(actuation_s=5))
    engine.run()
    # Both went to node-1 GPU 0, at the first placements.
    assert cluster.gpus[0][0].instances == {}  # destroyed on release


def test_migpart_repartitions_after_the_window_and_the_actuation() -> None:
    # A free all-balanced GPU; a 7g pod needs the free instances destroyed and a 7g created.
    policy = Migpart(actuation_s=5, settings=MigpartSettings(batch_window_s=2))
    cluster = SimCluster(H100, 1, 1)
    for inst in uniform(H100, balanced(H100), 1)[0]:
        cluster.add(0, 0, inst, ready=True, holder=None)
    out = Engine(cluster, [pod("a", 0, 100, "7g.80gb")], policy).run()
    assert out.waits_s == [2 + 5]
    assert out.destroys == 4
    assert out.creates == 1
    assert policy.rounds == 1


def test_migpart_never_destroys_an_instance_in_use() -> None:
    # a holds the 3g at 0 for long; b asks the whole GPU, which only destroying a frees.
    pods = [pod("a", 0, 1000, "3g.40gb"), pod("b", 1, 10, "7g.80gb"), pod("c", 2, 10, "1g.10gb")]
    policy = Migpart(actuation_s=5, settings=MigpartSettings(batch_window_s=2))
    cluster = SimCluster(H100, 1, 1)
    for inst in uniform(H100, balanced(H100), 1)[0]:
        cluster.add(0, 0, inst, ready=True, holder=None)
    engine = Engine(cluster, pods, policy)
    out = engine.run()
    a, b, c = out.waits_s
    assert a == 0
    assert b == pytest.approx(1000 - 1 + 2 + 5)  # only after a left
    assert c == 0  # a free 1g.10gb of the layout
    # While a ran, its instance stayed: every destroy happened after a left or on free ones.
    assert out.served == 3


def test_migpart_keeps_spares_free_for_arrivals() -> None:
    policy = Migpart(policy=PolicyView(spares=(Spare("1g.10gb", 2),)), actuation_s=5)
    cluster = SimCluster(H100, 1, 1)
    pods = [pod("a", 100, 10, "1g.10gb"), pod("b", 200, 10, "1g.10gb")]
    out = Engine(cluster, pods, policy).run()
    assert out.waits_s == [0, 0]
    assert {i.profile for i in cluster.gpus[0][0].instances} == {"1g.10gb"}


def test_max_concurrent_nodes_holds_back_the_second_node() -> None:
    pods = [pod("a", 0, 100, "7g.80gb", count=1), pod("b", 0, 100, "7g.80gb", count=1)]
    # One GPU per node: each pod needs its own node reconfigured.
    one = Engine(
        SimCluster(H100, 2, 1),
        pods,
        Migpart(actuation_s=5, settings=MigpartSettings(max_concurrent_nodes=1)),
    )
    two = Engine(
        SimCluster(H100, 2, 1),
        pods,
        Migpart(actuation_s=5, settings=MigpartSettings(max_concurrent_nodes=2)),
    )
    assert sorted(one.run().waits_s) == [7, 14]
    assert sorted(two.run().waits_s) == [7, 7]


def test_the_cluster_refuses_to_destroy_a_held_instance() -> None:
    cluster = SimCluster(H100, 1, 1)
    inst = Instance("7g.80gb", 0)
    cluster.add(0, 0, inst, ready=True, holder="a")
    with pytest.raises(AssertionError, match="held by a"):
        cluster.remove(0, 0, inst)


def test_ageing_stops_a_stream_of_whole_gpu_pods_from_overtaking_a_small_one() -> None:
    pods = [pod("w0", 0, 100, "7g.80gb"), pod("small", 1, 10, "3g.40gb")]
    pods += [pod(f"w{k}", 60 + k, 100, "7g.80gb") for k in range(1, 8)]

    def small_wait(age_s: float | None) -> float:
        cluster = SimCluster(H100, 1, 1)
        cluster.add(0, 0, Instance("7g.80gb", 0), ready=True, holder=None)
        out = Engine(
            cluster, pods, Migpart(actuation_s=5, settings=MigpartSettings(age_s=age_s))
        ).run()
        return out.waits_s[1]

    assert small_wait(None) > 700  # behind every whole-GPU pod
    assert small_wait(50) == pytest.approx(100 - 1 + 2 + 5)  # withdrawn, window, actuation


def test_first_fit_destroys_only_the_departing_pods_instance() -> None:
    # Two 3g pods share GPU 0; the first leaves while the second runs.
    pods = [pod("a", 0, 10, "3g.40gb"), pod("b", 0, 100, "3g.40gb")]
    cluster = SimCluster(H100, 1, 1)
    seen: list[set[Instance]] = []

    class Watching(FirstFit):
        def released(self, engine: Engine, pod: SimPod, devices: Sequence[Device]) -> None:
            super().released(engine, pod, devices)
            seen.append(set(cluster.gpus[0][0].instances))

    Engine(cluster, pods, Watching(actuation_s=5)).run()
    assert seen[0] == {Instance("3g.40gb", 4)}  # b's instance stayed while b ran


def test_withdrawing_keeps_the_instances_in_use_beside_the_freed_one() -> None:
    # small waits long for a 3g; the 3g at 4 is freed while the 3g at 0 is in use.
    pods = [pod("keep", 0, 10_000, "3g.40gb"), pod("leave", 0, 3000, "3g.40gb")]
    pods += [pod("small", 1, 10, "2g.20gb"), pod("young", 2900, 10, "3g.40gb")]
    cluster = SimCluster(H100, 1, 1)
    for inst in (Instance("3g.40gb", 0), Instance("3g.40gb", 4)):
        cluster.add(0, 0, inst, ready=True, holder=None)
    out = Engine(cluster, pods, Migpart(actuation_s=5, settings=MigpartSettings(age_s=600))).run()
    keep, leave, small, young = out.waits_s
    assert keep == leave == 0
    assert small == pytest.approx(3000 - 1 + 2 + 5)  # the freed 3g was withdrawn for it
    assert young > 0  # not handed the freed 3g ahead of small
    assert out.served == 4


def test_a_node_is_held_for_a_multi_gpu_pod_only_behind_young_pods() -> None:
    # Two nodes of two GPUs; two long pods and `s` fill three GPUs. A 2-GPU pod waits, and a
    # long 1-GPU pod comes after it.
    def waits(multi_at: float, hold_used: float | None, s: float = 1000) -> dict[str, float]:
        pods = [pod("l1", 0, 100_000, "7g.80gb"), pod("l2", 0, 100_000, "7g.80gb")]
        pods += [pod("s", 0, s, "7g.80gb"), pod("m", multi_at, 100, "7g.80gb", count=2)]
        pods += [pod("t", multi_at + 15, 100_000, "7g.80gb")]
        pods.sort(key=lambda p: p.arrival_s)
        policy = Migpart(
            actuation_s=5, settings=MigpartSettings(age_s=1200, hold_used=hold_used, hold_s=1800)
        )
        out = Engine(SimCluster(H100, 2, 2), pods, policy).run()
        assert out.served == len(pods)  # the cluster refuses to destroy an instance in use
        return dict(zip([p.name for p in pods], out.waits_s, strict=True))

    # Without a hold the young long pod takes the last GPU and the 2-GPU pod waits it out.
    assert waits(5, None)["m"] > 50_000
    # Held: the young long pod is kept off the emptiest node, and the 2-GPU pod gets it.
    held = waits(5, 0.5)
    assert held["m"] < 1000
    assert held["t"] > 0
    # Behind pods that ran longer than hold_s nothing is held (it could idle for long).
    late = waits(2000, 0.5, s=100_000)
    assert late["t"] < 30
    assert late["m"] > 50_000

"""A withdrawal racing an allocation, with the real kube-scheduler (migpart issue 23): nothing
allocated is ever destroyed.

One H100 holds a free 7g.80gb instance U. Pod A asks for a 1g.10gb, which does not fit beside
U, so a round plans to destroy U and create a 1g.10gb (docs/destroy-protocol.md: withdraw W,
grace, quorum read Q, spec write S). Pod B asks for a 7g.80gb, which the scheduler can serve
with U as it is. The interleavings the real system allows, by when B's allocation is decided:

1. before the round plans: the claim index shows U used, the plan cannot serve A, nothing is
   withdrawn;
2. after the plan and before W, or after W from a scheduling cycle that read the pool before
   W: Q finds the allocation, U is published again (Warning `DestroyAborted`), the round plans
   again with U used. The windows are milliseconds and cannot be aimed at from outside;
   `tests/integration/test_operator_destroy.py::test_device_allocated_while_withdrawn_is_kept`
   forces this one in process with a hook;
3. after the scheduler saw W: in offer mode (1.36+) U is still listed, tainted
   `WITHDRAWN_TAINT` (NoSchedule), so its counters still keep every overlapping placement out;
   in reactive mode (1.34: Auto falls back) U has left the pool. Either way B cannot be
   allocated and waits until a round makes a 7g.80gb for it;
4. after Q from a cycle that read the pool before W: the protocol's documented limit, covered
   by the grace (here `--withdraw-grace-seconds` GRACE_S; the default is 1 s).

The test creates B just before A (1, or 2 where the claim watch lags: either way U must stay
B's, unchanged), then, once B is gone and a round has withdrawn U for A (the test polls the
slice for it), creates C for a 7g.80gb (3: C waits, A is served, then C once A is done).
Wrong outcomes are each a failure: an allocated instance destroyed (the `scenario` fixture's
invariant monitor, and U's UUID), a spec that drops U while B holds it, the agent keeping a
prepared instance a spec dropped (`Degraded/InstancesKept`), the withdrawn U allocated anyway.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from migpart.demo.cluster import LocalCluster
from migpart.mig import device_name
from migpart.offer_content import WITHDRAWN_TAINT
from tests.e2e.conftest import H100, OPERATOR_FLAGS, SERVED, Scenario, wait_s
from tests.e2e.test_offer_mode import by_profile, pool_devices, reasons

pytestmark = pytest.mark.e2e

# Long enough for the test to see the withdrawal in the slice (a kubectl poll) before the spec
# drops U; every destroy of the test waits it.
GRACE_S = 3
WHOLE = device_name(0, "7g.80gb", 0)


@pytest.fixture
def offering_slowly(cluster: LocalCluster) -> Iterator[LocalCluster]:
    """The suite's operator, started again with `--offer-publishing` and a withdraw grace of
    GRACE_S for the test (and again as before after)."""
    cluster.stop_operator()
    cluster.start_operator(
        *OPERATOR_FLAGS, "--offer-publishing", "--withdraw-grace-seconds", str(GRACE_S)
    )
    try:
        yield cluster
    finally:
        cluster.stop_operator()
        cluster.start_operator(*OPERATOR_FLAGS)


def instances(sc: Scenario, node: str) -> list[tuple[str, str, str]]:
    """(profile, state, uuid) of every instance of the node's GPUs, as its agent reports."""
    return [
        (i["profile"], i["state"], i["uuid"]) for g in sc.gpus(node) for i in g.get("instances", [])
    ]


def unschedulable(sc: Scenario, pod: str) -> bool:
    """The scheduler tried the pod and found no node (with our nodes' devices) for it."""
    status = sc.get("pod", pod, "-n", sc.namespace).get("status") or {}
    return any(
        c["type"] == "PodScheduled"
        and c["status"] == "False"
        and c.get("reason") == "Unschedulable"
        for c in status.get("conditions") or []
    )


def withdrawn(sc: Scenario, node: str, name: str) -> bool:
    """Whether the node's pool shows device `name` withdrawn: listed with the withdrawn taint in
    offer mode, gone from the pool in reactive mode."""
    listed: dict[str, Any] = {d["name"]: d for d in pool_devices(sc, node)}
    if not SERVED:
        return name not in listed
    return any(
        t["key"] == WITHDRAWN_TAINT["key"] and t["effect"] == WITHDRAWN_TAINT["effect"]
        for t in (listed.get(name) or {}).get("taints") or []
    )


def degraded(sc: Scenario, node: str) -> list[str]:
    """The agent's `Degraded` message, if any: a prepared or busy instance that a spec dropped
    is one (`InstancesKept`)."""
    conditions = (sc.mignode(node).get("status") or {}).get("conditions") or []
    return [
        str(c.get("message"))
        for c in conditions
        if c["type"] == "Degraded" and c["status"] == "True"
    ]


def test_a_withdrawal_racing_an_allocation_destroys_nothing_allocated(
    offering_slowly: LocalCluster, scenario: Scenario
) -> None:
    node = scenario.add_node(f"{H100}:1")
    scenario.policy()  # Auto: Offer where served; no spares, so a free instance stays

    def mode() -> str:
        allocation = (scenario.get("gpp", scenario.pool).get("status") or {}).get("allocation")
        return str((allocation or {}).get("mode", ""))

    scenario.eventually("the policy's allocation mode reported", lambda: bool(mode()))
    assert mode() == ("Offer" if SERVED else "Reactive")

    # A free 7g.80gb: made for a pod that is then deleted.
    scenario.pod("warmup", by_profile("7g.80gb"))
    scenario.wait_served("warmup")
    scenario.finish("warmup")
    scenario.eventually(
        "the 7g.80gb free",
        lambda: [(p, s) for p, s, _ in instances(scenario, node)] == [("7g.80gb", "Free")],
    )
    [(_, _, whole)] = instances(scenario, node)
    plan_id = scenario.mignode(node)["spec"]["planId"]
    rounds = reasons(scenario, scenario.pool).count("Repartitioning")

    # 1. B just before A: B is allocated U as it is; A's round must not take U from it.
    scenario.pod("b", by_profile("7g.80gb"))
    scenario.pod("a", by_profile("1g.10gb"))
    assert [d["device"] for d in scenario.wait_served("b")] == [WHOLE]
    scenario.eventually("a found unschedulable", lambda: unschedulable(scenario, "a"))
    wait_s(1 + GRACE_S + 2)  # batch window, grace, spec: a wrong destroy's every chance
    assert instances(scenario, node) == [("7g.80gb", "Prepared", whole)]
    assert scenario.phase("b") == "Running"
    assert scenario.allocated("a") == []
    assert unschedulable(scenario, "a")  # the reason A waits: the GPU is B's
    assert scenario.mignode(node)["spec"]["planId"] == plan_id  # no spec dropped U
    assert degraded(scenario, node) == []
    events = reasons(scenario, scenario.pool)
    # a round that planned before the claim watch showed B's allocation withdrew U, and its
    # quorum read found B (interleaving 2)
    assert events.count("Repartitioning") == rounds or "DestroyAborted" in events

    # 2. B leaves; a round withdraws U for A; C, created while U is withdrawn, must not get it.
    scenario.finish("b")
    scenario.eventually(
        f"{WHOLE} withdrawn for a's 1g.10gb", lambda: withdrawn(scenario, node, WHOLE), 60
    )
    scenario.pod("c", by_profile("7g.80gb"))
    [small] = scenario.wait_served("a")
    assert small["device"].startswith("gpu-0-1g10gb-")
    assert scenario.allocated("c") == []
    scenario.eventually("c found unschedulable", lambda: unschedulable(scenario, "c"))
    # U destroyed (it was free); the simulator's UUIDs follow the GPU instance id, so the new
    # instance may reuse U's: its profile tells them apart
    assert [(p, s) for p, s, _ in instances(scenario, node)] == [("1g.10gb", "Prepared")]

    # C is served once A is done: a round destroys the free 1g.10gb and makes a 7g.80gb.
    scenario.finish("a")
    assert [d["device"] for d in scenario.wait_served("c")] == [WHOLE]
    assert [p for p, _, _ in instances(scenario, node)] == ["7g.80gb"]
    assert degraded(scenario, node) == []

"""Offer mode's second design on a real kubelet (issue 35, the agent's part): a node whose
MigNode spec says `allocation: Offer` gets an instance made when kubelet prepares the claim,
a free instance in the placement's way destroyed first, and the instance kept after the pod
for the next claim of that placement.

The test publishes the stable pool itself, with the production functions (GPU 0's
`counter_set`, each placement's `placement_device`), so that it chooses the listing order and
writes the spec each step needs; tests/e2e/test_offer_mode.py runs the operator's own pool.
The node does not opt in to migpart (`migpart.io/managed` None), so the suite's operator
leaves it, its slices and its spec alone. On Kubernetes 1.34 the API server drops the
counters (partitionable devices are not served there), so the test runs where they are
served and checks that elsewhere.
"""

from __future__ import annotations

import json
from typing import Any

from migpart.api.models import GpuStatus
from migpart.api.selectors import MANAGED_LABEL
from migpart.offer.pool import counter_set, placement_device
from migpart.slices.dra import DRIVER
from migpart.testing.builders import RESOURCE_API
from tests.e2e.conftest import H100, SERVED, Scenario

# the pool's listing order: the 4g.40gb first, then the 1g.10gb from the top down
LISTED = [("4g.40gb", 0), ("1g.10gb", 6), ("1g.10gb", 5)]


def profile_is(profile: str) -> str:
    return f'device.attributes["{DRIVER}"].profile == "{profile}"'


def publish_pool(
    scenario: Scenario, node: str, gpu: GpuStatus, listed: list[tuple[str, int]] = LISTED
) -> None:
    """The node's stable pool in two slices: the counter set, then the devices in order."""
    table = gpu.table()
    devices = [placement_device(gpu, table.profile(p), s) for p, s in listed]
    pool = {"name": node, "generation": 1, "resourceSliceCount": 2}
    bodies = [
        {"sharedCounters": [counter_set(0, table)]},
        {"devices": devices},
    ]
    for k, extra in enumerate(bodies):
        body: dict[str, Any] = {
            "apiVersion": RESOURCE_API,
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-stable-{k}"},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": pool, **extra},
        }
        scenario.tb.kubectl("apply", "-f", "-", input=json.dumps(body))


def spec(scenario: Scenario, node: str, *instances: tuple[str, int]) -> None:
    listed = [{"profile": p, "start": s} for p, s in instances]
    gpus = [{"index": 0, "instances": listed}]
    body = {"spec": {"planId": f"offer-{len(listed)}", "allocation": "Offer", "gpus": gpus}}
    scenario.tb.kubectl("patch", "mignode", node, "--type=merge", "-p", json.dumps(body))


def layout(scenario: Scenario, node: str) -> dict[tuple[str, int], dict[str, Any]]:
    gpu = scenario.gpus(node)[0]
    return {(i["profile"], i["start"]): i for i in gpu.get("instances", [])}


def test_prepare_destroys_a_free_instance_in_the_way_makes_the_placement_and_keeps_it(
    scenario: Scenario,
) -> None:
    node = scenario.add_node(f"{H100}:1", labels={MANAGED_LABEL: None})
    # a free 1g.10gb@0, in the way of 4g.40gb@0, made ahead by the spec, then no longer listed
    spec(scenario, node, ("1g.10gb", 0))
    scenario.eventually("1g.10gb@0 made", lambda: ("1g.10gb", 0) in layout(scenario, node))
    spec(scenario, node)
    gpu = GpuStatus.model_validate(scenario.gpus(node)[0])
    publish_pool(scenario, node, gpu)
    stored = scenario.get("resourceslice", f"{node}-stable-1")["spec"]["devices"][0]
    assert ("consumesCounters" in stored) == SERVED
    if not SERVED:
        return  # 1.34: no counters, no offer mode (test_allocator_order shows the rest)
    assert ("1g.10gb", 0) in layout(scenario, node)  # kept: an offering node destroys nothing

    scenario.pod("big", profile_is("4g.40gb"))
    [device] = scenario.wait_served("big")
    assert device["device"] == "gpu-0-4g40gb-0"
    now = layout(scenario, node)
    assert ("1g.10gb", 0) not in now  # destroyed first, being free
    assert now[("4g.40gb", 0)]["state"] in ("Prepared", "Busy")

    scenario.pod("small", profile_is("1g.10gb"))
    [first] = scenario.wait_served("small")
    assert first["device"] == "gpu-0-1g10gb-6"  # the listing's order
    made = layout(scenario, node)[("1g.10gb", 6)]["uuid"]
    scenario.finish("small")
    scenario.eventually(
        "small unprepared, its instance kept free",
        lambda: layout(scenario, node).get(("1g.10gb", 6), {}).get("state") == "Free",
    )
    scenario.pod("next", profile_is("1g.10gb"))
    [again] = scenario.wait_served("next")
    assert again["device"] == "gpu-0-1g10gb-6"  # the first fit is the instance left behind
    assert layout(scenario, node)[("1g.10gb", 6)]["uuid"] == made  # reused, not made again
    assert scenario.monitor.violations == []


def test_an_instance_in_the_way_still_prepared_is_destroyed_only_after_its_unprepare(
    scenario: Scenario,
) -> None:
    """The race of the design: kube-scheduler frees a claim's counters once its pod is gone
    from the API server, and may allocate an overlapping placement before kubelet unprepared
    the claim. Here kubelet cannot unprepare it (the agent is killed), pod `a` is deleted,
    pod `b` is allocated the 7g.80gb over `a`'s 1g.10gb, and the agent starts again with `a`
    still in its checkpoint. Whichever kubelet asks first, the 1g.10gb is destroyed only
    after `a` was unprepared (a prepare of `b` before that is refused, and kubelet retries;
    tests/unit/agent/test_prepare_offer.py forces that order)."""
    node = scenario.add_node(f"{H100}:1", labels={MANAGED_LABEL: None})
    spec(scenario, node)
    gpu = GpuStatus.model_validate(scenario.gpus(node)[0])
    publish_pool(scenario, node, gpu, [("1g.10gb", 6), ("7g.80gb", 0)])
    if not SERVED:
        return  # 1.34: no counters, no offer mode (the first test checks the fields dropped)
    scenario.pod("a", profile_is("1g.10gb"))
    assert scenario.wait_served("a")[0]["device"] == "gpu-0-1g10gb-6"
    scenario.cluster.kill_agent(node)
    scenario.tb.kubectl(
        "delete", "pod", "a", "-n", scenario.namespace, "--force", "--grace-period=0"
    )
    scenario.pod("b", profile_is("7g.80gb"))
    scenario.eventually("b allocated the 7g.80gb", lambda: bool(scenario.allocated("b")))
    scenario.cluster.start_agent(node)
    [device] = scenario.wait_served("b", timeout_s=180)
    assert device["device"] == "gpu-0-7g80gb-0"
    log = (scenario.cluster.dir / "logs" / f"agent-{node}.log").read_text().splitlines()
    events = [json.loads(line) for line in log if line.startswith("{")]
    steps = [
        e["event"]
        for e in events
        if e["event"] in ("claim_unprepared", "mig_instance_destroyed_for_prepare")
        or (e["event"] == "claim_prepare_failed" and "prepared for claim" in e.get("error", ""))
    ]
    assert steps[-2:] == ["claim_unprepared", "mig_instance_destroyed_for_prepare"], steps
    assert list(layout(scenario, node)) == [("7g.80gb", 0)]
    assert scenario.monitor.violations == []

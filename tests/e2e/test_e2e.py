"""End to end: pods whose claims no current MIG layout serves get served by the real
kube-scheduler after migpart repartitions, with real agents on simulated NVML."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import yaml

from migpart.mig import device_name
from migpart.slices.dra import DRIVER
from migpart.testing.builders import profile_is
from tests.e2e.conftest import H100, H200, Scenario, wait_s
from tests.e2e.helpers import instances, one_free_whole_gpu

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def by_memory(quantity: str) -> str:
    return f'device.capacity["{DRIVER}"].memory.compareTo(quantity("{quantity}")) >= 0'


def test_pending_pod_is_served_by_a_new_instance(scenario: Scenario) -> None:
    node = scenario.add_node(f"{H100}:1")
    assert instances(scenario, node) == []
    scenario.policy()
    scenario.pod("p1", profile_is("3g.40gb"))
    devices = scenario.wait_served("p1")
    assert [(d["pool"], d["device"].rsplit("-", 1)[0]) for d in devices] == [(node, "gpu-0-3g40gb")]
    scenario.eventually(
        "the instance reported Prepared by the agent",
        lambda: instances(scenario, node, "Prepared") == [(0, "3g.40gb", "Prepared")],
    )
    policy = scenario.get("gpp", scenario.pool)
    assert policy["status"]["lastPlan"]["satisfied"] >= 1


def test_multi_device_claim_lands_on_one_node(scenario: Scenario) -> None:
    scenario.add_node(f"{H100}:1")
    scenario.add_node(f"{H100}:1")
    scenario.policy()
    scenario.pod("trio", profile_is("2g.20gb"), count=3)
    devices = scenario.wait_served("trio")
    assert len(devices) == 3
    assert len({d["pool"] for d in devices}) == 1
    assert len({d["device"] for d in devices}) == 3


def test_several_models_and_capacity_selectors(scenario: Scenario) -> None:
    h100 = scenario.add_node(f"{H100}:1")
    h200 = scenario.add_node(f"{H200}:1")
    scenario.policy()
    scenario.pod("on-h200", profile_is("1g.18gb"))
    scenario.pod("on-h100", profile_is("1g.10gb"))
    scenario.pod("big-memory", by_memory("60Gi"))
    assert scenario.wait_served("on-h200")[0]["pool"] == h200
    assert scenario.wait_served("on-h100")[0]["pool"] == h100
    assert scenario.wait_served("big-memory")[0]["pool"] in {h100, h200}


def test_dry_run_plans_and_changes_nothing(scenario: Scenario) -> None:
    node = scenario.add_node(f"{H100}:1")
    spec_before = scenario.mignode(node).get("spec")
    scenario.policy(mode="DryRun")
    scenario.pod("dry", profile_is("1g.10gb"))

    def reported() -> bool:
        last = (scenario.get("gpp", scenario.pool).get("status") or {}).get("lastPlan")
        return bool(last) and last["satisfied"] >= 1

    scenario.eventually("a DryRun plan in the policy status", reported)
    wait_s(3)
    assert scenario.mignode(node).get("spec") == spec_before
    assert instances(scenario, node) == []
    assert scenario.allocated("dry") == []


def test_max_concurrent_nodes_is_respected(scenario: Scenario) -> None:
    nodes = [scenario.add_node(f"{H100}:1", sim_latency_ms=300) for _ in range(3)]
    scenario.policy(reconfiguration={"batchWindowSeconds": 1, "maxConcurrentNodes": 1})
    peak = [0]
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.1):
            busy = 0
            # one LIST, so that nodes are compared at one moment: a GET per node could see one
            # node before it converged and the next after its plan was written
            for body in scenario.mignodes(nodes).values():
                plan = (body.get("spec") or {}).get("planId")
                if plan and plan != (body.get("status") or {}).get("observedPlanId"):
                    busy += 1
            peak[0] = max(peak[0], busy)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        for i in range(3):
            scenario.pod(f"whole-{i}", profile_is("7g.80gb"))
        served = {scenario.wait_served(f"whole-{i}", 180)[0]["pool"] for i in range(3)}
    finally:
        done.set()
        watcher.join()
    assert served == set(nodes)
    assert peak[0] == 1


def test_spares_are_kept_free(scenario: Scenario) -> None:
    node = scenario.add_node(f"{H100}:1")
    scenario.policy(spares=[{"profile": "1g.10gb", "count": 2}])

    def carried_out() -> bool:
        body = scenario.mignode(node)
        plan = (body.get("spec") or {}).get("planId")
        synced = bool(plan) and plan == (body.get("status") or {}).get("observedPlanId")
        return synced and [p for _, p, _ in instances(scenario, node)].count("1g.10gb") >= 2

    scenario.eventually("the plan for two 1g.10gb spares carried out", carried_out)
    # exactly the spares, nothing more: over-provisioning fails here
    assert instances(scenario, node) == [(0, "1g.10gb", "Free")] * 2


@pytest.mark.parametrize("ending", ["deleted", "exited"])
def test_a_finished_pod_frees_its_device_for_reuse(scenario: Scenario, ending: str) -> None:
    """The pod is deleted, or its container exits (a batch pod: it Succeeds): either way its
    kubelet unprepares the claim, the agent frees the instance, and the next pod gets the same
    instance, with no repartition."""
    node = scenario.add_node(f"{H100}:1")
    scenario.policy()
    scenario.pod("first", profile_is("4g.40gb"), run_s=5 if ending == "exited" else None)
    first = scenario.wait_served("first")
    plan_id = scenario.mignode(node)["spec"]["planId"]
    if ending == "deleted":
        scenario.finish("first")
    else:
        scenario.eventually("the pod Succeeded", lambda: scenario.phase("first") == "Succeeded")
    scenario.eventually(
        "the instance is free again",
        lambda: instances(scenario, node, "Free") == [(0, "4g.40gb", "Free")],
    )
    scenario.pod("second", profile_is("4g.40gb"))
    second = scenario.wait_served("second")
    assert second[0]["device"] == first[0]["device"]
    assert scenario.mignode(node)["spec"]["planId"] == plan_id  # reused, no repartition


def test_allocation_racing_a_withdrawal_never_loses_a_device(scenario: Scenario) -> None:
    """A free 7g.80gb is both what one new pod wants as is and what migpart must destroy to
    serve another pod's 1g.10gb. Whichever wins, nothing allocated is destroyed (the monitor
    of the `scenario` fixture checks that throughout)."""
    node = one_free_whole_gpu(scenario)
    scenario.pod("small", profile_is("1g.10gb"))
    scenario.pod("whole", profile_is("7g.80gb"))
    scenario.eventually(
        "one of the two racing pods served",
        lambda: bool(scenario.allocated("small")) or bool(scenario.allocated("whole")),
    )
    wait_s(4)  # give a wrong destroy every chance to happen
    small, whole = scenario.allocated("small"), scenario.allocated("whole")
    assert bool(small) != bool(whole), (small, whole)
    if whole:
        assert instances(scenario, node) == [(0, "7g.80gb", "Free")] or instances(
            scenario, node
        ) == [(0, "7g.80gb", "Prepared")]


def test_the_sample_manifests_work_as_shipped(scenario: Scenario) -> None:
    """manifests/samples as a user applies them: the inference policy (pool=inference, small
    and medium profiles, two 1g.10gb spares) and the 20Gi claim template with its pod."""
    node = scenario.add_node(f"{H100}:1", labels={"pool": "inference"})
    scenario.tb.kubectl("apply", "-f", str(ROOT / "manifests/samples/policy-inference.yaml"))
    try:
        docs = list(
            yaml.safe_load_all((ROOT / "manifests/samples/claim-template.yaml").read_text())
        )
        for doc in docs:
            doc["metadata"]["namespace"] = scenario.namespace  # the sample says default
        items = {"apiVersion": "v1", "kind": "List", "items": docs}
        scenario.tb.kubectl("apply", "-f", "-", input=json.dumps(items))
        devices = scenario.wait_served("mig-inference")
        # at least 20Gi among the allowed 1g.10gb, 2g.20gb, 3g.40gb: only 3g.40gb has it
        assert [(d["pool"], d["device"].rsplit("-", 1)[0]) for d in devices] == [
            (node, "gpu-0-3g40gb")
        ]
        scenario.eventually(
            "the policy's two 1g.10gb spares kept free",
            lambda: instances(scenario, node, "Free").count((0, "1g.10gb", "Free")) >= 2,
        )
    finally:
        scenario.tb.kubectl("delete", "gpupartitionpolicy", "inference-pool", "--wait=false")


def test_cdi_ids_given_to_the_runtime_name_the_allocated_instance(scenario: Scenario) -> None:
    """The CDI device ids the kubelet passes to the container runtime (recorded by the fake
    runtime's CreateContainer) are the agent's CDI devices for the instance allocated to the
    claim: the id is the claim's, its spec exposes that instance's MIG UUID, and the MigNode
    reports that instance prepared for that claim."""
    node = scenario.add_node(f"{H100}:1")
    scenario.policy()
    scenario.pod("cdi", profile_is("3g.40gb"))
    [device] = scenario.wait_served("cdi")
    pod = scenario.get("pod", "cdi", "-n", scenario.namespace)
    claim_name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    claim_uid = scenario.get("resourceclaim", claim_name, "-n", scenario.namespace)["metadata"][
        "uid"
    ]
    sim = scenario.cluster.nodes[node]
    assert sim.kubelet is not None
    created = [c for c in sim.kubelet.created_containers() if c["podUid"] == pod["metadata"]["uid"]]
    assert [c["container"] for c in created] == ["c"]
    name = f"{claim_uid}-{device['device']}"
    assert created[0]["cdiDevices"] == [f"{DRIVER}/mig={name}"]
    spec = json.loads((sim.dir / "cdi" / f"{DRIVER}-{claim_uid}.json").read_text())
    [entry] = [d for d in spec["devices"] if d["name"] == name]
    [visible] = [e for e in entry["containerEdits"]["env"] if e.startswith("NVIDIA_VISIBLE_")]
    uuid = visible.split("=", 1)[1]
    [instance] = [
        (g["index"], i)
        for g in scenario.gpus(node)
        for i in g.get("instances", [])
        if i["uuid"] == uuid
    ]
    index, body = instance
    assert device_name(index, body["profile"], body["start"]) == device["device"]
    assert body["claims"] == [f"{scenario.namespace}/{claim_name}"]

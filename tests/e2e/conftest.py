"""End-to-end fixtures: one local cluster for the suite (testbed, operator), nodes per test.

Every node is a real kubelet (with the testbed's fake container runtime) and a real agent
whose DRA plugin registered with that kubelet: pods run, prepare and unprepare their claims
exactly as on a cluster.

Each test gets its own namespace, its own node pool label and its own policy, so tests do not
see each other's demand. A monitor thread checks the one invariant that matters during every
test: no device disappears from its node while a claim holds it (migpart.testing.invariants).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from migpart.demo.cluster import LocalCluster
from migpart.testbed import Testbed
from migpart.testbed.build import kube_version
from migpart.testbed.kubelet import RUN_SECONDS_ENV
from migpart.testing.builders import POOL_LABEL, ClaimBuilder, PodBuilder, PolicyBuilder
from migpart.testing.invariants import DestroyedWhileAllocated
from tests.rest import kubectl_get, kubectl_get_or_none, reader
from tests.testbeds import running_testbed

H100 = "NVIDIA H100 80GB HBM3"
# The agents' Lease timeout in this suite (default 40 s). A kubelet wipes a driver's slices 30 s
# after its plugin went away; with 40 s a killed agent's node would still count as available
# when that happens and the operator would republish its devices until the Lease expired.
# 15 s (renewed every 3 s) makes the node unavailable first (test_kubelet.py).
LEASE_TIMEOUT_S = 15
H200 = "NVIDIA H200"
# Offer mode (docs/offer-mode.md): partitionable devices and binding conditions are on by
# default from 1.36 (kube_features.go); the testbed sets no feature gates.
SERVED = tuple(int(p) for p in kube_version().split(".")[:2]) >= (1, 36)
OPERATOR_FLAGS = ("--lease-timeout-seconds", str(LEASE_TIMEOUT_S))
_ids = itertools.count(1)


@pytest.fixture(scope="package")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    """This suite's own control plane, stopped when its last test is done."""
    with running_testbed(tmp_path_factory) as bed:
        yield bed


@pytest.fixture(scope="package")
def cluster(testbed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    local = LocalCluster(
        testbed,
        tmp_path_factory.mktemp("e2e"),
        agent_flags=[
            "--lease-duration-seconds",
            str(LEASE_TIMEOUT_S),
            "--lease-renew-seconds",
            str(LEASE_TIMEOUT_S / 5),
        ],
    )
    local.install()
    local.start_operator(*OPERATOR_FLAGS)
    try:
        yield local
    finally:
        local.stop()


@pytest.fixture
def offering(cluster: LocalCluster) -> Iterator[LocalCluster]:
    """The suite's operator, started again with `--offer-publishing` for the test (and again
    without it after)."""
    cluster.stop_operator()
    cluster.start_operator(*OPERATOR_FLAGS, "--offer-publishing")
    try:
        yield cluster
    finally:
        cluster.stop_operator()
        cluster.start_operator(*OPERATOR_FLAGS)


class InvariantMonitor(threading.Thread):
    """Polls claims and MigNodes; records any allocated device that vanished from its node
    while its claim held it (migpart.testing.invariants, ordered by resourceVersion)."""

    def __init__(self, testbed: Testbed) -> None:
        super().__init__(daemon=True)
        self.api = reader(testbed)
        self.stop_event = threading.Event()
        self.ledger = DestroyedWhileAllocated(every_change=False)

    @property
    def violations(self) -> list[str]:
        return [f"{v} destroyed while allocated" for v in self.ledger.violations]

    def run(self) -> None:
        try:
            while not self.stop_event.wait(0.2):
                self.check()
        finally:
            self.api.close_thread()

    def check(self) -> None:
        # the nodes first: a claim released before a device went shows in the later list
        nodes = self.api.mignodes()
        claims = self.api.claims()
        self.ledger.mignodes_listed(nodes)
        self.ledger.claims_listed(claims)


@dataclass
class Scenario:
    """Per-test helpers around the shared cluster."""

    cluster: LocalCluster
    namespace: str
    pool: str
    monitor: InvariantMonitor
    nodes: list[str] = field(default_factory=list)

    @property
    def tb(self) -> Testbed:
        return self.cluster.testbed

    def add_node(
        self,
        gpus: str,
        sim_latency_ms: float = 0.0,
        labels: Mapping[str, str | None] | None = None,
        agent_args: tuple[str, ...] = (),
    ) -> str:
        """A node of this test's pool, named `<pool>-n<k>` in the order added; `agent_args`
        are added to its agent's flags (e.g. `--sim-faults`). It opts in to migpart unless
        `labels` gives `migpart.io/managed` None."""
        name = f"{self.pool}-n{len(self.nodes) + 1}"
        all_labels = {POOL_LABEL: self.pool, **(labels or {})}
        self.cluster.add_gpu_node(name, gpus, all_labels, sim_latency_ms, extra_args=agent_args)
        self.nodes.append(name)
        self.cluster.wait_for(f"MigNode {name} inventory", lambda: bool(self.gpus(name)))
        return name

    def policy(self, mode: str = "Active", **spec: Any) -> str:
        policy = PolicyBuilder(self.pool).pool({POOL_LABEL: self.pool}).spec(mode=mode)
        defaults = {"reconfiguration": {"batchWindowSeconds": 1, "maxConcurrentNodes": 4}}
        policy.spec(**{**defaults, **spec})  # a test's own reconfiguration replaces the default
        body = policy.obj()
        self.tb.kubectl("apply", "-f", "-", input=json.dumps(body))
        return self.pool

    def get(self, *args: str) -> Any:
        """`kubectl get ARGS -o json`; the plain forms without a kubectl process (tests/rest.py)."""
        return kubectl_get(self.tb, *args)

    def mignode(self, node: str) -> Any:
        return self.get("mignode", node)

    def mignodes(self, nodes: list[str]) -> dict[str, Any]:
        """These MigNodes from one LIST: one consistent moment, unlike a GET per node."""
        items = self.get("mignodes")["items"]
        return {b["metadata"]["name"]: b for b in items if b["metadata"]["name"] in nodes}

    def gpus(self, node: str) -> list[Any]:
        body = kubectl_get_or_none(self.tb, "mignode", node)
        return list((body.get("status") or {}).get("gpus", [])) if body else []

    def pod(
        self,
        name: str,
        selector: str,
        count: int = 1,
        run_s: float | None = None,
        prefer: dict[str, str] | None = None,
    ) -> None:
        """A pod with a claim template of `count` MIG devices matching the CEL `selector`.
        Its container runs until the pod is deleted, or exits after `run_s` seconds. With
        `prefer`, kube-scheduler scores the nodes with these labels first (preferred node
        affinity), where several fit."""
        template = ClaimBuilder(name, self.namespace).request(selector, count=count).template()
        # this test's nodes only: earlier tests' free devices must not serve it
        pod = PodBuilder(name, self.namespace).claim_template(name).ends()
        pod.node_selector({POOL_LABEL: self.pool})
        if prefer:
            terms = [{"key": k, "operator": "In", "values": [v]} for k, v in prefer.items()]
            pod.spec(
                affinity={
                    "nodeAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [
                            {"weight": 100, "preference": {"matchExpressions": terms}}
                        ]
                    }
                }
            )
        if run_s is not None:
            pod.env(RUN_SECONDS_ENV, str(run_s))
        self.tb.kubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [template, pod.obj()]}),
        )

    def allocated(self, pod: str) -> list[dict[str, str]]:
        """The devices of the pod's claim once it is bound and allocated, else []."""
        body = self.get("pod", pod, "-n", self.namespace)
        if not body["spec"].get("nodeName"):
            return []
        statuses = body.get("status", {}).get("resourceClaimStatuses", [])
        if not statuses:
            return []
        claim = self.get("resourceclaim", statuses[0]["resourceClaimName"], "-n", self.namespace)
        alloc = (claim.get("status") or {}).get("allocation")
        return list(alloc["devices"]["results"]) if alloc else []

    def phase(self, pod: str) -> str:
        return str(self.get("pod", pod, "-n", self.namespace).get("status", {}).get("phase"))

    def wait_served(self, pod: str, timeout_s: float = 120.0) -> list[dict[str, str]]:
        """Wait until the pod is bound with its claim allocated and its kubelet ran it (which
        means the agent prepared the claim); return the claim's devices."""
        self.eventually(
            f"pod {pod} bound with its claim allocated",
            lambda: bool(self.allocated(pod)),
            timeout_s,
        )
        devices = self.allocated(pod)
        self.eventually(
            f"pod {pod} Running",
            lambda: self.phase(pod) in ("Running", "Succeeded"),  # a batch pod may be done
            timeout_s,
        )
        return devices

    def finish(self, pod: str) -> None:
        """Delete the pod; its kubelet stops it and unprepares its claim."""
        self.tb.kubectl("delete", "pod", pod, "-n", self.namespace, "--wait=false")

    def eventually(self, what: str, ready: Callable[[], bool], timeout_s: float = 120.0) -> None:
        self.cluster.wait_for(what, ready, timeout_s)

    def cleanup(self) -> None:
        self.tb.kubectl("delete", "namespace", self.namespace, "--wait=false", check=False)
        self.tb.kubectl("delete", "gpupartitionpolicy", self.pool, "--wait=false", check=False)
        for node in self.nodes:
            self.cluster.remove_gpu_node(node)


@pytest.fixture
def scenario(cluster: LocalCluster) -> Iterator[Scenario]:
    n = next(_ids)
    namespace = f"e2e-{n}"
    cluster.testbed.kubectl("create", "namespace", namespace)
    monitor = InvariantMonitor(cluster.testbed)
    monitor.start()
    sc = Scenario(cluster, namespace, f"pool{n}", monitor)
    try:
        yield sc
    finally:
        monitor.stop_event.set()
        monitor.join()
        sc.cleanup()
    assert monitor.violations == [], monitor.violations


def wait_s(seconds: float) -> None:
    """A pause for observing that something does NOT happen (never a pass condition alone)."""
    time.sleep(seconds)

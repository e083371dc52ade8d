"""Integration fixtures: migpart's CRDs and DeviceClass on the testbed, and the operator
running in-process (kopf on its own event loop in a background thread) against it.

Helpers here write objects the way the other actors would: `put_mignode` as the agent
(status through the status subresource), `pending_pod` as kube-scheduler leaves an
unschedulable pod (pods/status), `allocate` as kube-scheduler's allocation
(resourceclaims/status).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import kopf
import pytest
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client import ApiClient, Configuration

from migpart.api.leases import LEASE_LABELS, LEASE_NAMESPACE, lease_name
from migpart.api.models import (
    GROUP,
    MIGNODE_PLURAL,
    POLICY_PLURAL,
    GpuStatus,
    MigNodeStatus,
)
from migpart.clock import RealClock
from migpart.controller.core.metrics import Metrics
from migpart.controller.core.state import Hooks, JournalEntry, OperatorState
from migpart.controller.runtime.handlers import OperatorConfig, operate
from migpart.slices.dra import DRIVER, micro_time
from migpart.testbed import Testbed
from migpart.testing import builders
from migpart.testing.builders import (
    ClaimBuilder,
    MigNodeBuilder,
    PodBuilder,
    PolicyBuilder,
    profile_is,
)
from tests.rest import kubectl_get, kubectl_get_or_none
from tests.testbeds import running_testbed

ROOT = Path(__file__).resolve().parents[2]
H100 = "NVIDIA H100 80GB HBM3"
T = TypeVar("T")
# The `operator` fixture's lease timeout: longer than any test, so that one renewal by
# put_mignode keeps a node in service (tests of stale nodes set their own).
LONG_LEASE_TIMEOUT_S = 3600.0


def eventually(fn: Callable[[], T], timeout: float = 60.0, interval: float = 0.2) -> T:
    """Call `fn` until it returns a truthy value without raising AssertionError.

    The timeout only guards against hanging; nothing is asserted about how long it took.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = fn()
            if result:
                return result
            last: Exception | None = None
        except AssertionError as e:
            last = e
        if time.monotonic() > deadline:
            if last is not None:
                raise last
            raise AssertionError(f"condition not met within {timeout}s: {fn}")
        time.sleep(interval)


PROFILE_IS = profile_is("{}")


def events(bed: Testbed, name: str, namespace: str = "", reason: str = "") -> list[dict[str, Any]]:
    """The Events about objects named `name` (in `namespace`, or in all namespaces), only those
    of `reason` when one is given. Some control-plane Events name no object (an empty
    `involvedObject`): they are about none."""
    scope = ["-n", namespace] if namespace else ["-A"]
    items = get(bed, "events", *scope)["items"]
    return [
        e
        for e in items
        if (e.get("involvedObject") or {}).get("name") == name
        and (not reason or e["reason"] == reason)
    ]


def get(bed: Testbed, *args: str) -> dict[str, Any]:
    """`kubectl get ARGS -o json`; the plain forms without a kubectl process (tests/rest.py)."""
    return kubectl_get(bed, *args)


def policy_status(bed: Testbed, name: str) -> dict[str, Any]:
    """GpuPartitionPolicy `name`'s status ({} before the operator writes one)."""
    status: dict[str, Any] = get(bed, "gpupartitionpolicy", name).get("status") or {}
    return status


def mignode_spec(bed: Testbed, node: str) -> dict[str, Any]:
    """MigNode `node`'s spec ({} before the operator writes one)."""
    spec: dict[str, Any] = get(bed, "mignode", node).get("spec") or {}
    return spec


def planned_spec(bed: Testbed, node: str) -> dict[str, Any]:
    """MigNode `node`'s spec once the operator has planned the node (it names a planId)."""

    def planned() -> dict[str, Any]:
        spec = mignode_spec(bed, node)
        assert spec.get("planId")
        return spec

    return eventually(planned)


def get_or_none(bed: Testbed, *args: str) -> dict[str, Any] | None:
    return kubectl_get_or_none(bed, *args)


def apply(bed: Testbed, body: dict[str, Any]) -> None:
    bed.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(body))


def patch_status(bed: Testbed, kind: str, name: str, status: dict[str, Any], *ns: str) -> None:
    bed.kubectl(
        "patch",
        kind,
        name,
        *ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
    )


def gpu_status(index: int, instances: list[tuple[str, int]], model: str = H100) -> GpuStatus:
    """A GPU as the agent reports it, with the profile table of the built-in catalog."""
    free = [(p, s, "Free") for p, s in instances]
    return builders.gpu_status(index, *free, model=model, uuid=f"GPU-{index:08d}-test")


def put_mignode(
    bed: Testbed,
    name: str,
    gpus: list[GpuStatus],
    spec: dict[str, Any] | None = None,
    observed_plan_id: str | None = None,
) -> None:
    """Create/refresh MigNode `name` and write its status as the agent would."""
    node = MigNodeBuilder(name)
    if spec is not None:
        node.spec(spec)
    apply(bed, node.obj())
    renew_lease(bed, name)
    status = MigNodeStatus(observed_plan_id=observed_plan_id, gpus=gpus)
    patch_status(
        bed, "mignode", name, status.model_dump(by_alias=True, exclude_none=True, mode="json")
    )


def add_mignode(
    bed: Testbed, name: str, labels: dict[str, str], gpus: list[GpuStatus] | None = None
) -> None:
    """Node `name` with `labels`, and its MigNode as its agent writes it: `gpus`, by default
    one empty H100."""
    bed.add_node(name, labels)
    put_mignode(bed, name, [gpu_status(0, [])] if gpus is None else gpus)


def renew_lease(bed: Testbed, node: str) -> None:
    """Renew the node's heartbeat Lease now, as its agent would (migpart.agent.lease)."""
    apply(
        bed,
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": lease_name(node),
                "namespace": LEASE_NAMESPACE,
                "labels": dict(LEASE_LABELS),
            },
            "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": micro_time()},
        },
    )


def claim_body(name: str, namespace: str, expression: str) -> dict[str, Any]:
    return ClaimBuilder(name, namespace).request(expression).obj()


def pending_pod(
    bed: Testbed,
    name: str,
    namespace: str,
    claim: str,
    node_selector: dict[str, str] | None = None,
    priority_class: str | None = None,
) -> None:
    """A pod using `claim`, left to a scheduler that does not exist, then marked
    Unschedulable the way kube-scheduler marks it."""
    pod = PodBuilder(name, namespace).container("main", "busybox").claim(claim)
    pod.node_selector(node_selector or {}).spec(schedulerName="migpart-test-no-scheduler")
    if priority_class:
        pod.spec(priorityClassName=priority_class)
    apply(bed, pod.obj())
    unschedulable = PodBuilder(name).unschedulable(
        "0/1 nodes are available: cannot allocate all claims"
    )
    patch_status(bed, "pod", name, unschedulable.obj()["status"], "-n", namespace)


def pending_claim(
    bed: Testbed,
    name: str,
    profile: str,
    node_selector: dict[str, str] | None = None,
    *,
    pod: str = "",
    priority_class: str | None = None,
) -> None:
    """Claim `name` (in default) for one `profile` device, and a pending pod using it, named
    `pod` or as the claim (`pending_pod`)."""
    apply(bed, claim_body(name, "default", PROFILE_IS.format(profile)))
    pending_pod(bed, pod or name, "default", name, node_selector, priority_class)


def allocate(bed: Testbed, claim: str, namespace: str, node: str, device: str) -> None:
    """Write the claim's allocation as kube-scheduler would (resourceclaims/status)."""
    patch_status(
        bed,
        "resourceclaim",
        claim,
        {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": DRIVER,
                            "pool": node,
                            "device": device,
                        }
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                },
            }
        },
        "-n",
        namespace,
    )


def policy_body(name: str, labels: dict[str, str], **spec: Any) -> dict[str, Any]:
    return PolicyBuilder(name).pool(labels).spec(**spec).obj()


@pytest.fixture
async def api(cluster: Testbed) -> AsyncIterator[ApiClient]:
    """An API client of the test's own loop, as cluster-admin."""
    cfg = Configuration()
    await kube_config.load_kube_config(
        config_file=str(cluster.kubeconfig), client_configuration=cfg
    )
    async with ApiClient(cfg) as client:
        yield client


@pytest.fixture(scope="package")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    """This suite's own control plane, stopped when its last test is done."""
    with running_testbed(tmp_path_factory) as bed:
        yield bed


@pytest.fixture(scope="package")
def cluster(testbed: Testbed) -> Testbed:
    """The testbed with migpart's CRDs Established and its DeviceClass applied."""
    for crd in sorted((ROOT / "crds").glob("*.yaml")):
        testbed.kubectl("apply", "--server-side", "-f", str(crd))
    for crd in (f"{POLICY_PLURAL}.{GROUP}", f"{MIGNODE_PLURAL}.{GROUP}"):
        testbed.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{crd}")
    testbed.kubectl("apply", "--server-side", "-f", str(ROOT / "manifests" / "deviceclass.yaml"))
    eventually(lambda: "default" in testbed.kubectl("get", "namespaces", "-o", "name"))
    return testbed


@pytest.fixture(scope="package")
def installed(cluster: Testbed) -> Testbed:
    """The cluster with migpart's namespace, service accounts, RBAC and admission policy from
    manifests/ (no workloads: the tests act as the service accounts with their tokens)."""
    for name in ("namespace", "operator-rbac", "agent-rbac", "agent-admission"):
        cluster.kubectl("apply", "--server-side", "-f", str(ROOT / "manifests" / f"{name}.yaml"))
    return cluster


@dataclass
class RunningOperator:
    """An operator on its own loop in a thread; `hooks` expose its protocol steps."""

    hooks: Hooks
    loop: asyncio.AbstractEventLoop | None = None
    error: BaseException | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    memo: kopf.Memo = field(default_factory=kopf.Memo)
    thread: threading.Thread | None = None

    def policy_loops(self) -> frozenset[str]:
        """The policies the operator runs a planning loop for (read across threads: a copy)."""
        state: OperatorState = self.memo.state
        return state.workers.names()

    def shut_down(self) -> None:
        self.stop.set()
        assert self.thread is not None
        self.thread.join(60)
        assert not self.thread.is_alive(), "operator did not stop"

    def steps(self, node: str) -> list[JournalEntry]:
        return [e for e in list(self.hooks.journal) if e.node == node]


@contextmanager
def running_operator(cluster: Testbed, **config: Any) -> Iterator[RunningOperator]:
    """An operator in-process on `cluster` (OperatorConfig fields in `config`), stopped
    and cleaned up after."""
    running = RunningOperator(hooks=Hooks())
    settings: dict[str, Any] = {"tick_s": 0.2, "slice_resync_s": 1.0, **config}

    def main() -> None:
        loop = asyncio.new_event_loop()
        running.loop = loop
        asyncio.set_event_loop(loop)
        try:
            operator_config = OperatorConfig(
                cluster.kubeconfig, Metrics(), RealClock(), hooks=running.hooks, **settings
            )
            loop.run_until_complete(
                operate(operator_config, running.memo, running.ready, running.stop)
            )
        except BaseException as e:  # noqa: BLE001 - handed to the test thread, re-raised there
            running.error = e
        finally:
            # aiohttp finishes closing its (TLS) connections on later loop iterations; closing
            # the loop at once would leave kopf's watch sockets to the garbage collector, whose
            # ResourceWarnings then fail whichever test happens to be running.
            loop.run_until_complete(asyncio.sleep(0.25))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    thread = threading.Thread(target=main, name="migpart-operator", daemon=True)
    running.thread = thread
    thread.start()
    assert running.ready.wait(60), "operator did not become ready"
    try:
        yield running
    finally:
        # What the test made must not become the next test's demand. Unscheduled pods go at
        # once; bound ones have no kubelet to confirm, hence --force.
        cluster.kubectl("delete", "pods", "--all", "-n", "default", "--force", "--grace-period=0")
        cluster.kubectl("delete", "resourceclaims", "--all", "-n", "default", "--wait=false")
        cluster.kubectl("delete", "gpupartitionpolicies", "--all", "--wait=true", "--timeout=60s")
        running.shut_down()
        if running.error is not None:
            raise running.error


@pytest.fixture
def operator(cluster: Testbed) -> Iterator[RunningOperator]:
    """The operator; node leases stay fresh for the whole test once written (put_mignode
    writes one, as the agent would)."""
    with running_operator(cluster, lease_timeout_s=LONG_LEASE_TIMEOUT_S) as running:
        yield running

"""Real `migpart agent --simulate` processes on the testbed, for tests that kill an agent or
lose one of its GPUs (a file the simulator reads): two such nodes under a policy that
reconfigures one node at a time, the first holding the slot (`two_agents`, `slot_held_by_a`);
an agent served in the test's own process (`running_agent`), and helpers that read what they
and the operator wrote."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from kubernetes_asyncio.client import ApiClient

from migpart.agent.app import AgentConfig, serve
from migpart.agent.simulator import SimulatedNvml
from migpart.slices.dra import DRIVER
from migpart.testbed import Testbed
from tests.integration.conftest import (
    H100,
    apply,
    eventually,
    get_or_none,
    pending_claim,
    policy_body,
)
from tests.stopping import stop_process, stop_task


class AgentProcess:
    def __init__(self, bed: Testbed, node: str, root: Path, latency_ms: int, *extra: str) -> None:
        self.bed, self.node, self.root, self.extra = bed, node, root, extra
        self.log_path = root / f"agent-{node}.log"
        self._log: IO[bytes] | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.start(latency_ms)

    def start(self, latency_ms: int) -> None:
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "migpart.cli",
                "agent",
                "--node-name",
                self.node,
                "--simulate",
                f"{H100}:1",
                "--sim-latency-ms",
                str(latency_ms),
                "--no-kubelet-plugin",
                "--kubeconfig",
                str(self.bed.kubeconfig),
                "--state-dir",
                str(self.root / self.node / "state"),
                "--cdi-dir",
                str(self.root / self.node / "cdi"),
                "--metrics-port",
                "0",
                "--lease-renew-seconds",
                "0.5",
                "--lease-duration-seconds",
                "3",
                *self.extra,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    @property
    def state_dir(self) -> Path:
        return self.root / self.node / "state"

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        assert self._log is not None
        self._log.close()

    def stop(self) -> None:
        try:
            if self.proc is not None:
                stop_process(self.proc, f"the agent of {self.node}")
        finally:
            if self._log is not None:
                self._log.close()


@pytest.fixture(name="agents")
def agents_fixture(cluster: Testbed, tmp_path: Path) -> Iterator[dict[str, AgentProcess]]:
    """The test's agent processes (it starts them), stopped after it; their logs' tails are
    printed, so that a failing test shows them."""
    running: dict[str, AgentProcess] = {}
    yield running
    for agent in running.values():
        agent.stop()
        print(agent.log_path.read_text()[-3000:])  # shown when the test failed


def two_agents(
    bed: Testbed,
    agents: dict[str, AgentProcess],
    root: Path,
    name: str,
    a_latency_ms: int,
    *a_flags: str,
) -> tuple[str, str]:
    """Nodes NAME-a and NAME-b (labelled migpart-test=NAME and NAME-node=a or b), each with
    its agent process in `agents`; a's NVML takes `a_latency_ms` a call (`a_flags`: more flags
    of its agent), b's none."""
    a, b = f"{name}-a", f"{name}-b"
    for node, which in ((a, "a"), (b, "b")):
        bed.add_node(node, {"migpart-test": name, f"{name}-node": which})
    agents[a] = AgentProcess(bed, a, root, a_latency_ms, *a_flags)
    agents[b] = AgentProcess(bed, b, root, 0)
    return a, b


def slot_held_by_a(bed: Testbed, name: str, a: str, b: str) -> str:
    """With the operator running, over the nodes of `two_agents`: the policy NAME reconfiguring
    one node at a time, and claim NAME-a of a 1g.10gb pending on a, whose spec takes the slot.
    Returns the planId of a's spec, not yet carried out."""
    one_slot_policy(bed, name, {"migpart-test": name}, a, b)
    pending_claim(bed, a, "1g.10gb", {f"{name}-node": "a"})
    return spec_under_way(bed, a, "1g.10gb")


def mignode(bed: Testbed, node: str) -> dict[str, Any]:
    return get_or_none(bed, "mignode", node) or {}


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == type_), None)


def devices(bed: Testbed, node: str) -> list[str]:
    got = get_or_none(bed, "resourceslice", f"{node}-{DRIVER}")
    return sorted(d["name"] for d in ((got or {}).get("spec") or {}).get("devices") or [])


def planned(obj: dict[str, Any], profile: str) -> bool:
    gpus = (obj.get("spec") or {}).get("gpus") or []
    return any(i["profile"] == profile for g in gpus for i in g.get("instances") or [])


def one_slot_policy(bed: Testbed, name: str, labels: dict[str, str], *nodes: str) -> None:
    """Once `nodes` report their GPUs: a policy over them that reconfigures one node at a
    time, at once."""
    for node in nodes:
        eventually(lambda n=node: (mignode(bed, n).get("status") or {}).get("gpus"), timeout=90)  # type: ignore[misc]
    reconfiguration = {"batchWindowSeconds": 0, "maxConcurrentNodes": 1}
    apply(bed, policy_body(name, labels, reconfiguration=reconfiguration))


def spec_under_way(bed: Testbed, node: str, profile: str) -> str:
    """The planId of the first spec of `node` that plans a `profile`, not yet carried out."""
    spec = eventually(lambda: planned(mignode(bed, node), profile) and mignode(bed, node))
    plan: str = spec["spec"]["planId"]
    assert (spec.get("status") or {}).get("observedPlanId") != plan
    return plan


@contextlib.asynccontextmanager
async def running_agent(
    config: AgentConfig, api: ApiClient, sim: SimulatedNvml
) -> AsyncIterator[None]:
    started = asyncio.Event()
    task = asyncio.create_task(serve(config, api, backend=sim, started=started))
    await started.wait()
    try:
        yield
    finally:
        await stop_task(task, f"the agent of {config.node}")

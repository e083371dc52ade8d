"""A local migpart cluster: the testbed, simulated GPU nodes with their agents, the operator.

Every component is the real program in its own process (`migpart agent --simulate`,
`migpart operator`), talking to the real API server; only NVML is simulated.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from migpart.testbed import Testbed
from migpart.testbed.run import terminate_all

REPO = Path(__file__).resolve().parents[3]
CRDS = REPO / "crds"
DEVICE_CLASS = REPO / "manifests" / "deviceclass.yaml"


@dataclass
class SimNode:
    name: str
    gpus: str
    dir: Path
    proc: subprocess.Popen[bytes]
    log: IO[bytes]
    args: list[str] = field(default_factory=list)

    @property
    def plugin_socket(self) -> Path:
        return self.dir / "plugins" / "dra.sock"


@dataclass
class LocalCluster:
    """Owns the processes it starts; `stop()` ends all of them."""

    testbed: Testbed
    dir: Path
    nodes: dict[str, SimNode] = field(default_factory=dict)
    _operator: tuple[subprocess.Popen[bytes], IO[bytes]] | None = None

    def install(self) -> None:
        """CRDs (waiting until Established) and the DeviceClass; idempotent."""
        self.testbed.kubectl("apply", "-f", str(CRDS))
        self.testbed.kubectl(
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/gpupartitionpolicies.migpart.io",
            "crd/mignodes.migpart.io",
        )
        self.testbed.kubectl("apply", "-f", str(DEVICE_CLASS))

    def _spawn(self, name: str, args: list[str]) -> tuple[subprocess.Popen[bytes], IO[bytes]]:
        logs = self.dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log = (logs / f"{name}.log").open("ab")
        env = {**os.environ, "KUBECONFIG": str(self.testbed.kubeconfig), "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "migpart.cli", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        return proc, log

    def add_gpu_node(
        self,
        name: str,
        gpus: str = "NVIDIA H100 80GB HBM3:8",
        labels: dict[str, str] | None = None,
        sim_latency_ms: float = 0.0,
        extra_args: tuple[str, ...] = (),
    ) -> SimNode:
        """A Node object plus a `migpart agent --simulate` process for it (`extra_args` are
        appended to the agent's flags)."""
        self.testbed.add_node(name, {"nvidia.com/mig.capable": "true", **(labels or {})})
        node_dir = self.dir / "nodes" / name
        node_dir.mkdir(parents=True, exist_ok=True)
        args = [
            "agent",
            "--simulate",
            gpus,
            "--node-name",
            name,
            "--sim-latency-ms",
            str(sim_latency_ms),
            "--kubeconfig",
            str(self.testbed.kubeconfig),
            "--state-dir",
            str(node_dir / "state"),
            "--cdi-dir",
            str(node_dir / "cdi"),
            "--plugin-dir",
            str(node_dir / "plugins"),
            "--registration-dir",
            str(node_dir / "registry"),
            "--metrics-port",
            "0",
            *extra_args,
        ]
        proc, log = self._spawn(f"agent-{name}", args)
        node = SimNode(name, gpus, node_dir, proc, log, args)
        self.nodes[name] = node
        return node

    def kill_agent(self, name: str) -> None:
        """SIGKILL the node's agent (its simulated GPUs keep their instances)."""
        node = self.nodes[name]
        _kill(node.proc)
        node.log.close()

    def restart_agent(self, name: str) -> None:
        """Start the node's agent again with the flags it had."""
        node = self.nodes[name]
        node.proc, node.log = self._spawn(f"agent-{name}", node.args)

    def kill_operator(self) -> None:
        """SIGKILL the operator (start it again with `start_operator`)."""
        if self._operator:
            _kill(self._operator[0])
            self._operator[1].close()
            self._operator = None

    def remove_gpu_node(self, name: str) -> None:
        """Stop the node's agent and delete its Node; the garbage collector takes the MigNode
        and ResourceSlices the Node owns."""
        node = self.nodes.pop(name, None)
        if node is not None:
            _terminate(node.proc, node.log)
        self.testbed.kubectl("delete", "node", name, "--ignore-not-found", "--wait=false")

    def start_operator(self, *extra: str) -> None:
        self._operator = self._spawn(
            "operator",
            [
                "operator",
                "--kubeconfig",
                str(self.testbed.kubeconfig),
                "--metrics-port",
                "0",
                *extra,
            ],
        )

    def stop_operator(self) -> None:
        if self._operator:
            _terminate(*self._operator)
            self._operator = None

    def check_alive(self) -> None:
        """Raise with the log tail of any component that died."""
        self.testbed.check_alive()
        procs = [(f"agent-{n.name}", n.proc) for n in self.nodes.values()]
        if self._operator:
            procs.append(("operator", self._operator[0]))
        for name, proc in procs:
            if proc.poll() is not None:
                log = self.dir / "logs" / f"{name}.log"
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
                raise RuntimeError(f"{name} exited with {proc.returncode}; {log}:\n{tail}")

    def wait_for(self, what: str, ready: Callable[[], bool], timeout_s: float = 90.0) -> None:
        """Poll `ready` until true; fail with `what` and the component state on timeout."""
        deadline = time.monotonic() + timeout_s
        while not ready():
            self.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
            time.sleep(0.2)

    def stop(self) -> None:
        self.stop_operator()
        for node in self.nodes.values():
            _terminate(node.proc, node.log)
        self.nodes.clear()


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _terminate(proc: subprocess.Popen[bytes], log: IO[bytes], grace_s: float = 10.0) -> None:
    terminate_all([(proc, log)], grace_s)

"""A local migpart cluster: the testbed, simulated GPU nodes with their agents, the operator.

Every component is the real program in its own process (`migpart agent --simulate`,
`migpart operator`, a real kubelet per node), talking to the real API server; only NVML and
the container runtime (the kubelet's fake CRI, see `migpart.testbed.kubelet`) are simulated.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from migpart.api.models import GROUP
from migpart.kube.election_lease import DEFAULT_NAMESPACE
from migpart.slices.dra import DRIVER
from migpart.testbed import Testbed
from migpart.testbed.kubelet import NodeKubelet
from migpart.testbed.run import log_tail, opted_in, terminate_all, wait_until

REPO = Path(__file__).resolve().parents[3]
CRDS = REPO / "crds"
DEVICE_CLASS = REPO / "manifests" / "deviceclass.yaml"
# where the operators' election Lease lives (the operator's default outside a pod)
OPERATOR_NAMESPACE = DEFAULT_NAMESPACE


@dataclass
class SimNode:
    """A node: its real kubelet (with the fake runtime), or none, and its agent on simulated
    NVML."""

    name: str
    gpus: str
    dir: Path
    kubelet: NodeKubelet | None
    agent_args: list[str]
    proc: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = None

    @property
    def plugin_socket(self) -> Path:
        """The agent's DRA socket."""
        if self.kubelet is not None:
            return self.kubelet.plugin_dir(DRIVER) / "dra.sock"
        return self.dir / "plugins" / "dra.sock"


@dataclass
class LocalCluster:
    """Owns the processes it starts; `stop()` ends all of them."""

    testbed: Testbed
    dir: Path
    nodes: dict[str, SimNode] = field(default_factory=dict)
    # flags added to every agent (e.g. shorter Lease timings for tests)
    agent_flags: list[str] = field(default_factory=list)
    # How a component starts: (its name, e.g. "operator" or "agent-NODE", and its migpart
    # arguments) -> the command line. Default: `python -m migpart.cli` of this interpreter;
    # tests/e2e/test_image.py runs the built image instead.
    launch: Callable[[str, list[str]], list[str]] | None = None
    _operator: tuple[subprocess.Popen[bytes], IO[bytes]] | None = None
    # the kubeconfig the operators use (default: the testbed's; the chaos harness puts a proxy
    # between them and the API server)
    operator_kubeconfig: Path | None = None
    # more operators (leader election: standbys), by name
    _operators: dict[str, tuple[subprocess.Popen[bytes], IO[bytes]]] = field(default_factory=dict)

    def install(self) -> None:
        """CRDs (waiting until Established), the DeviceClass and the operators' namespace
        (their election Lease); idempotent."""
        namespace = (
            f'{{"apiVersion":"v1","kind":"Namespace","metadata":{{"name":"{OPERATOR_NAMESPACE}"}}}}'
        )
        self.testbed.kubectl("apply", "-f", "-", input=namespace)
        self.testbed.kubectl("apply", "-f", str(CRDS))
        self.testbed.kubectl(
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            f"crd/gpupartitionpolicies.{GROUP}",
            f"crd/mignodes.{GROUP}",
        )
        self.testbed.kubectl("apply", "-f", str(DEVICE_CLASS))

    def _spawn(self, name: str, args: list[str]) -> tuple[subprocess.Popen[bytes], IO[bytes]]:
        logs = self.dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log = (logs / f"{name}.log").open("ab")
        env = {**os.environ, "KUBECONFIG": str(self.testbed.kubeconfig), "PYTHONUNBUFFERED": "1"}
        argv = (self.launch or _this_interpreter)(name, args)
        proc = subprocess.Popen(
            argv,
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
        labels: Mapping[str, str | None] | None = None,
        sim_latency_ms: float = 0.0,
        extra_args: tuple[str, ...] = (),
        kubelet: bool = True,
    ) -> SimNode:
        """A real kubelet that registers the Node (Ready, schedulable), then a
        `migpart agent --simulate` process whose DRA plugin registers with that kubelet
        (`extra_args` are appended to the agent's flags). With `kubelet=False` the Node is an
        API object only (`Testbed.add_node`) and no kubelet runs: for bench/chaos.py, which
        drives pods with its own light stand-in."""
        node_dir = self.dir / "nodes" / name
        node_dir.mkdir(parents=True, exist_ok=True)
        given = {"nvidia.com/mig.capable": "true", **(labels or {})}
        all_labels = opted_in(given)
        real: NodeKubelet | None = None
        if kubelet:
            real = NodeKubelet(self.testbed, name, node_dir / "k", all_labels)
            real.start()
            dirs = [
                "--plugin-dir",
                str(real.plugin_dir(DRIVER)),
                "--registration-dir",
                str(real.registration_dir),
                # the kubelet registers the plugin: the operator publishes only once it has
                "--report-registration",
            ]
        else:
            self.testbed.add_node(name, given)
            dirs = [
                "--plugin-dir",
                str(node_dir / "plugins"),
                "--registration-dir",
                str(node_dir / "registry"),
            ]
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
            *dirs,
            "--metrics-port",
            "0",
            *self.agent_flags,
            *extra_args,
        ]
        node = SimNode(name, gpus, node_dir, real, args)
        self.nodes[name] = node
        self.start_agent(name)
        return node

    def start_agent(self, name: str) -> None:
        """(Re)start the agent of a node (its checkpoint and CDI dir are kept)."""
        node = self.nodes[name]
        if node.proc is None or node.proc.poll() is not None:
            node.proc, node.log = self._spawn(f"agent-{name}", node.agent_args)

    def restart_agent(self, name: str) -> None:
        """Start the node's agent again with the flags it had."""
        self.start_agent(name)

    def kill_operator(self) -> None:
        """SIGKILL the operator (start it again with `start_operator`)."""
        if self._operator:
            _kill(self._operator[0])
            self._operator[1].close()
            self._operator = None

    def kill_agent(self, name: str) -> None:
        """SIGKILL the agent, as a crash would: no cleanup, its sockets stay behind."""
        node = self.nodes[name]
        if node.proc is not None and node.log is not None:
            _kill(node.proc)
            node.log.close()
        node.proc = node.log = None

    def stop_agent(self, name: str, grace_s: float = 10.0) -> None:
        node = self.nodes[name]
        if node.proc is not None and node.log is not None:
            terminate_all([(node.proc, node.log)], grace_s)
        node.proc = node.log = None

    def remove_gpu_node(self, name: str) -> None:
        """Stop the node's kubelet and agent and delete its Node; the garbage collector takes
        the MigNode and ResourceSlices the Node owns."""
        node = self.nodes.get(name)
        if node is not None:
            if node.kubelet is not None:
                node.kubelet.stop()
            self.stop_agent(name)
            del self.nodes[name]
        self.testbed.kubectl("delete", "node", name, "--ignore-not-found", "--wait=false")

    def start_operator(self, *extra: str) -> None:
        self._operator = self._spawn(
            "operator",
            [
                "operator",
                "--kubeconfig",
                str(self.operator_kubeconfig or self.testbed.kubeconfig),
                "--metrics-port",
                "0",
                *extra,
            ],
        )

    def stop_operator(self) -> None:
        if self._operator:
            _terminate(*self._operator)
            self._operator = None

    def spawn_operator(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        """Start one more operator (its log: logs/<name>.log), besides `start_operator`'s;
        `stop()` ends it, as does `end_operator`."""
        self.end_operator(name)
        self._operators[name] = self._spawn(
            name,
            [
                "operator",
                "--kubeconfig",
                str(self.operator_kubeconfig or self.testbed.kubeconfig),
                "--metrics-port",
                "0",
                *args,
            ],
        )
        return self._operators[name][0]

    def operators(self) -> dict[str, subprocess.Popen[bytes]]:
        """Every operator process running: `start_operator`'s as "operator", and those of
        `spawn_operator` by their names."""
        running = {name: proc for name, (proc, _) in self._operators.items()}
        if self._operator is not None:
            running["operator"] = self._operator[0]
        return running

    def end_operator(self, name: str, *, kill: bool = False) -> None:
        """SIGTERM (a clean exit: it releases its Lease) or SIGKILL an operator of
        `spawn_operator`."""
        spawned = self._operators.pop(name, None)
        if spawned is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(spawned[0].pid, signal.SIGCONT)  # a frozen one could not exit
        if kill:
            _kill(spawned[0])
            spawned[1].close()
        else:
            _terminate(*spawned)

    def check_alive(self) -> None:
        """Raise with the log tail of any component that died."""
        self.testbed.check_alive()
        for node in self.nodes.values():
            if node.kubelet is not None:
                node.kubelet.check_alive()
        procs = [(f"agent-{n.name}", n.proc) for n in self.nodes.values() if n.proc is not None]
        if self._operator:
            procs.append(("operator", self._operator[0]))
        procs += [(name, proc) for name, (proc, _) in self._operators.items()]
        for name, proc in procs:
            if proc.poll() is not None:
                log = self.dir / "logs" / f"{name}.log"
                raise RuntimeError(
                    f"{name} exited with {proc.returncode}; {log}:\n{log_tail(log, 25)}"
                )

    def wait_for(self, what: str, ready: Callable[[], bool], timeout_s: float = 90.0) -> None:
        """Poll `ready` until true; fail with `what` and the component state on timeout."""
        wait_until(what, ready, self.check_alive, timeout_s, TimeoutError)

    def stop(self) -> None:
        self.stop_operator()
        for name in list(self._operators):
            self.end_operator(name)
        for name in list(self.nodes):
            kubelet = self.nodes[name].kubelet
            if kubelet is not None:
                kubelet.stop()
            self.stop_agent(name)
        self.nodes.clear()


def _this_interpreter(_name: str, args: list[str]) -> list[str]:
    return [sys.executable, "-m", "migpart.cli", *args]


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _terminate(proc: subprocess.Popen[bytes], log: IO[bytes], grace_s: float = 10.0) -> None:
    terminate_all([(proc, log)], grace_s)

"""Run the testbed control plane: one process per component, all on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from migpart.api.selectors import MANAGED_LABEL
from migpart.errors import MigpartError
from migpart.slices.dra import now_iso
from migpart.testbed.build import build


def ready_node_status() -> dict[str, Any]:
    """The status of a Ready node with room for many pods, as a kubelet would report it (for
    Node objects that have no kubelet behind them)."""
    now = now_iso()
    resources = {"cpu": "128", "memory": "1Ti", "pods": "250"}
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "simulated node (no kubelet)",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    return {"capacity": resources, "allocatable": resources, "conditions": [ready]}


def terminate_all(
    procs: Sequence[tuple[subprocess.Popen[bytes], IO[bytes]]], grace_s: float = 10.0
) -> list[subprocess.Popen[bytes]]:
    """SIGTERM the process group of each process (in order), wait for all of them together
    up to `grace_s`, SIGKILL the groups still there, and close their logs. Returns the
    processes that had to be killed; each is named on stderr and at the end of its log."""
    for proc, _ in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    killed = []
    for proc, log in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            killed.append(proc)
            note = f"migpart: pid {proc.pid} did not stop within {grace_s:g} s of SIGTERM; killed"
            print(f"{note}: {_command(proc)}", file=sys.stderr, flush=True)
            with contextlib.suppress(OSError, ValueError):
                log.write(f"\n{note}\n".encode())
        log.close()
    return killed


def _command(proc: subprocess.Popen[bytes]) -> str:
    args = proc.args
    return " ".join(map(str, args)) if isinstance(args, (list, tuple)) else str(args)


class TestbedError(MigpartError):
    """A component of the control plane failed to start or died."""

    __test__ = False  # not a pytest test class


def log_tail(log: Path, lines: int = 15) -> str:
    """The last `lines` lines of a component's log, for the error that says it died."""
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def wait_until(
    what: str,
    ready: Callable[[], bool],
    check_alive: Callable[[], None],
    timeout_s: float,
    error: type[Exception] = TestbedError,
) -> None:
    """Poll `ready` until true, calling `check_alive` (it raises when a component died) between
    polls; raise `error` naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        check_alive()
        if time.monotonic() > deadline:
            raise error(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.2)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


KUBECONFIG_TEMPLATE = """apiVersion: v1
kind: Config
clusters:
- name: testbed
  cluster:
    server: {server}
    insecure-skip-tls-verify: true
users:
- name: admin
  user:
    token: {token}
contexts:
- name: testbed
  context: {{cluster: testbed, user: admin}}
current-context: testbed
"""


@dataclass
class Testbed:
    """etcd, kube-apiserver, kube-scheduler and kube-controller-manager on loopback.

    Use as a context manager (`with Testbed(dir).running() as tb:`) or call `start()` and
    `stop()`. `kubeconfig` exists only once the API server is ready.
    """

    __test__ = False  # not a pytest test class

    dir: Path
    port: int = 0
    binary: Path | None = None
    startup_timeout_s: float = 120.0
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    # Optional extras for benchmarks: more users (name -> bearer token, each in
    # system:masters, so that the API server's audit log can tell their requests apart) and
    # flags appended to a component's own (e.g. an audit policy, a scheduler's API QPS).
    users: dict[str, str] = field(default_factory=dict)
    apiserver_args: list[str] = field(default_factory=list)
    scheduler_args: list[str] = field(default_factory=list)
    # The secure (metrics, healthz) port of each component that has one, once started.
    ports: dict[str, int] = field(default_factory=dict)
    _procs: list[tuple[str, subprocess.Popen[bytes], IO[bytes]]] = field(default_factory=list)
    _args: dict[str, list[str]] = field(default_factory=dict)

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        """Run the testbed's own kubectl against this control plane; return stdout."""
        assert self.binary is not None
        proc = subprocess.run(
            [str(self.binary), "kubectl", "--kubeconfig", str(self.kubeconfig), *args],
            input=input,
            capture_output=True,
            text=True,
            check=False,
        )
        if check and proc.returncode != 0:
            raise TestbedError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout

    def kubeconfig_for(self, user: str, path: Path) -> Path:
        """Write a kubeconfig that authenticates as `user` (one of `users`) to `path`."""
        path.write_text(KUBECONFIG_TEMPLATE.format(server=self.server, token=self.users[user]))
        return path

    def pids(self) -> dict[str, int]:
        """The process id of each running component, by name (e.g. for CPU accounting)."""
        return {name: proc.pid for name, proc, _ in self._procs if proc.poll() is None}

    def add_node(self, name: str, labels: Mapping[str, str | None] | None = None) -> None:
        """Create a Ready Node with no kubelet behind it, schedulable (idempotent). It opts in
        to migpart (`migpart.io/managed=true`) unless `labels` gives that label None.

        The API server taints new Nodes `not-ready` and no node lifecycle controller runs
        here, so the taint is removed once the Ready condition is written.
        """
        label_lines = "".join(f"    {k}: {json.dumps(v)}\n" for k, v in opted_in(labels).items())
        self.kubectl(
            "apply",
            "-f",
            "-",
            input=(
                f"apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  labels:\n"
                f"    kubernetes.io/hostname: {name}\n{label_lines}"
            ),
        )
        status = {"status": ready_node_status()}
        self.kubectl(
            "patch", "node", name, "--subresource=status", "--type=merge", "-p", json.dumps(status)
        )
        self.kubectl("taint", "node", name, "node.kubernetes.io/not-ready-", check=False)

    @contextlib.contextmanager
    def running(self) -> Iterator[Testbed]:
        self.start()
        try:
            yield self
        finally:
            self.stop()

    def start(self) -> None:
        self.binary = self.binary or build()
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "logs").mkdir(exist_ok=True)
        self.kubeconfig.unlink(missing_ok=True)
        self.port = self.port or free_port()
        try:
            self._start_components()
        except BaseException:
            self.stop()
            raise

    def _start_components(self) -> None:
        d = self.dir
        etcd_port, peer_port = free_port(), free_port()
        sched_port, kcm_port = free_port(), free_port()
        self.ports = {
            "kube-apiserver": self.port,
            "kube-scheduler": sched_port,
            "kube-controller-manager": kcm_port,
        }
        sa_key = d / "sa.key"
        if not sa_key.exists():
            self._run_once("keygen", str(sa_key))
        users = {"admin": self.token, **self.users}
        (d / "tokens.csv").write_text(
            "".join(f'{token},{user},{user},"system:masters"\n' for user, token in users.items())
        )
        self._spawn(
            "etcd",
            [
                "--name",
                "testbed",
                "--data-dir",
                str(d / "etcd"),
                "--listen-client-urls",
                f"http://127.0.0.1:{etcd_port}",
                "--advertise-client-urls",
                f"http://127.0.0.1:{etcd_port}",
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer_port}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer_port}",
                "--initial-cluster",
                f"testbed=http://127.0.0.1:{peer_port}",
                "--unsafe-no-fsync",
                "--log-level",
                "warn",
            ],
        )
        self._spawn(
            "kube-apiserver",
            [
                f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                f"--secure-port={self.port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--cert-dir={d / 'certs'}",
                f"--token-auth-file={d / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={sa_key}",
                f"--service-account-signing-key-file={sa_key}",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--allow-privileged=true",
                "--runtime-config=resource.k8s.io/v1=true",
                # No kubelet creates default service accounts' tokens here; pods need none.
                "--disable-admission-plugins=ServiceAccount",
                "--endpoint-reconciler-type=none",
                "--v=1",
                *self.apiserver_args,
            ],
        )
        self._wait_ready(f"{self.server}/readyz", "kube-apiserver")
        kubeconfig = KUBECONFIG_TEMPLATE.format(server=self.server, token=self.token)
        partial = d / "kubeconfig.partial"
        partial.write_text(kubeconfig)
        control_kubeconfig = d / "control-plane.kubeconfig"
        control_kubeconfig.write_text(kubeconfig)
        self._spawn(
            "kube-scheduler",
            [
                f"--kubeconfig={control_kubeconfig}",
                "--leader-elect=false",
                f"--secure-port={sched_port}",
                "--bind-address=127.0.0.1",
                f"--authentication-kubeconfig={control_kubeconfig}",
                f"--authorization-kubeconfig={control_kubeconfig}",
                "--v=1",
                *self.scheduler_args,
            ],
        )
        self._spawn(
            "kube-controller-manager",
            [
                f"--kubeconfig={control_kubeconfig}",
                "--leader-elect=false",
                f"--secure-port={kcm_port}",
                "--bind-address=127.0.0.1",
                f"--authentication-kubeconfig={control_kubeconfig}",
                f"--authorization-kubeconfig={control_kubeconfig}",
                # There are no kubelets: node lifecycle would taint every Node unreachable.
                "--controllers=*,-node-lifecycle-controller,-serviceaccount-token-controller",
                f"--service-account-private-key-file={sa_key}",
                "--use-service-account-credentials=false",
                "--v=1",
            ],
        )
        self._wait_ready(f"https://127.0.0.1:{sched_port}/healthz", "kube-scheduler")
        self._wait_ready(f"https://127.0.0.1:{kcm_port}/healthz", "kube-controller-manager")
        partial.rename(self.kubeconfig)

    def _run_once(self, *args: str) -> None:
        assert self.binary is not None
        subprocess.run([str(self.binary), *args], check=True, capture_output=True)

    def restart(self, name: str, down_s: float = 0.0) -> None:
        """Kill one component (SIGKILL, as a crash), wait `down_s`, start it again with the
        same flags and data (etcd keeps its data dir) and wait until it is healthy."""
        (entry,) = [e for e in self._procs if e[0] == name]
        _, proc, log = entry
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()
        self._procs.remove(entry)
        time.sleep(down_s)
        self._spawn(name, self._args[name])
        if name != "kube-apiserver" and name in self.ports:
            self._wait_ready(f"https://127.0.0.1:{self.ports[name]}/healthz", name)
        self._wait_ready(f"{self.server}/readyz", "kube-apiserver")

    def _spawn(self, name: str, args: list[str]) -> None:
        assert self.binary is not None
        self._args[name] = args
        log = (self.dir / "logs" / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            [str(self.binary), name, *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._procs.append((name, proc, log))

    def check_alive(self) -> None:
        for name, proc, _ in self._procs:
            if proc.poll() is not None:
                log = self.dir / "logs" / f"{name}.log"
                raise TestbedError(
                    f"{name} exited with {proc.returncode}; log {log}:\n{log_tail(log)}"
                )

    def _wait_ready(self, url: str, name: str) -> None:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        deadline = time.monotonic() + self.startup_timeout_s
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {self.token}"})
        last = ""
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                with urllib.request.urlopen(request, context=ctx, timeout=5) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError) as exc:
                last = str(exc)
            time.sleep(0.2)
        raise TestbedError(f"{name} not ready at {url} after {self.startup_timeout_s}s: {last}")

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM every component but etcd (newest first), then etcd; SIGKILL what is left.
        etcd goes last: a kube-apiserver that loses it mid-shutdown keeps redialling it and
        outlives its grace."""
        last = [entry for entry in self._procs if entry[0] == "etcd"]
        first = [entry for entry in reversed(self._procs) if entry[0] != "etcd"]
        for stage in (first, last):
            terminate_all([(proc, log) for _, proc, log in stage], grace_s)
        self._procs.clear()


def opted_in(labels: Mapping[str, str | None] | None) -> dict[str, str]:
    """A test node's labels: `migpart.io/managed=true` (migpart manages it) and `labels`, where
    a label given None is left out (None for the managed label: a node that did not opt in)."""
    merged = {MANAGED_LABEL: "true", **(labels or {})}
    return {k: v for k, v in merged.items() if v is not None}

"""A real kubelet for a simulated node of the testbed, with a fake container runtime.

Each `NodeKubelet` runs two processes of the testbed binary:

- `testbed fake-cri`: k8s.io/cri-client's fake CRI on a unix socket. Containers "run" without
  a process; one whose env has `MIGPART_FAKE_RUN_SECONDS=N` exits with 0 after N seconds.
  Every CreateContainer call, with the CDI device ids the kubelet passed, is one JSON line of
  `created.jsonl` (`created_containers()` reads it).
- `testbed kubelet`: the real kubelet, in a private mount namespace of its own
  (`unshare --mount --propagation private`), so that several kubelets share one host:
  - `/proc/sys/vm/overcommit_memory` and `/proc/sys/kernel/panic` are bind-mounted over by
    files of the node's directory holding what the kubelet wants there (1 and 10), so it
    changes no host setting;
  - `/var/lib/kubelet/device-plugins`, which the kubelet uses whatever its `--root-dir`, is
    bind-mounted over by the node's own directory (or kubelets delete each other's socket);
  - the kubelet bind-mounts its root dir onto itself; the namespace takes that mount away
    when the kubelet ends.
  The only host state created outside the node's directory is the empty mount point
  `/var/lib/kubelet/device-plugins`. This needs root (or CAP_SYS_ADMIN).

The kubelet registers its Node (with the labels given), reports it Ready, and serves the
node's pods through the fake runtime; a DRA driver registers at `registration_dir` with its
DRA socket under `plugins_dir`. It authenticates with a ServiceAccount token bound to the
`system:node` ClusterRole. No node lifecycle controller runs on the testbed (kubelet-less
Nodes would all go unreachable), so the runner removes the `not-ready` taint the API server
puts on a new Node once the kubelet reports it Ready.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from migpart.testbed.run import (
    KUBECONFIG_TEMPLATE,
    Testbed,
    TestbedError,
    free_port,
    log_tail,
    terminate_all,
    wait_until,
)

DEVICE_PLUGINS_DIR = Path("/var/lib/kubelet/device-plugins")
RUN_SECONDS_ENV = "MIGPART_FAKE_RUN_SECONDS"
"""A container env var: the fake runtime ends the container (exit 0) this many seconds after
it started."""
SOCKET_PATH_MAX = 107  # sun_path is 108 bytes with its terminating NUL

# The kubelet's stand-ins for host files it would otherwise write (see the module docstring).
_MOUNT_SCRIPT = """set -e
mount --bind "$1/host/overcommit_memory" /proc/sys/vm/overcommit_memory
mount --bind "$1/host/panic" /proc/sys/kernel/panic
mount --bind "$1/device-plugins" {device_plugins}
shift
exec "$@"
"""

KUBELET_CONFIG = """apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz_port}
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
failCgroupV1: false
makeIPTablesUtilChains: false
containerRuntimeEndpoint: unix://{cri_socket}
volumePluginDir: {dir}/volume-plugins
podLogsDir: {dir}/pod-logs
resolvConf: ""
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
authorization:
  mode: AlwaysAllow
nodeStatusUpdateFrequency: 2s
nodeStatusReportFrequency: 10s
"""


@dataclass
class NodeKubelet:
    """The kubelet and fake runtime of one simulated node. `start()` returns once the Node is
    Ready and schedulable; `stop()` ends both; `stop_kubelet()` and `start_kubelet()` restart
    the kubelet alone (the runtime and its containers stay)."""

    testbed: Testbed
    name: str
    dir: Path
    labels: dict[str, str] = field(default_factory=dict)
    startup_timeout_s: float = 90.0
    _cri: tuple[subprocess.Popen[bytes], IO[bytes]] | None = None
    _kubelet: tuple[subprocess.Popen[bytes], IO[bytes]] | None = None

    @property
    def root_dir(self) -> Path:
        return self.dir / "root"

    @property
    def registration_dir(self) -> Path:
        """Where DRA drivers put their registration socket (the kubelet's plugins_registry)."""
        return self.root_dir / "plugins_registry"

    def plugin_dir(self, driver: str) -> Path:
        """Where a DRA driver puts its DRA service socket, by convention."""
        return self.root_dir / "plugins" / driver

    @property
    def cri_socket(self) -> Path:
        return self.dir / "cri.sock"

    @property
    def created_log(self) -> Path:
        return self.dir / "created.jsonl"

    def created_containers(self) -> list[dict[str, Any]]:
        """Every CreateContainer call the runtime got, oldest first: containerId, podNamespace,
        podName, podUid, container, attempt, cdiDevices (the ids the kubelet passed), envs."""
        if not self.created_log.exists():
            return []
        lines = self.created_log.read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def start(self) -> None:
        self._check_paths()
        for sub in ("host", "device-plugins", "logs", "container-logs", "root"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        (self.dir / "host" / "overcommit_memory").write_text("1\n")
        (self.dir / "host" / "panic").write_text("10\n")
        DEVICE_PLUGINS_DIR.mkdir(parents=True, exist_ok=True)
        self._credentials()
        try:
            self._start_cri()
            self.start_kubelet()
        except BaseException:
            self.stop()
            raise

    def _check_paths(self) -> None:
        longest = self.registration_dir / "mig.migpart.io-reg.sock"
        if len(str(longest)) > SOCKET_PATH_MAX:
            raise TestbedError(
                f"node dir {self.dir} is too long for the kubelet's unix sockets "
                f"({longest} has {len(str(longest))} characters, at most {SOCKET_PATH_MAX})"
            )

    def _credentials(self) -> None:
        """A ServiceAccount token bound to the ClusterRole system:node."""
        account = f"kubelet-{self.name}"
        manifest = {
            "apiVersion": "v1",
            "kind": "List",
            "items": [
                {
                    "apiVersion": "v1",
                    "kind": "ServiceAccount",
                    "metadata": {"name": account, "namespace": "kube-system"},
                },
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": account},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": "system:node",
                    },
                    "subjects": [
                        {"kind": "ServiceAccount", "name": account, "namespace": "kube-system"}
                    ],
                },
            ],
        }
        self.testbed.kubectl("apply", "-f", "-", input=json.dumps(manifest))
        token = self.testbed.kubectl(
            "create", "token", account, "-n", "kube-system", "--duration=48h"
        ).strip()
        (self.dir / "kubeconfig").write_text(
            KUBECONFIG_TEMPLATE.format(server=self.testbed.server, token=token)
        )

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Any:
        log = (self.dir / "logs" / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        return proc, log

    def _start_cri(self) -> None:
        assert self.testbed.binary is not None
        self.cri_socket.unlink(missing_ok=True)
        self._cri = self._spawn(
            "fake-cri",
            [
                str(self.testbed.binary),
                "fake-cri",
                "--listen",
                str(self.cri_socket),
                "--record",
                str(self.created_log),
            ],
        )
        self._wait("the fake CRI socket", self.cri_socket.exists)

    def start_kubelet(self) -> None:
        """Start the kubelet (again) and wait until its Node is Ready and schedulable."""
        assert self.testbed.binary is not None
        config = self.dir / "kubelet.yaml"
        healthz_port = free_port()
        config.write_text(
            KUBELET_CONFIG.format(
                port=free_port(),
                healthz_port=healthz_port,
                cri_socket=self.cri_socket,
                dir=self.dir,
            )
        )
        labels = {"kubernetes.io/hostname": self.name, **self.labels}
        script = _MOUNT_SCRIPT.format(device_plugins=DEVICE_PLUGINS_DIR)
        argv = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            script,
            "sh",
            str(self.dir),
            str(self.testbed.binary),
            "kubelet",
            f"--config={config}",
            f"--kubeconfig={self.dir / 'kubeconfig'}",
            f"--root-dir={self.root_dir}",
            f"--cert-dir={self.dir / 'pki'}",
            f"--hostname-override={self.name}",
            "--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
            "--v=2",
        ]
        env = {"MIGPART_CONTAINER_LOGS_DIR": str(self.dir / "container-logs")}
        self._kubelet = self._spawn("kubelet", argv, env)
        self._wait(f"kubelet of {self.name} healthy", lambda: _healthy(healthz_port))
        self._wait(f"Node {self.name} Ready", self._ready)
        self.testbed.kubectl(
            "taint", "node", self.name, "node.kubernetes.io/not-ready-", check=False
        )

    def _ready(self) -> bool:
        out = self.testbed.kubectl("get", "node", self.name, "-o", "json", check=False)
        if not out:
            return False
        for cond in (json.loads(out).get("status") or {}).get("conditions", []):
            if cond["type"] == "Ready" and cond["status"] == "True":
                return True
        return False

    def _wait(self, what: str, ready: Callable[[], bool]) -> None:
        wait_until(what, ready, self.check_alive, self.startup_timeout_s)

    def check_alive(self) -> None:
        for name, pair in (("fake-cri", self._cri), ("kubelet", self._kubelet)):
            if pair is not None and pair[0].poll() is not None:
                log = self.dir / "logs" / f"{name}.log"
                raise TestbedError(
                    f"{name} of {self.name} exited with {pair[0].returncode};"
                    f" log {log}:\n{log_tail(log)}"
                )

    def stop_kubelet(self, grace_s: float = 10.0) -> None:
        if self._kubelet is not None:
            terminate_all([self._kubelet], grace_s)
            self._kubelet = None

    def stop(self, grace_s: float = 10.0) -> None:
        self.stop_kubelet(grace_s)
        if self._cri is not None:
            terminate_all([self._cri], grace_s)
            self._cri = None

    def pids(self) -> dict[str, int]:
        return {
            name: pair[0].pid
            for name, pair in (("fake-cri", self._cri), ("kubelet", self._kubelet))
            if pair is not None and pair[0].poll() is None
        }


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False

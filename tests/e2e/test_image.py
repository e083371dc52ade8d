"""The built image on the testbed: the operator and one agent run from
dist/migpart-VERSION.oci.tar (`make image`, which `make test` runs first) instead of the
virtualenv, and a pod with a ResourceClaim gets served.

Each component runs with `buildah run` (chroot isolation, so the host's network, where the
testbed's API server listens on loopback) in a container of its own, made from the archive in a
storage of this module's own. What the manifests say is what runs: the image's entrypoint (the
manifests' `command`), its user for the operator (the Deployment's runAsUser) and root for the
agent (the DaemonSet's), the DaemonSet's environment (NODE_NAME from the node, the NVIDIA
variables) and its hostPath mounts: the kubelet plugin, plugin-registry and CDI directories,
and the state directory, each mounted at the path it has on the host as a hostPath is. (The
testbed's kubelets keep their roots under a temporary directory, so those paths are not
/var/lib/kubelet; the agent's directory flags name them, as the DaemonSet's name its mounts.)
Only NVML is simulated (`--simulate`) and the kubelet's container runtime is the testbed's fake.

Without the archive the test fails and says how to build it; it never skips.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import yaml

from migpart.demo.cluster import LocalCluster
from migpart.slices.dra import DRIVER
from tests.e2e.conftest import H100, InvariantMonitor, Scenario
from tests.testbeds import running_testbed

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
VERSION = metadata.version("migpart")
ARCHIVE = Path(
    os.environ.get("MIGPART_IMAGE_ARCHIVE") or ROOT / "dist" / f"migpart-{VERSION}.oci.tar"
)
# The agent's directory flags: each is a hostPath mount in the DaemonSet.
HOST_DIR_FLAGS = ("--plugin-dir", "--registration-dir", "--cdi-dir", "--state-dir")


def workload(name: str) -> dict[str, Any]:
    """The pod spec of the Deployment or DaemonSet in manifests/NAME.yaml."""
    for doc in yaml.safe_load_all((ROOT / "manifests" / f"{name}.yaml").read_text()):
        if doc["kind"] in ("Deployment", "DaemonSet"):
            spec: dict[str, Any] = doc["spec"]["template"]["spec"]
            return spec
    raise AssertionError(f"manifests/{name}.yaml has no workload")


class Image:
    """The archive, pulled into a buildah storage of its own (vfs: no overlay or fuse)."""

    def __init__(self, archive: Path, storage: Path) -> None:
        self.storage = storage
        self.flags = ["--root", str(storage / "root"), "--runroot", str(storage / "run")]
        self.flags += ["--storage-driver", "vfs"]
        self.id = self.buildah("pull", "--quiet", f"oci-archive:{archive}").strip()
        inspected = json.loads(self.buildah("inspect", "--type", "image", self.id))
        self.config: dict[str, Any] = inspected["OCIv1"]["config"]
        self.containers = 0

    def buildah(self, *args: str) -> str:
        proc = self.buildah_status(*args)
        if proc.returncode != 0:
            raise AssertionError(f"buildah {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def buildah_status(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["buildah", *self.flags, *args], capture_output=True, text=True, check=False
        )

    def run(self, user: str, *command: str) -> str:
        """Run a command in a fresh container of the image; its stdout."""
        container = self.container("check")
        return self.buildah(
            "run", "--isolation", "chroot", "--user", user, container, "--", *command
        )

    def container(self, name: str) -> str:
        self.containers += 1
        return self.buildah("from", "--name", f"{name}-{self.containers}", self.id).strip()

    def command(
        self, name: str, user: str, env: dict[str, str], mounts: list[str], args: list[str]
    ) -> list[str]:
        """The command line that runs the image's entrypoint with `args` in a new container."""
        argv = ["buildah", *self.flags, "run", "--isolation", "chroot", "--user", user]
        argv += [f"--env={k}={v}" for k, v in env.items()]
        argv += [f"--volume={m}" for m in mounts]
        return [*argv, self.container(name), "--", *self.config["Entrypoint"], *args]

    def remove(self) -> None:
        self.buildah("rm", "--all")
        self.buildah("rmi", "--all", "--force")


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Image]:
    if not ARCHIVE.is_file():
        pytest.fail(
            f"the image archive {ARCHIVE} is missing: build it with `make image` (`make test` "
            "and `make e2e` do), or point $MIGPART_IMAGE_ARCHIVE at one",
            pytrace=False,
        )
    if shutil.which("buildah") is None:
        pytest.fail("buildah is not installed: `make image` installs it", pytrace=False)
    storage = tmp_path_factory.mktemp("containers")
    built = Image(ARCHIVE, storage)
    try:
        yield built
    finally:
        built.remove()
        shutil.rmtree(storage, ignore_errors=True)


class Launcher:
    """LocalCluster's `launch`: the operator and the agents from the image, as the manifests
    run them."""

    def __init__(self, image: Image, kubeconfig: Path) -> None:
        self.image = image
        self.kubeconfig = kubeconfig
        self.operator = workload("operator")
        self.agent = workload("agent")

    def __call__(self, name: str, args: list[str]) -> list[str]:
        args = [self.kubeconfig_flag(a) for a in args]
        if args[0] == "operator":
            context = self.operator["securityContext"]
            user = f"{context['runAsUser']}:{context['runAsGroup']}"
            return self.image.command(
                name, user, {}, [f"{self.kubeconfig}:{self.kubeconfig}:ro"], args
            )
        (container,) = self.agent["containers"]
        node = args[args.index("--node-name") + 1]
        del args[args.index("--node-name") : args.index("--node-name") + 2]
        env = {}
        for var in container["env"]:  # the DaemonSet's: NODE_NAME from the pod's node
            if "value" in var:
                env[var["name"]] = var["value"]
            else:
                assert var["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
                env[var["name"]] = node
        mounts = [f"{self.kubeconfig}:{self.kubeconfig}:ro"]
        for flag in HOST_DIR_FLAGS:
            path = Path(args[args.index(flag) + 1])
            path.mkdir(parents=True, exist_ok=True)  # DirectoryOrCreate
            mounts.append(f"{path}:{path}")
        user = str(container["securityContext"]["runAsUser"])
        return self.image.command(name, f"{user}:{user}", env, mounts, args)

    def kubeconfig_flag(self, arg: str) -> str:
        return str(self.kubeconfig) if arg.endswith("/kubeconfig") else arg


@pytest.fixture(scope="module")
def image_cluster(image: Image, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A testbed of this module's own (the suite's runs the venv's operator), with the
    operator from the image."""
    with running_testbed(tmp_path_factory) as bed:
        # the operator runs as 65532: a copy it can read (pytest's temp dirs are 0700)
        shared = tmp_path_factory.mktemp("image-kubeconfig")
        shared.chmod(0o755)
        kubeconfig = shared / "kubeconfig"
        shutil.copyfile(bed.kubeconfig, kubeconfig)
        kubeconfig.chmod(0o644)
        cluster = LocalCluster(
            bed, tmp_path_factory.mktemp("image"), launch=Launcher(image, kubeconfig)
        )
        cluster.install()
        cluster.start_operator()
        try:
            yield cluster
        finally:
            cluster.stop()


def test_the_image_is_what_the_manifests_run(image: Image) -> None:
    config = image.config
    (operator,) = workload("operator")["containers"]
    (agent,) = workload("agent")["containers"]
    assert config["Entrypoint"] == operator["command"] == agent["command"] == ["migpart"]
    context = workload("operator")["securityContext"]
    assert config["User"] == f"{context['runAsUser']}:{context['runAsGroup']}"
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == VERSION
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    revision = labels["org.opencontainers.image.revision"]
    assert revision
    out = image.run(config["User"], "migpart", "--version")
    assert out.strip() == f"migpart {VERSION}" + (
        "" if revision == "unknown" else f" (revision {revision})"
    )


@pytest.mark.parametrize("command", [["demo"], ["testbed", "build"]], ids=" ".join)
def test_what_needs_a_checkout_says_so_in_the_image(image: Image, command: list[str]) -> None:
    container = image.container("checkout")
    argv = ["run", "--isolation", "chroot", "--user", image.config["User"], container]
    proc = image.buildah_status(*argv, "--", *image.config["Entrypoint"], *command)
    lines = proc.stderr.splitlines()
    needs = f"migpart {command[0]}: needs a checkout of the migpart repository"
    assert [line for line in lines if line.startswith(needs)] == [lines[0]], proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_image_has_no_build_tools(image: Image) -> None:
    """No pip, setuptools, wheel or code generator importable by migpart's interpreter, and no
    pip, compiler or make on the PATH."""
    script = (
        "import importlib.util, shutil\n"
        "modules = ('pip', 'setuptools', 'wheel', 'grpc_tools')\n"
        "tools = ('pip', 'pip3', 'gcc', 'cc', 'c++', 'make')\n"
        "print([m for m in modules if importlib.util.find_spec(m)]"
        " + [t for t in tools if shutil.which(t)])"
    )
    assert image.run("0:0", "/opt/migpart/bin/python", "-c", script).strip() == "[]"


def test_a_pod_is_served_by_the_operator_and_agent_from_the_image(
    image_cluster: LocalCluster,
) -> None:
    testbed = image_cluster.testbed
    testbed.kubectl("create", "namespace", "image")
    monitor = InvariantMonitor(testbed)
    monitor.start()
    scenario = Scenario(image_cluster, "image", "image", monitor)
    try:
        node = scenario.add_node(f"{H100}:1")
        scenario.policy()
        scenario.pod("served", f'device.attributes["{DRIVER}"].profile == "3g.40gb"')
        devices = scenario.wait_served("served")
        assert [(d["driver"], d["pool"]) for d in devices] == [(DRIVER, node)]
        assert devices[0]["device"].startswith("gpu-0-3g40gb")
        assert scenario.phase("served") == "Running"
    finally:
        monitor.stop_event.set()
        monitor.join()
        scenario.cleanup()
    assert monitor.violations == []

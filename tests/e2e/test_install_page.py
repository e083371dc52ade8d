"""docs/install.md, run on the testbed: every command block of the page, and what it prints.

The page's convention, which this module reads:

- a ```bash block holds commands; a ```text block after it (before the next block) is what they
  print, trimmed: its lines must appear, in order, among the output's lines (`…` alone on a line
  marks a cut; inside a line it stands for any text);
- a ```bash block whose paragraph above starts with "Undo" undoes its step;
- no other fenced block.

The test runs the steps' blocks in page order, then the Undo blocks from the last to the first
(as the page's "Uninstall" says), each command with bash in the repository's root against a
control plane of this module's own, with the testbed's kubectl and the tools' helm. Every block
is either run or listed in NOT_RUN with the reason, so that a new block cannot go untested.

The testbed is a cluster as the page assumes one, with these stand-ins:

- one node, `gpu-node-1`: a real kubelet with the testbed's fake container runtime, labelled
  `nvidia.com/gpu.present=true` (GPU Feature Discovery's label), and the RuntimeClass `nvidia`
  (the NVIDIA Container Toolkit's);
- the fake runtime runs no process, so a pod's process is started beside it (STAND_INS): when
  the Deployment's pods run, `migpart operator` with the first pod's arguments, under the pod's
  name as its hostname (the election's identity) and namespace; when the DaemonSet puts a pod on
  the node, `migpart agent` with that pod's arguments on 8 simulated H100s; each is stopped
  when its pod goes. Their metrics ports are free ports, not the chart's;
- SUBSTITUTED lists the text of commands changed here, each with why.

Outputs are compared after NORMALISED replaces what differs from run to run (ages, generated
names, ids, IPs, versions) by `…`, on both sides.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from migpart.demo.cluster import LocalCluster, SimNode
from migpart.slices.dra import DRIVER
from migpart.testbed import Testbed
from migpart.testbed.kubelet import RUN_SECONDS_ENV, NodeKubelet
from tests.testbeds import running_testbed
from tests.tools import ROOT, tool

pytestmark = pytest.mark.e2e

PAGE = ROOT / "docs" / "install.md"
NODE = "gpu-node-1"
GPUS = "NVIDIA H100 80GB HBM3:8"
NAMESPACE = "migpart-system"
SAMPLE_PODS = "manifests/samples/claim-template.yaml"
# how long a block that only reads (get, wait) is run again until it prints what the page says,
# as a reader runs it again while things settle
SETTLE_S = 90.0

# Blocks not run here, by their first command, and why.
NOT_RUN = {
    "make image": (
        "no registry here, and the fake runtime pulls no image, so the chart may name any; "
        "tests/e2e/test_image.py runs the image `make image` builds"
    ),
    "skopeo copy oci-archive:dist/migpart-0.1.0.oci.tar "
    "docker://registry.example.com/platform/migpart:0.1.0": "no registry here",
    "kubectl logs mig-inference": (
        "the fake runtime runs no process and keeps no log; served_the_pod checks the CDI "
        "device the container got instead"
    ),
    "sudo nvidia-smi mig -dci && sudo nvidia-smi mig -dgi": (
        "needs a GPU: the testbed's GPUs are the agent's simulated NVML"
    ),
}

# (pattern, replacement, why) on both the page's and the actual output, after runs of
# whitespace became one space.
NORMALISED = [
    (r"\d{4}-\d\d-\d\dT[\d:.]+Z", "…", "timestamps"),
    (r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "…", "UUIDs"),
    # generateName suffixes and ReplicaSet hashes (Kubernetes' alphabet has no vowel)
    (r"(?<=-)[bcdfghjklmnpqrstvwxz2456789]{5,10}(?=$|[\s_/\"'-])", "…", "generated names"),
    (r"(?<![0-9a-zA-Z])[0-9a-f]{10,}(?![0-9a-zA-Z])", "…", "plan ids, election identities"),
    (r"(?<![\w.])(?:\d+[dhms]){1,3}(?![\w.])", "…", "ages"),
    # READY and RESTARTS of a pod (the page shows a cluster's): no testbed pod becomes Ready,
    # since the kubelet probes the fake runtime's pod IP 192.168.192.168, where no migpart
    # process listens, and the kubelet restarts them for their liveness probe
    (r"\b\d+/\d+ (\S+) \d+(?: \([^)]*\))?", r"… \1 …", "readiness"),
    (r"\b\d{1,3}(?:\.\d{1,3}){3}\b", "…", "pod IPs"),
    (r"\bv1\.\d+\.\d+\b", "v1.…", "Kubernetes versions: the test runs on 1.34.4 and 1.37.2"),
]


@dataclass
class Block:
    line: int  # in the page, 1-based, of the opening fence
    commands: list[str]  # backslash continuations joined, comments dropped
    undo: bool
    prints: list[str] = field(default_factory=list)

    @property
    def first(self) -> str:
        return self.commands[0] if self.commands else ""

    def where(self) -> str:
        return f"docs/install.md:{self.line} ({self.first})"


def blocks(text: str) -> list[Block]:
    """The page's bash blocks with what they print."""
    found: list[Block] = []
    lines = text.splitlines()
    paragraph = ""  # the first line of the last paragraph since the last block
    in_paragraph = False
    i = 0
    while i < len(lines):
        opening = re.match(r"```(\S*)", lines[i])
        if not opening:
            if lines[i].strip() and not in_paragraph:
                paragraph = lines[i]
            in_paragraph = bool(lines[i].strip())
            i += 1
            continue
        end = lines.index("```", i + 1)
        kind, body = opening.group(1), lines[i + 1 : end]
        if kind == "bash":
            found.append(Block(i + 1, commands_of(body), undo=paragraph.startswith("Undo")))
        elif kind == "text":
            if not found or found[-1].prints:
                raise AssertionError(f"line {i + 1}: a text block that follows no bash block")
            found[-1].prints = body
        else:
            raise AssertionError(f"line {i + 1}: a ```{kind} block; the page has bash and text")
        paragraph, in_paragraph = "", False
        i = end + 1
    return found


def commands_of(body: list[str]) -> list[str]:
    joined = re.sub(r"\\\n\s*", "", "\n".join(body))
    return [c.strip() for c in joined.splitlines() if c.strip() and not c.lstrip().startswith("#")]


def normalised(line: str) -> str:
    line = " ".join(line.split())
    for pattern, replacement, _why in NORMALISED:
        line = re.sub(pattern, replacement, line)
    return line


def missing_lines(expected: list[str], output: str) -> list[str]:
    """The page's lines that do not appear, in order, among the output's; [] when all do."""
    actual = [normalised(line) for line in output.splitlines()]
    at = 0
    for line in (normalised(e) for e in expected):
        if line in ("", "…"):
            continue
        pattern = re.compile(".*".join(re.escape(part) for part in line.split("…")))
        while at < len(actual) and not pattern.fullmatch(actual[at]):
            at += 1
        if at == len(actual):
            return [line]
        at += 1
    return []


def read_only(command: str) -> bool:
    return bool(re.match(r"kubectl (-n \S+ )?(get|wait|describe|version)\b", command))


class InstallPage:
    """The testbed, the node, and the stand-ins for what the fake runtime does not run."""

    def __init__(self, bed: Testbed, base: Path) -> None:
        self.bed = bed
        self.base = base
        self.cluster = LocalCluster(bed, base, launch=self.launch)
        self.node_dir = base / "nodes" / NODE
        self.operator_pod = ""
        # the patterns of STAND_INS, CHECKS and substitutions that met a command
        self.fired: set[str] = set()
        bin_dir = base / "bin"
        bin_dir.mkdir()
        kubectl = bin_dir / "kubectl"
        kubectl.write_text(f'#!/bin/sh\nexec {bed.binary} kubectl "$@"\n')
        kubectl.chmod(0o755)
        (bin_dir / "helm").symlink_to(tool("helm"))
        self.env = {
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "KUBECONFIG": str(bed.kubeconfig),
            **{
                f"HELM_{d}_HOME": str(base / "helm" / d.lower())
                for d in ("CACHE", "CONFIG", "DATA")
            },
        }
        self.sample_pods = base / "claim-template.yaml"
        self.substituted: list[tuple[str, str, str]] = []

    def start(self) -> None:
        labels = {"nvidia.com/gpu.present": "true", "nvidia.com/mig.capable": "true"}
        kubelet = NodeKubelet(self.bed, NODE, self.node_dir / "k", labels)
        self.cluster.nodes[NODE] = SimNode(NODE, GPUS, self.node_dir, kubelet, [])
        kubelet.start()
        self.wait_for(
            "the node's Lease",
            lambda: bool(
                self.bed.kubectl("get", "lease", NODE, "-n", "kube-node-lease", check=False)
            ),
        )
        runtime_class = {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": "nvidia"},
            "handler": "nvidia",
        }
        self.bed.kubectl("apply", "-f", "-", input=json.dumps(runtime_class))
        root = kubelet.root_dir
        self.substituted = [
            (
                "--set image.repository=registry.example.com/platform/migpart",
                "--set image.repository=registry.example.com/platform/migpart"
                f" --set agent.kubeletRootDir={root} --set agent.stateDir={self.node_dir}/state"
                f" --set agent.cdiDir={self.node_dir}/cdi",
                "the testbed's kubelet has its root in a temporary directory; the agent's state "
                "and CDI directories go there too rather than into the host's /var",
            ),
            (
                SAMPLE_PODS,
                str(self.sample_pods),
                f"a copy whose container ends after 1 s ({RUN_SECONDS_ENV}), as `nvidia-smi -L` "
                "does: the fake runtime runs a container until told how long",
            ),
        ]
        docs = list(yaml.safe_load_all((ROOT / SAMPLE_PODS).read_text()))
        for doc in docs:
            if doc["kind"] == "Pod":
                for container in doc["spec"]["containers"]:
                    container["env"] = [{"name": RUN_SECONDS_ENV, "value": "1"}]
        self.sample_pods.write_text(yaml.safe_dump_all(docs))

    def launch(self, name: str, args: list[str]) -> list[str]:
        """How LocalCluster starts a component: the operator as its pod would run it (hostname
        and namespace), on a free metrics port (the last flag wins)."""
        python = [sys.executable, "-m", "migpart.cli", *args, "--metrics-port", "0"]
        if name != "operator":
            return python
        as_pod = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', self.operator_pod]
        return ["env", f"POD_NAMESPACE={NAMESPACE}", *as_pod, *python]

    # ------------------------------------------------------------------ running the page

    def run(self, block: Block) -> None:
        """Run the block's commands. While what they print lacks a line of the page's, run the
        reading commands at its end again, as a reader runs `kubectl get` again while things
        settle; those may fail meanwhile (a MigNode not there yet), no other command may."""
        tail = len(block.commands)
        while tail and read_only(block.commands[tail - 1]):
            tail -= 1
        settles = bool(block.prints) and tail < len(block.commands)
        outputs: list[str] = []
        for n, command in enumerate(block.commands):
            outputs.append(self.shell(command, block, may_fail=settles and n >= tail))
            for pattern, stand_in in STAND_INS:
                if re.search(pattern, command):
                    self.fired.add(pattern)
                    stand_in(self)
        deadline = time.monotonic() + SETTLE_S
        while missing := missing_lines(block.prints, "".join(outputs)):
            if not settles or time.monotonic() > deadline:
                printed = "".join(outputs)
                raise AssertionError(
                    f"{block.where()}: no line {missing!r}; it printed:\n{printed}"
                )
            self.cluster.check_alive()
            time.sleep(1)
            outputs[tail:] = [self.shell(c, block, may_fail=True) for c in block.commands[tail:]]
        for pattern, check in CHECKS:
            if any(re.search(pattern, c) for c in block.commands):
                self.fired.add(pattern)
                check(self)

    def shell(self, command: str, block: Block, may_fail: bool) -> str:
        """What the command prints (stdout and stderr, in order), run as the page says but for
        SUBSTITUTED."""
        for old, new, _why in self.substituted:
            if old in command:
                self.fired.add(old)
                command = command.replace(old, new)
        proc = subprocess.run(
            ["bash", "-o", "pipefail", "-c", command],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=240,
            check=False,
        )
        if proc.returncode != 0 and not may_fail:
            raise AssertionError(
                f"{block.where()}: `{command}` exited {proc.returncode}:\n{proc.stdout}"
            )
        return proc.stdout

    def get(self, *args: str) -> Any:
        return json.loads(self.bed.kubectl("get", *args, "-o", "json"))

    def pods(self, component: str) -> list[dict[str, Any]]:
        selector = f"app.kubernetes.io/component={component}"
        return list(self.get("pods", "-n", NAMESPACE, "-l", selector)["items"])

    def wait_for(self, what: str, ready: Callable[[], bool]) -> None:
        self.cluster.wait_for(what, ready, timeout_s=SETTLE_S)

    # ------------------------------------------------------------------ stand-ins

    def operator_pods_run(self) -> None:
        """The Deployment's pods are scheduled and started: run the first one's process."""
        self.wait_for("the operator's pods", lambda: len(self.pods("operator")) == 2)
        pod = sorted(self.pods("operator"), key=lambda p: p["metadata"]["name"])[0]
        self.operator_pod = pod["metadata"]["name"]
        (container,) = pod["spec"]["containers"]
        assert container["args"][0] == "operator"
        self.cluster.start_operator(*container["args"][1:])

    def agent_pod_runs(self) -> None:
        """The DaemonSet puts its pod on the labelled node: run its process there."""
        on_node = self.agent_pods
        self.wait_for(f"the DaemonSet's pod on {NODE}", lambda: bool(on_node()))
        (container,) = on_node()[0]["spec"]["containers"]
        assert container["args"][0] == "agent"
        node = self.cluster.nodes[NODE]
        node.agent_args = [
            *container["args"],
            *("--simulate", GPUS, "--node-name", NODE, "--kubeconfig", str(self.bed.kubeconfig)),
        ]
        self.cluster.start_agent(NODE)

    def agent_pods(self) -> list[dict[str, Any]]:
        return [p for p in self.pods("agent") if p["spec"].get("nodeName") == NODE]

    def agent_pod_ends(self) -> None:
        """The node lost its label: the DaemonSet deletes the pod, the kubelet stops it."""
        self.cluster.stop_agent(NODE)

    def operator_pods_end(self) -> None:
        self.cluster.stop_operator()

    # ------------------------------------------------------------------ checks

    def instances(self) -> list[tuple[str, str]]:
        gpus = (self.get("mignode", NODE).get("status") or {}).get("gpus", [])
        return [(i["profile"], i["state"]) for g in gpus for i in g.get("instances", [])]

    def dry_run_changed_nothing(self) -> None:
        """DryRun planned (the event the block showed) and changed nothing: no MigNode spec,
        no instance, the pod unbound."""
        assert not (self.get("mignode", NODE).get("spec") or {}).get("gpus")
        assert self.instances() == []
        assert not self.get("pod", "mig-inference", "-n", "default")["spec"].get("nodeName")

    def served_the_pod(self) -> None:
        """Active created a 3g.40gb, the pod's container got it as its CDI device, and the
        instance is free again once the pod ended."""
        pod = self.get("pod", "mig-inference", "-n", "default")
        assert pod["spec"]["nodeName"] == NODE
        kubelet = self.cluster.nodes[NODE].kubelet
        assert kubelet is not None
        created = [c for c in kubelet.created_containers() if c["podUid"] == pod["metadata"]["uid"]]
        assert [c["container"] for c in created] == ["main"]
        (device,) = created[0]["cdiDevices"]
        assert re.fullmatch(rf"{re.escape(DRIVER)}/mig=.+-gpu-\d+-3g40gb-\d+", device), device
        assert self.instances() == [("3g.40gb", "Free")]

    def inventory(self) -> set[str]:
        """Every object of the kinds the page creates, namespaced or not."""
        kinds = (
            "namespaces,customresourcedefinitions,deviceclasses,clusterroles,clusterrolebindings,"
            "roles,rolebindings,leases,validatingadmissionpolicies,"
            "validatingadmissionpolicybindings,resourceslices,resourceclaims,"
            "resourceclaimtemplates,pods,serviceaccounts,services,configmaps,secrets,"
            "networkpolicies,poddisruptionbudgets,daemonsets,deployments,replicasets"
        )
        columns = "custom-columns=KIND:.kind,NS:.metadata.namespace,NAME:.metadata.name"
        out = self.bed.kubectl("get", kinds, "-A", "--no-headers", "-o", columns)
        return {" ".join(line.split()) for line in out.splitlines()}

    def state_on_node(self) -> tuple[dict[str, Any], list[str]]:
        state = self.node_dir / "state" / "checkpoint.json"
        claims = json.loads(state.read_text())["claims"] if state.exists() else {}
        return claims, sorted(p.name for p in (self.node_dir / "cdi").glob(f"{DRIVER}-*"))


# After a command that matches: what its pods' processes do.
STAND_INS: list[tuple[str, Callable[[InstallPage], None]]] = [
    (r"^helm install ", InstallPage.operator_pods_run),
    (rf"^kubectl label node {NODE} migpart\.io/managed=true$", InstallPage.agent_pod_runs),
    (rf"^kubectl label node {NODE} migpart\.io/managed-$", InstallPage.agent_pod_ends),
    (r"^helm uninstall ", InstallPage.operator_pods_end),
]
# After a block with a command that matches has printed what the page says.
CHECKS: list[tuple[str, Callable[[InstallPage], None]]] = [
    (r"reason=DryRunPlan", InstallPage.dry_run_changed_nothing),
    (r"Succeeded pod/mig-inference", InstallPage.served_the_pod),
]


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InstallPage]:
    """A control plane of its own: the page installs migpart's CRDs and DeviceClass, which the
    other e2e tests share, and removes them."""
    with running_testbed(tmp_path_factory) as bed:
        # a short directory: kubelet's plugin sockets live below it (107-byte limit)
        installed = InstallPage(bed, tmp_path_factory.mktemp("ip"))
        try:
            installed.start()
            yield installed
        finally:
            installed.cluster.stop()


def test_every_block_is_run_or_excused() -> None:
    found = blocks(PAGE.read_text())
    firsts = [b.first for b in found]
    assert [b.where() for b in found if not b.commands] == []
    assert sorted(set(NOT_RUN) - set(firsts)) == [], "NOT_RUN names blocks the page lacks"
    assert len(set(firsts)) == len(firsts), "two blocks start alike: NOT_RUN could not tell"
    assert len(PAGE.read_text().splitlines()) < 300


def test_the_install_page_on_the_testbed(page: InstallPage) -> None:
    found = blocks(PAGE.read_text())
    runnable = [b for b in found if b.first not in NOT_RUN]
    before = page.inventory()
    for block in [b for b in runnable if not b.undo]:
        page.run(block)
    for block in reversed([b for b in runnable if b.undo]):
        page.run(block)
    expected = (
        {p for p, _ in STAND_INS} | {p for p, _ in CHECKS} | {o for o, _, _ in page.substituted}
    )
    assert expected - page.fired == set(), "no command of the page met these"

    # What is left is what was there before, but the MIG instance on the GPU (the simulator's
    # NVML, as the agent left it): no object, no label, no prepared claim, no CDI spec.
    deadline = time.monotonic() + SETTLE_S
    while (changed := page.inventory() ^ before) and time.monotonic() < deadline:
        time.sleep(1)
    assert changed == set(), "objects left or gone"
    assert "migpart.io/managed" not in page.get("node", NODE)["metadata"]["labels"]
    assert page.state_on_node() == ({}, [])
    nvml = json.loads((page.node_dir / "state" / "simulated-nvml.json").read_text())
    assert [i["profile"] for gpu in nvml.values() for i in gpu] == ["3g.40gb"]

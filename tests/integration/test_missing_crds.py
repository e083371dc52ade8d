"""`migpart agent` and `migpart operator` started before migpart's CRDs are served (a DaemonSet
and a Deployment applied together with the CRDs): neither dies, each says once which resource
it waits for, stays unready, and starts working once the CRDs are applied.

This module runs its own control plane: the suite's shared one has the CRDs applied.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from migpart.api.models import GROUP, VERSION
from migpart.slices.dra import DRIVER
from migpart.testbed import Testbed
from migpart.testbed.run import free_port
from tests.integration.conftest import H100, ROOT, eventually, get_or_none, policy_body
from tests.stopping import stop_process
from tests.testbeds import running_testbed

pytestmark = pytest.mark.integration

NODE = "crd-late"


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    """A control plane without migpart's CRDs."""
    with running_testbed(tmp_path_factory) as bed:
        yield bed


class Process:
    """A migpart command in its own process, its output in a file."""

    def __init__(self, bed: Testbed, log: Path, *args: str) -> None:
        self.log_path = log
        self.what = f"migpart {args[0]}"
        self._log: IO[bytes] = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "migpart.cli", *args, "--kubeconfig", str(bed.kubeconfig)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def events(self, name: str) -> list[dict[str, Any]]:
        """The JSON log lines with event `name`."""
        out = []
        for line in self.log_path.read_text().splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                if record.get("event") == name:
                    out.append(record)
        return out

    def stop(self) -> int:
        try:
            return stop_process(self.proc, self.what)
        finally:
            self._log.close()


def ready(port: int) -> int:
    """The HTTP status of /readyz."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as err:
        return err.code


def test_agent_and_operator_wait_for_their_crds(bare: Testbed, tmp_path: Path) -> None:
    bare.add_node(NODE, {"migpart-test": "crd-late"})
    # the operator's namespace, where its election Lease is (the manifests make it)
    bare.kubectl("create", "namespace", "migpart-system")
    agent_port, operator_port = free_port(), free_port()
    agent = Process(
        bare,
        tmp_path / "agent.log",
        "agent",
        "--node-name",
        NODE,
        "--simulate",
        f"{H100}:1",
        "--no-kubelet-plugin",
        "--state-dir",
        str(tmp_path / "state"),
        "--cdi-dir",
        str(tmp_path / "cdi"),
        "--metrics-port",
        str(agent_port),
        "--lease-renew-seconds",
        "1",
    )
    operator = Process(
        bare,
        tmp_path / "operator.log",
        "operator",
        "--metrics-port",
        str(operator_port),
        "--log-json",
        "--tick-seconds",
        "0.2",
    )
    try:
        for process in (agent, operator):
            told = eventually(lambda p=process: p.events("resource_not_served"))  # type: ignore[misc]
            assert f"mignodes.{GROUP}/{VERSION}" in json.dumps(told[0])
            assert told[0]["retry"].startswith("with back-off")
        time.sleep(4)  # a few retries later: still alive, still unready, told only once
        assert agent.proc.poll() is None, agent.log_path.read_text()[-3000:]
        assert operator.proc.poll() is None, operator.log_path.read_text()[-3000:]
        assert ready(agent_port) == 503
        assert ready(operator_port) == 503
        assert len(agent.events("resource_not_served")) == 1
        assert len(operator.events("resource_not_served")) == 1

        for crd in sorted((ROOT / "crds").glob("*.yaml")):
            bare.kubectl("apply", "--server-side", "-f", str(crd))
        eventually(lambda: ready(agent_port) == 200 and ready(operator_port) == 200)
        assert agent.events("resource_served")
        assert operator.events("resources_served")

        # and they work: a policy's spare is cut by the agent and published by the operator
        bare.kubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps(
                policy_body(
                    "crd-late",
                    {"migpart-test": "crd-late"},
                    spares=[{"profile": "1g.10gb", "count": 1}],
                    reconfiguration={"batchWindowSeconds": 0},
                )
            ),
        )

        def published() -> bool:
            got = get_or_none(bare, "resourceslice", f"{NODE}-{DRIVER}")
            assert got is not None
            names = [d["name"] for d in got["spec"].get("devices") or []]
            assert any("1g10gb" in n for n in names), names
            return True

        eventually(published, timeout=120)
        assert agent.proc.poll() is None
        assert operator.proc.poll() is None
    finally:
        codes = (agent.stop(), operator.stop())
        for process in (agent, operator):  # shown by pytest when the test failed
            print(process.log_path.read_text()[-6000:])
    assert codes[0] == 0, agent.log_path.read_text()[-3000:]

"""Leader election and the fence, end to end: real operator processes elect a leader through
the Lease `migpart-operator`, only the leader writes, a standby takes over from a killed or
frozen leader, a frozen leader that wakes up writes nothing, and an agent refuses a spec from an
older leadership.

Who wrote what is read from the API server: each operator's requests carry its identity in the
user agent, so `managedFields[].manager` of a MigNode or slice names the operator that wrote it
(`migpart-operator-<identity>`).
"""

from __future__ import annotations

import calendar
import itertools
import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from migpart.demo.cluster import OPERATOR_NAMESPACE, LocalCluster
from migpart.kube.election import MANAGER_PREFIX
from migpart.mig import device_name
from migpart.slices.dra import DRIVER
from migpart.testing.builders import profile_is
from tests.e2e.conftest import H100, LEASE_TIMEOUT_S, Scenario, wait_s
from tests.e2e.helpers import one_free_whole_gpu

pytestmark = pytest.mark.e2e
MANAGER = MANAGER_PREFIX
# the destroy protocol's grace: long enough to freeze the leader inside its destroy window
GRACE_S = 6
_pairs = itertools.count(1)


@dataclass
class Pair:
    """Two operators started together, named `a…` and `b…` (their election identities)."""

    cluster: LocalCluster
    names: tuple[str, str]

    def holder(self) -> str:
        out = self.cluster.testbed.kubectl(
            "get", "lease", "migpart-operator", "-n", OPERATOR_NAMESPACE, "-o", "json", check=False
        )
        return str((json.loads(out).get("spec") or {}).get("holderIdentity") or "") if out else ""

    def leader(self) -> tuple[str, str]:
        """(leader, standby) once one of the two holds the Lease."""
        self.cluster.wait_for("a leader elected", lambda: self.holder() in self.names)
        leader = self.holder()
        return leader, next(n for n in self.names if n != leader)

    def log(self, name: str) -> list[dict[str, Any]]:
        path: Path = self.cluster.dir / "logs" / f"{name}.log"
        out = []
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
        return out

    def signal(self, name: str, sig: signal.Signals) -> None:
        os.killpg(self.cluster.operators()[name].pid, sig)


@pytest.fixture
def pair(cluster: LocalCluster) -> Iterator[Pair]:
    """The suite's operator stops (releasing the Lease); two start at once; afterwards the
    suite's operator runs again."""
    cluster.stop_operator()
    n = next(_pairs)
    names = (f"a{n}-{os.getpid()}", f"b{n}-{os.getpid()}")
    flags = (
        "--lease-timeout-seconds",
        str(LEASE_TIMEOUT_S),
        "--withdraw-grace-seconds",
        str(GRACE_S),
    )
    for name in names:
        cluster.spawn_operator(name, *flags, "--leader-elect-identity", name, "--log-json")
    try:
        yield Pair(cluster, names)
    finally:
        for name in names:
            cluster.end_operator(name)
        cluster.start_operator("--lease-timeout-seconds", str(LEASE_TIMEOUT_S))


def writers(sc: Scenario, nodes: list[str]) -> dict[str, float]:
    """Operator identity -> the latest time (epoch s) it wrote one of these MigNodes or their
    slices, as their managedFields say."""
    # kubectl hides managedFields unless asked
    mignodes = sc.get("mignodes", "--show-managed-fields")["items"]
    slices = sc.get("resourceslices", "--show-managed-fields")["items"]
    bodies = [b for b in mignodes if b["metadata"]["name"] in nodes]
    bodies += [
        s for s in slices if s["spec"]["driver"] == DRIVER and s["spec"]["pool"]["name"] in nodes
    ]
    out: dict[str, float] = {}
    for body in bodies:
        for entry in body["metadata"].get("managedFields") or []:
            manager = str(entry.get("manager", ""))
            if manager.startswith(MANAGER):
                at = calendar.timegm(time.strptime(entry["time"], "%Y-%m-%dT%H:%M:%SZ"))
                name = manager.removeprefix(MANAGER)
                out[name] = max(out.get(name, 0.0), float(at))
    return out


def test_two_operators_started_together_only_the_leader_writes(
    pair: Pair, scenario: Scenario
) -> None:
    leader, standby = pair.leader()
    node = scenario.add_node(f"{H100}:1")
    scenario.policy()
    scenario.pod("p1", profile_is("3g.40gb"))
    scenario.pod("p2", profile_is("2g.20gb"))
    scenario.wait_served("p1")
    scenario.wait_served("p2")
    assert set(writers(scenario, [node])) == {leader}
    assert pair.holder() == leader
    spec = scenario.mignode(node)["spec"]
    lease = scenario.get("lease", "migpart-operator", "-n", OPERATOR_NAMESPACE)["spec"]
    assert spec["leaderTerm"] == lease.get("leaseTransitions", 0)
    assert not [e for e in pair.log(standby) if e.get("event") == "leadership_acquired"]
    table = scenario.tb.kubectl("get", "lease", "-n", OPERATOR_NAMESPACE)
    assert leader in table  # kubectl shows the holder


def test_the_standby_serves_a_pending_pod_after_the_leader_is_killed(
    pair: Pair, scenario: Scenario
) -> None:
    leader, standby = pair.leader()
    node = scenario.add_node(f"{H100}:1")
    scenario.policy()
    scenario.pod("first", profile_is("3g.40gb"))
    scenario.wait_served("first")
    term = scenario.mignode(node)["spec"]["leaderTerm"]
    pair.cluster.end_operator(leader, kill=True)  # SIGKILL: the Lease is not released
    scenario.pod("second", profile_is("3g.40gb"))
    scenario.wait_served("second", timeout_s=180)
    assert pair.holder() == standby
    spec = scenario.mignode(node)["spec"]
    assert spec["leaderTerm"] > term
    assert standby in writers(scenario, [node])


def in_destroy_window(sc: Scenario, node: str) -> bool:
    """A device that the spec lists and the GPU holds is missing from the node's slice."""
    body = sc.mignode(node)
    wanted = {
        device_name(g["index"], i["profile"], i["start"])
        for g in (body.get("spec") or {}).get("gpus", [])
        for i in g.get("instances", [])
    }
    there = {
        device_name(g["index"], i["profile"], i["start"])
        for g in (body.get("status") or {}).get("gpus", [])
        for i in g.get("instances", [])
    }
    slices = sc.get("resourceslices")["items"]
    published = {
        d["name"]
        for s in slices
        if s["spec"]["driver"] == DRIVER and s["spec"]["pool"]["name"] == node
        for d in s["spec"].get("devices") or []
    }
    return bool((wanted & there) - published)


def test_a_leader_frozen_in_its_destroy_window_writes_nothing_when_it_wakes(
    pair: Pair, scenario: Scenario
) -> None:
    leader, standby = pair.leader()
    node = one_free_whole_gpu(scenario)
    # serving a 1g.10gb destroys the free 7g.80gb: the leader withdraws it, then waits GRACE_S
    scenario.pod("small", profile_is("1g.10gb"))
    scenario.eventually(
        "the leader in its destroy window", lambda: in_destroy_window(scenario, node)
    )
    pair.signal(leader, signal.SIGSTOP)
    frozen_at = time.time()
    logged = len(pair.log(leader))  # a stopped process writes no more lines
    scenario.eventually("the standby leading", lambda: pair.holder() == standby, 60)
    scenario.wait_served("small", timeout_s=180)
    pair.signal(leader, signal.SIGCONT)
    wait_s(GRACE_S + 4)  # the woken leader's round runs on: its spec write must be refused
    last = writers(scenario, [node]).get(leader)
    assert last is None or last <= frozen_at, f"{leader} wrote after it was frozen"
    woken = [e.get("event") for e in pair.log(leader)[logged:]]
    assert "leadership_lost" in woken
    assert not {"mignode_spec_written", "resource_slice_published"} & set(woken), woken
    assert pair.holder() == standby
    assert scenario.allocated("small")


def test_an_agent_refuses_a_spec_from_an_older_leadership(scenario: Scenario) -> None:
    """No policy selects this node: the specs are the test's, as a newer and then an older
    leader would write them."""
    node = scenario.add_node(f"{H100}:1")

    def write(plan: str, term: int, profile: str) -> None:
        spec = {
            "planId": plan,
            "leaderTerm": term,
            "gpus": [{"index": 0, "instances": [{"profile": profile, "start": 0}]}],
        }
        patch = json.dumps({"spec": spec})
        scenario.tb.kubectl("patch", "mignode", node, "--type=merge", "-p", patch)

    def status() -> dict[str, Any]:
        return dict(scenario.mignode(node).get("status") or {})

    write("fence-newer", 1000, "7g.80gb")
    scenario.eventually(
        "the newer spec applied", lambda: status().get("observedPlanId") == "fence-newer"
    )
    assert status()["leaderTerm"] == 1000
    write("fence-older", 999, "1g.10gb")

    def refused() -> list[dict[str, Any]]:
        events = scenario.get(
            "events", "-n", "default", "--field-selector", f"involvedObject.name={node}"
        )["items"]
        return [e for e in events if e["reason"] == "SpecRefused"]

    scenario.eventually("a SpecRefused Event on the MigNode", lambda: bool(refused()))
    (event,) = refused()
    assert event["type"] == "Warning"
    assert event["involvedObject"]["kind"] == "MigNode"
    assert "leadership 999" in event["message"]
    wait_s(3)  # nothing of it may be applied, now or a little later
    after = status()
    assert after["observedPlanId"] == "fence-newer"
    assert after["leaderTerm"] == 1000
    assert [i["profile"] for g in after["gpus"] for i in g["instances"]] == ["7g.80gb"]

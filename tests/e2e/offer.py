"""What the offer-mode e2e tests share: a node's stable pool and instances as they read them,
Events by reason, the operator's log and the policy's allocation mode."""

from __future__ import annotations

import json
from typing import Any

from migpart.demo.cluster import LocalCluster
from migpart.slices.dra import DRIVER
from tests.e2e.conftest import Scenario


def by_profile(profile: str) -> str:
    return f'device.attributes["{DRIVER}"].profile == "{profile}"'


def pool_slices(sc: Scenario, node: str) -> list[dict[str, Any]]:
    """Our slices of `node`'s pool, in slice-name order."""
    items = sc.get("resourceslices")["items"]
    return sorted(
        (s for s in items if s["spec"]["driver"] == DRIVER and s["spec"]["pool"]["name"] == node),
        key=lambda s: s["metadata"]["name"],
    )


def offered(sc: Scenario, node: str) -> list[str]:
    """The pool's devices that consume counters: placements, listed whether made or not."""
    return [
        d["name"]
        for s in pool_slices(sc, node)
        for d in s["spec"].get("devices") or []
        if d.get("consumesCounters")
    ]


def generation(sc: Scenario, node: str) -> int:
    [only] = {int(s["spec"]["pool"]["generation"]) for s in pool_slices(sc, node)}
    return only


def reasons(sc: Scenario, name: str, namespace: str | None = None) -> list[str]:
    scope = ["-n", namespace] if namespace else ["-A"]
    items = json.loads(sc.tb.kubectl("get", "events", *scope, "-o", "json"))["items"]
    return [str(e["reason"]) for e in items if e["involvedObject"].get("name") == name]


def instances(sc: Scenario, node: str) -> dict[str, tuple[str, str]]:
    """`profile@start` -> (MIG UUID, state) of what the agent reports on GPU 0."""
    [gpu] = sc.gpus(node)
    return {f"{i['profile']}@{i['start']}": (str(i["uuid"]), i["state"]) for i in gpu["instances"]}


def operator_log(cluster: LocalCluster, event: str) -> list[dict[str, Any]]:
    """The operator's log lines of `event` (JSON lines; a restart appends to the file)."""
    path = cluster.dir / "logs" / "operator.log"
    lines = path.read_text(errors="replace").splitlines()
    entries = [json.loads(line) for line in lines if line.startswith("{")]
    return [e for e in entries if e.get("event") == event]


def allocation_mode(sc: Scenario) -> dict[str, Any]:
    status = sc.get("gpp", sc.pool).get("status") or {}
    return dict(status.get("allocation") or {})

"""What bench/chaos.py counts and reads: its faults and limits, the invariant counters, the
pods it tracks, and the devices of MigNodes and of the agents' state files."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.chaos_faults import (
    ELECTION_FAULTS,
)
from migpart.api.models import GROUP, MigNodeSpec
from migpart.demo.trace import TracePod
from migpart.slices.dra import DeviceId
from migpart.testing.builders import PolicyBuilder
from migpart.testing.invariants import Device

MODEL = "NVIDIA H100 80GB HBM3"
LABELS = {f"{GROUP}/chaos": "true"}
RECONFIGURATION = {"batchWindowSeconds": 1, "maxConcurrentNodes": 2}
POLICY_NAME = "chaos"


def policy(offer: bool) -> str:
    """The harness's policy: Auto (Reactive, the operators not publishing offers), or with
    `--offer` Offer (Reactive, and said so, where the server does not serve it)."""
    body = PolicyBuilder(POLICY_NAME).pool(LABELS).spec(reconfiguration=RECONFIGURATION)
    if offer:
        body.spec(allocation="Offer")
    return json.dumps(body.obj())


FAULTS = (
    "agent-kill",
    "operator-kill",
    "apiserver-restart",
    "etcd-restart",
    "claim-delete",
    "second-writer",
    "node-delete",
    "gpu-lost",
    *ELECTION_FAULTS,
)
# Offer mode's own (`--offer`): an agent ended inside a prepare, between the destroy that made
# room and the create, or between the create and the CDI write (the simulator's crash points).
OFFER_FAULTS = ("prepare-crash",)
# Not a fault migpart must survive but a check of the monitor: a buggy agent destroys an
# instance in use (the monitor must count it).
SELF_CHECKS = ("sabotage",)
# The processes a fault acts on (its lane); the others act on the control plane and objects.
FAULT_TARGETS = {
    "operator-kill": "operators",
    "second-operator": "operators",
    "operator-freeze": "operators",
    "apiserver-partition": "operators",
    "agent-kill": "agents",
    "agent-freeze": "agents",
    "node-delete": "agents",
    "gpu-lost": "agents",
    "prepare-crash": "agents",
}
LEAK_S = 60.0
STUCK_S = 120.0


@dataclass
class Counters:
    faults: Counter[str] = field(default_factory=Counter)
    destroyed_in_use: set[str] = field(default_factory=set)
    leaked: set[str] = field(default_factory=set)
    stuck: set[str] = field(default_factory=set)
    double_allocated: set[str] = field(default_factory=set)
    non_leader_writes: set[str] = field(default_factory=set)
    served: set[str] = field(default_factory=set)
    total: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"faults {sum(self.faults.values())}, pods served {len(self.served)}/"
            f"{len(self.total)}, destroyed-in-use {len(self.destroyed_in_use)}, leaked"
            f" {len(self.leaked)}, stuck {len(self.stuck)}, double-allocated"
            f" {len(self.double_allocated)}, non-leader-writes {len(self.non_leader_writes)}"
        )

    def ok(self) -> bool:
        bad = self.destroyed_in_use or self.leaked or self.stuck or self.double_allocated
        bad = bad or self.non_leader_writes
        return not bad and self.served == self.total


@dataclass
class Pod:
    trace: TracePod
    created: float
    started: float | None = None
    finished: bool = False


def device_of(node: str, gpu: int, profile: str, start: int) -> str:
    return DeviceId.of(node, gpu, profile, start).device


def split_device(device: str) -> Device:
    """`node/device` -> (node, device)."""
    node, _, name = device.partition("/")
    return node, name


def read_json(path: Path) -> dict[str, Any]:
    """A state file the agent writes atomically (missing: empty)."""
    try:
        raw: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return raw


def spec_devices(name: str, body: dict[str, Any]) -> set[str]:
    """The devices a MigNode's spec wants (`pool/device`)."""
    spec = MigNodeSpec.model_validate(body.get("spec") or {})
    return {
        f"{name}/{device_of(name, gpu, i.profile, i.start)}"
        for gpu, instances in spec.desired().items()
        for i in instances
    }


def status_devices(name: str, body: dict[str, Any]) -> set[str]:
    """The instances a MigNode's status reports (`pool/device`)."""
    return {
        f"{name}/{device_of(name, gpu['index'], i['profile'], i['start'])}"
        for gpu in (body.get("status") or {}).get("gpus", [])
        for i in gpu.get("instances", [])
    }

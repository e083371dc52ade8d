"""Bodies as the operator's indexes hold them, for the controller unit tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from migpart.api.models import GpuStatus, MigNode, MigNodeStatus
from migpart.clock import ManualClock
from migpart.controller.health import NodeHealth
from migpart.controller.state import OperatorState
from migpart.testing.builders import ClaimBuilder, PolicyBuilder, profile_is
from tests.unit.kube.factories import gpu

ROOT = Path(__file__).resolve().parents[3]
DEVICE_CLASS = yaml.safe_load((ROOT / "manifests" / "deviceclass.yaml").read_text())
PROFILE_IS = profile_is("{}")


def mignode(
    name: str,
    revision: int,
    *instances: tuple[str, int, str],
    gpus: list[GpuStatus] | None = None,
) -> dict[str, Any]:
    """A MigNode as its agent reports it: two H100s, `instances` on GPU 0 (or `gpus`)."""
    node = MigNode(
        metadata={"name": name, "resourceVersion": str(revision)},
        status=MigNodeStatus(gpus=gpus if gpus is not None else [gpu(0, *instances), gpu(1)]),
    )
    return node.model_dump(by_alias=True, exclude_none=True, mode="json")


def policy(
    name: str, pool: str, generation: int = 1, priority: int = 0, **spec: Any
) -> dict[str, Any]:
    body = PolicyBuilder(name).uid(f"uid-{name}").generation(generation).revision(generation)
    return body.pool({"pool": pool}).spec(priority=priority, **spec).obj()


def claim(name: str, profile: str, revision: int = 1) -> dict[str, Any]:
    body = ClaimBuilder(name, "ns").uid(f"uid-{name}").revision(revision)
    return body.request(profile_is(profile)).obj()


def placement(priority: int = 0, **selector: str) -> dict[str, Any]:
    return {
        "nodeName": "",
        "nodeSelector": selector,
        "terms": [],
        "tolerations": [],
        "priority": priority,
    }


def offline_state(effects: Any, publisher: Any = None) -> OperatorState:
    """An OperatorState with no API client: `effects` (the in-memory twin, or a recorder) and
    a manual clock that the test advances through `state.clock`."""
    clock = ManualClock()
    state = OperatorState(
        api=None,  # type: ignore[arg-type]
        credentials=None,  # type: ignore[arg-type]
        publisher=publisher,
        effects=effects,
        clock=clock,
        health=NodeHealth(clock),
    )
    state.slices_listed.set()  # no slice watch: nothing to wait for
    return state

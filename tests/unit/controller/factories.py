"""Bodies as the operator's indexes hold them, for the controller unit tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from migpart.api.models import FailedInstance, GpuStatus, MigNode, MigNodeSpec, MigNodeStatus
from migpart.clock import ManualClock
from migpart.controller.core.health import NodeHealth
from migpart.controller.core.state import OperatorState
from migpart.controller.rounds.scope import ScopeCache
from migpart.controller.watching.indexes import Cluster
from migpart.kube.placement import NodeFacts
from migpart.slices.dra import DRIVER
from migpart.testing.builders import ClaimBuilder, MigNodeBuilder, PolicyBuilder, profile_is
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
        scopes=ScopeCache(),
    )
    state.watches.slices_listed.set()  # no slice watch: nothing to wait for
    return state


def world(nodes: dict[str, dict[str, Any]], claims: list[dict[str, Any]], **spec: Any) -> Cluster:
    labels = {name: {"pool": "a"} for name in nodes}
    return Cluster(
        mignodes=nodes,
        node_labels=labels,
        policies={"pa": policy("pa", "a", reconfiguration={"batchWindowSeconds": 0, **spec})},
        claims={f"ns/{c['metadata']['name']}": c for c in claims},
        waiting={f"ns/{c['metadata']['name']}": (placement(),) for c in claims},
        device_classes={DRIVER: DEVICE_CLASS},
        node_facts={name: NodeFacts(v, ()) for name, v in labels.items()},
    )


def one_gpu(name: str, revision: int, *instances: tuple[str, int, str]) -> dict[str, Any]:
    return mignode(name, revision, gpus=[gpu(0, *instances)])


def allocation(name: str, node: str, device: str) -> dict[str, Any]:
    body = claim(name, "7g.80gb")
    body["status"] = {
        "allocation": {
            "devices": {
                "results": [{"request": "gpu", "driver": DRIVER, "pool": node, "device": device}]
            }
        }
    }
    return body


def node_body(
    revision: int,
    spec: MigNodeSpec | None = None,
    *instances: tuple[str, int, str],
    failed: list[FailedInstance] | None = None,
    gpus: int = 2,
) -> dict[str, Any]:
    """MigNode `a` at `revision`: H100s, `instances` on GPU 0 (profile, start, state); the
    agent carried out `spec` (the node is not reconfiguring)."""
    status = {
        "gpus": [gpu(0, *instances), *(gpu(i) for i in range(1, gpus))],
        "failedInstances": failed or [],
        "observedPlanId": spec.plan_id if spec is not None else None,
    }
    body = MigNodeBuilder("a").revision(revision).status(_status(status))
    if spec is not None:
        body = body.spec(spec)
    return body.obj()


def _status(status: dict[str, Any]) -> dict[str, Any]:
    return MigNodeStatus.model_validate(status).model_dump(
        by_alias=True, exclude_none=True, mode="json"
    )

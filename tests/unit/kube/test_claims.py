"""Which claims are pending demand, and evidence of allocation from outside the claim watch."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import yaml

from migpart.api.models import GROUP, VERSION, MigInstanceStatus, MigNode, MigNodeStatus
from migpart.clock import ManualClock
from migpart.controller.core.health import NodeHealth
from migpart.controller.core.state import FRESH_S, OperatorState, Sighting
from migpart.controller.rounds.reconcile import PolicyRound
from migpart.controller.rounds.scope import ScopeCache
from migpart.controller.watching.indexes import Cluster
from migpart.kube.claims import (
    AllocatedDevices,
    pending_claims,
    pod_claim_keys,
    pod_waiting,
    prepared_claims,
)
from migpart.kube.placement import NodeFacts
from migpart.slices.dra import DRIVER, DeviceId, allocated_ids
from migpart.testing.builders import ClaimBuilder, MigNodeBuilder, profile_is
from migpart.testing.effects import InMemoryEffects
from tests.unit.kube.factories import gpu

ROOT = Path(__file__).resolve().parents[3]


def claim(name: str, *, uid: str = "", allocated_to: str | None = None) -> dict[str, Any]:
    body = ClaimBuilder(name, "team-a").uid(uid or f"uid-{name}").request(profile_is("3g.40gb"))
    if allocated_to is not None:
        body.allocated("n1", allocated_to).allocated("n1", "e", "nic", "nic.example.com")
    return body.obj()


def mignode(name: str, instances: list[MigInstanceStatus]) -> dict[str, Any]:
    status = MigNodeStatus(gpus=[gpu(0).model_copy(update={"instances": instances})])
    return MigNodeBuilder(name).labels({"pool": "a"}).status(status).obj()


def prepared(profile: str, start: int, *claims: str) -> MigInstanceStatus:
    return MigInstanceStatus(
        profile=profile,
        start=start,
        uuid=f"MIG-{profile}-{start}",
        state="Prepared",
        claims=list(claims),
    )


def test_a_claim_is_pending_when_unallocated_and_a_pod_waits_for_it() -> None:
    claims = {
        f"team-a/{c['metadata']['name']}": c
        for c in (claim("waited"), claim("nobody-waits"), claim("done", allocated_to="x"))
    }
    waiting = ["team-a/waited", "team-a/done", "team-a/not-indexed-yet"]
    assert [key for key, _ in pending_claims(claims, waiting)] == ["team-a/waited"]
    # known allocated from elsewhere: not pending, whatever the claim itself says yet
    assert list(pending_claims(claims, waiting, frozenset({"team-a/waited"}))) == []


def test_only_our_drivers_devices_count_as_allocated() -> None:
    assert allocated_ids(claim("c", allocated_to="gpu-0-3g40gb-0")) == {
        DeviceId("n1", "gpu-0-3g40gb-0")
    }
    assert allocated_ids(claim("c")) == frozenset()


def test_prepared_claims_come_from_every_instance_of_the_node() -> None:
    node = mignode(
        "n1",
        [prepared("3g.40gb", 0, "team-a/x"), prepared("3g.40gb", 4, "team-a/y", "team-b/z")],
    )
    assert prepared_claims(MigNode.model_validate(node)) == {"team-a/x", "team-a/y", "team-b/z"}
    no_status = {"apiVersion": "migpart.io/v1alpha1", "kind": "MigNode", "metadata": {"name": "n3"}}
    assert prepared_claims(MigNode.model_validate(no_status)) == frozenset()


def test_pod_claim_keys_and_waiting() -> None:
    pod: dict[str, Any] = {
        "metadata": {"namespace": "team-a", "name": "p"},
        "spec": {
            "resourceClaims": [
                {"name": "a", "resourceClaimName": "direct"},
                {"name": "b", "resourceClaimTemplateName": "tmpl"},
            ]
        },
        "status": {
            "resourceClaimStatuses": [{"name": "b", "resourceClaimName": "p-b-xyz"}],
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
        },
    }
    assert pod_claim_keys(pod) == {"team-a/direct", "team-a/p-b-xyz"}
    assert pod_waiting(pod)
    del pod["status"]["conditions"]  # not tried by the scheduler yet: waiting all the same
    assert pod_waiting(pod)
    for not_waiting in (
        {"spec": {**pod["spec"], "nodeName": "n1"}},  # bound
        {"spec": {**pod["spec"], "schedulingGates": [{"name": "quota"}]}},  # gated
        {"metadata": {**pod["metadata"], "deletionTimestamp": "2026-11-23T00:00:00Z"}},
        {"status": {**pod["status"], "phase": "Succeeded"}},
    ):
        assert not pod_waiting({**pod, **not_waiting}), not_waiting


def cluster_with(node: dict[str, Any], claims: list[dict[str, Any]]) -> Cluster:
    deviceclass = yaml.safe_load((ROOT / "manifests" / "deviceclass.yaml").read_text())
    return Cluster(
        mignodes={"n1": node},
        node_labels={"n1": {"pool": "a"}},
        policies={
            "p": {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "GpuPartitionPolicy",
                "metadata": {"name": "p", "uid": "u"},
                "spec": {"nodeSelector": {"matchLabels": {"pool": "a"}}},
            }
        },
        claims={f"team-a/{c['metadata']['name']}": c for c in claims},
        waiting={f"team-a/{c['metadata']['name']}": () for c in claims},
        device_classes={DRIVER: deviceclass},
        node_facts={"n1": NodeFacts({"pool": "a"}, ())},
    )


def test_a_claim_prepared_on_a_node_is_not_planned_again_while_the_watches_lag() -> None:
    """kubelet prepared the claim (so it was allocated and its pod bound), but the MigNode
    event arrived before the claim's and the pod's: the claim must not become demand, or
    the planner would cut a second device for it (the first one is in use)."""
    lagging = [claim("served"), claim("new")]
    node = mignode("n1", [prepared("3g.40gb", 0, "team-a/served")])
    scope = ScopeCache().scope("p", cluster_with(node, lagging))
    assert scope is not None
    assert [r.name.split("/")[1] for r in scope.demand.requests] == ["new"]
    # and a claim the destroy protocol's quorum read saw allocated, likewise
    scope = ScopeCache().scope("p", cluster_with(node, lagging), frozenset({"team-a/new"}))
    assert scope is not None
    assert scope.demand.requests == ()


def test_quorum_read_sightings_are_forgotten_once_indexed_or_stale() -> None:
    clock = ManualClock(at=FRESH_S + 1)
    state = OperatorState(
        api=cast(Any, None),
        credentials=cast(Any, None),
        publisher=cast(Any, None),
        effects=InMemoryEffects(),
        clock=clock,
        health=NodeHealth(clock),
        scopes=ScopeCache(),
    )
    now, long_ago = clock.monotonic(), 0.0
    lagging_device = DeviceId("n1", "gpu-0-1g10gb-0")
    indexed_device = DeviceId("n1", "gpu-0-3g40gb-0")
    stale_device = DeviceId("n1", "gpu-0-7g80gb-0")
    state.destroy.fresh_allocations = {
        # the index still shows it unallocated: not pending, its device used
        "uid-lagging": Sighting(frozenset({lagging_device}), now),
        # the index shows the allocation now: forgotten, the index suffices
        "uid-caught-up": Sighting(frozenset({indexed_device}), now),
        # not in the index yet: kept, and no key to report
        "uid-unseen": Sighting(frozenset(), now),
        # never shown, e.g. deleted meanwhile: forgotten in time, its device no longer used
        "uid-deleted": Sighting(frozenset({stale_device}), long_ago),
    }
    claims = [
        claim("lagging"),
        claim("caught-up", allocated_to="gpu-0-3g40gb-0"),
        claim("deleted", uid="uid-other"),  # made again under the same name: pending
    ]
    cluster = cluster_with(mignode("n1", []), claims)
    round_ = PolicyRound(state, "p", cluster.policies["p"], cluster)
    assert round_.destroy.unseen_claims(cluster.claims) == {"team-a/lagging"}
    assert set(state.destroy.fresh_allocations) == {"uid-lagging", "uid-unseen"}
    assert round_.destroy.allocated(cluster.claims) == {indexed_device, lagging_device}


def test_allocated_devices_follow_the_claim_index_as_it_changes() -> None:
    index = AllocatedDevices()
    claims: dict[str, Any] = {"team-a/x": claim("x"), "team-a/y": claim("y")}
    assert index.of(claims) == frozenset()
    claims["team-a/x"] = claim("x", allocated_to="gpu-0-3g40gb-0")
    assert index.of(claims) == {DeviceId("n1", "gpu-0-3g40gb-0")}
    claims["team-a/y"] = claim("y", allocated_to="gpu-0-3g40gb-4")
    assert index.of(claims) == {DeviceId("n1", "gpu-0-3g40gb-0"), DeviceId("n1", "gpu-0-3g40gb-4")}
    del claims["team-a/x"]
    assert index.of(claims) == {DeviceId("n1", "gpu-0-3g40gb-4")}
    claims["team-a/y"] = claim("y")  # deallocated
    assert index.of(claims) == frozenset()

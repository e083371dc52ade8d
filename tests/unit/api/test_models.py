"""The CRD models parse the contract's examples and reject invalid specs with a field path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from migpart.api.models import (
    Condition,
    GpuPartitionPolicy,
    GpuPartitionPolicySpec,
    GpuStatus,
    MigNode,
    MigNodeSpec,
    MigNodeStatus,
    ProfileInfo,
    condition_status,
)
from migpart.api.selectors import LabelSelector
from migpart.mig import CATALOG, Instance
from migpart.planning.model import PolicyView, Spare

REPO = Path(__file__).parents[3]

POLICY_EXAMPLE = """
apiVersion: migpart.io/v1alpha1
kind: GpuPartitionPolicy
metadata: {name: inference-pool}
spec:
  mode: Active
  priority: 0
  nodeSelector:
    matchLabels: {pool: inference}
  profiles:
    allow: [1g.10gb, 2g.20gb, 3g.40gb]
    deny: []
  spares:
  - {profile: 1g.10gb, count: 2}
  reconfiguration:
    batchWindowSeconds: 2
    maxConcurrentNodes: 1
  allocation: Offer
status:
  observedGeneration: 3
  nodes: 4
  gpus: 32
  pendingRequests: 1
  lastPlan: {planId: "p-1", time: "2026-11-22T15:00:00Z", durationMillis: 3, satisfied: 5,
             unsatisfied: 1, created: 4, destroyed: 2}
  unavailableNodes: [{name: gpu-node-9, reason: LeaseExpired}]
  allocation: {mode: Reactive, reason: "Offer requested but not served"}
  conditions: [{type: Ready, status: "True", reason: Planned, message: ok,
                lastTransitionTime: "2026-11-22T15:00:00Z"}]
"""

MIGNODE_EXAMPLE = """
apiVersion: migpart.io/v1alpha1
kind: MigNode
metadata: {name: gpu-node-1}
spec:
  planId: "p-1"
  gpus:
  - index: 0
    instances:
    - {profile: 3g.40gb, start: 0}
    - {profile: 1g.10gb, start: 4}
status:
  observedPlanId: "p-1"
  gpus:
  - index: 0
    uuid: GPU-0000
    model: NVIDIA H100 80GB HBM3
    migEnabled: true
    computeSlices: 7
    memorySlices: 8
    profiles:
    - {name: 1g.10gb, computeSlices: 1, memorySlices: 1, placements: [0,1,2,3,4,5,6],
       maxInstances: 7, memoryMiB: 9984, multiprocessors: 16}
    instances:
    - {profile: 3g.40gb, start: 0, uuid: MIG-0001, state: Prepared, claims: [team-a/c1]}
    - {profile: 1g.10gb, start: 4, uuid: MIG-0002, state: Free}
  conditions: [{type: Ready, status: "True", reason: Synced}, {type: Degraded, status: "False",
                reason: Healthy}]
"""


def _dump(model: Any) -> dict[str, Any]:
    result: dict[str, Any] = model.model_dump(by_alias=True, exclude_none=True, mode="json")
    return result


def test_policy_example_parses_and_round_trips() -> None:
    body = yaml.safe_load(POLICY_EXAMPLE)
    policy = GpuPartitionPolicy.model_validate(body)
    assert policy.spec.profiles.allow == ["1g.10gb", "2g.20gb", "3g.40gb"]
    assert policy.spec.reconfiguration.batch_window_seconds == 2
    assert policy.status is not None
    assert policy.status.last_plan is not None
    assert policy.status.last_plan.duration_millis == 3
    assert condition_status(policy.status.conditions, "Ready") == "True"
    assert policy.spec.allocation == "Offer"
    assert policy.status.allocation is not None
    assert policy.status.allocation.mode == "Reactive"
    dumped = _dump(policy)
    dumped["spec"]["nodeSelector"].pop("matchExpressions")
    dumped["status"]["lastPlan"]["durationMillis"] = 3
    assert dumped == body
    assert GpuPartitionPolicy.model_validate(_dump(policy)) == policy


def test_mignode_example_parses_and_round_trips() -> None:
    body = yaml.safe_load(MIGNODE_EXAMPLE)
    node = MigNode.model_validate(body)
    assert node.spec is not None
    assert node.spec.gpus[0].instances[1].start == 4
    assert node.status is not None
    gpu = node.status.gpus[0]
    assert gpu.profiles[0].memory_mib == 9984
    assert gpu.instances[0].claims == ["team-a/c1"]
    assert MigNode.model_validate(_dump(node)) == node
    assert "memoryMiB" in _dump(node)["status"]["gpus"][0]["profiles"][0]


def test_defaults_of_an_empty_policy() -> None:
    policy = GpuPartitionPolicy.model_validate({"metadata": {"name": "p"}, "spec": {}})
    assert policy.spec.mode == "Active"
    assert policy.spec.allocation == "Auto"
    assert policy.spec.priority == 0
    assert policy.spec.node_selector == LabelSelector()
    assert policy.spec.reconfiguration.max_concurrent_nodes == 1
    assert policy.spec.policy_view() == PolicyView()


def test_policy_view() -> None:
    spec = GpuPartitionPolicySpec.model_validate(
        {
            "profiles": {"allow": ["1g.10gb", "3g.40gb"]},
            "spares": [{"profile": "1g.10gb", "count": 2}, {"profile": "3g.40gb", "count": 0}],
        }
    )
    assert spec.policy_view() == PolicyView(
        allowed=frozenset({"1g.10gb", "3g.40gb"}), spares=(Spare("1g.10gb", 2),)
    )
    denying = GpuPartitionPolicySpec.model_validate({"profiles": {"deny": ["7g.80gb"]}})
    assert denying.policy_view() == PolicyView(denied=frozenset({"7g.80gb"}))


@pytest.mark.parametrize(
    ("spec", "loc", "text"),
    [
        ({"mode": "Sometimes"}, ("mode",), "Active"),
        ({"priority": -1}, ("priority",), "greater than or equal to 0"),
        ({"profiles": {"allow": ["10g.1gb"]}}, ("profiles", "allow", 0), "pattern"),
        ({"profiles": {"allow": ["1g.10GB"]}}, ("profiles", "allow", 0), "pattern"),
        ({"profiles": {"deny": ["three"]}}, ("profiles", "deny", 0), "pattern"),
        (
            {"profiles": {"allow": ["1g.10gb", "2g.20gb"], "deny": ["2g.20gb"]}},
            ("profiles",),
            "allow and deny must not name the same profile (both name 2g.20gb)",
        ),
        ({"profiles": {"allow": ["1g.10gb", "1g.10gb"]}}, ("profiles",), "twice"),
        (
            {"spares": [{"profile": "1g.10gb", "count": -2}]},
            ("spares", 0, "count"),
            "greater than or equal to 0",
        ),
        ({"spares": [{"profile": "1g.10gb"}]}, ("spares", 0, "count"), "required"),
        (
            {"profiles": {"deny": ["1g.10gb"]}, "spares": [{"profile": "1g.10gb", "count": 1}]},
            (),
            "denied by profiles.deny",
        ),
        (
            {"profiles": {"allow": ["2g.20gb"]}, "spares": [{"profile": "1g.10gb", "count": 1}]},
            (),
            "not in profiles.allow",
        ),
        (
            {"spares": [{"profile": "1g.10gb", "count": 1}, {"profile": "1g.10gb", "count": 2}]},
            (),
            "listed twice",
        ),
        (
            {"reconfiguration": {"batchWindowSeconds": -1}},
            ("reconfiguration",),
            "greater than or equal to 0",
        ),
        (
            {"reconfiguration": {"maxConcurrentNodes": 0}},
            ("reconfiguration",),
            "greater than or equal to 1",
        ),
        (
            {"nodeSelector": {"matchExpressions": [{"key": "pool", "operator": "In"}]}},
            ("nodeSelector", "matchExpressions", 0),
            "values must be non-empty for operator In",
        ),
        (
            {
                "nodeSelector": {
                    "matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]
                }
            },
            ("nodeSelector", "matchExpressions", 0),
            "values must be empty for operator Exists",
        ),
        (
            {"nodeSelector": {"matchExpressions": [{"key": "a", "operator": "Gt"}]}},
            ("nodeSelector", "matchExpressions", 0, "operator"),
            "In",
        ),
        ({"nodeSelector": {"matchLabel": {"a": "b"}}}, ("nodeSelector", "matchLabel"), "Extra"),
        ({"unknownField": 1}, ("unknownField",), "Extra inputs"),
        ({"allocation": "Eager"}, ("allocation",), "'Reactive', 'Offer' or 'Auto'"),
    ],
)
def test_invalid_specs_fail_with_a_field_path(
    spec: dict[str, Any], loc: tuple[str | int, ...], text: str
) -> None:
    with pytest.raises(ValidationError) as info:
        GpuPartitionPolicySpec.model_validate(spec)
    errors = info.value.errors()
    hit = [e for e in errors if e["loc"][: len(loc)] == loc]
    assert hit, errors
    message = " ".join(e["msg"] for e in hit)
    assert text in message, message


@pytest.mark.parametrize(
    ("selector", "labels", "selected"),
    [
        ({}, {}, True),
        ({"matchLabels": {"pool": "inference"}}, {"pool": "inference", "x": "y"}, True),
        ({"matchLabels": {"pool": "inference"}}, {"pool": "training"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]}, {"a": "1"}, True),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]}, {}, False),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),
        (
            {"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]},
            {"a": "1"},
            False,
        ),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"b": ""}, False),
        ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": "1"}, False),
    ],
)
def test_label_selector_matches(
    selector: dict[str, Any], labels: dict[str, str], selected: bool
) -> None:
    assert LabelSelector.model_validate(selector).matches(labels) is selected


@pytest.mark.parametrize("model", sorted(CATALOG))
def test_profile_info_round_trips_catalog_profiles(model: str) -> None:
    table = CATALOG[model]
    infos = [ProfileInfo.from_profile(p) for p in table.profiles]
    for info, profile in zip(infos, table.profiles, strict=True):
        back = info.to_profile()
        assert back.name == profile.name
        assert back.placements == profile.placements
        assert (back.memory_mib, back.multiprocessors, back.ofas) == (
            profile.memory_mib,
            profile.multiprocessors,
            profile.ofas,
        )
    gpu = GpuStatus(
        index=0,
        uuid="GPU-1",
        model=model,
        mig_enabled=True,
        compute_slices=table.compute_slices,
        memory_slices=table.memory_slices,
        profiles=infos,
    )
    rebuilt = gpu.table()
    assert rebuilt.model == model
    assert rebuilt.profile_names == table.profile_names
    assert [p.placements for p in rebuilt.profiles] == [p.placements for p in table.profiles]


@given(
    states=st.lists(
        st.lists(st.sampled_from(["Free", "Prepared", "Busy"]), max_size=7), max_size=8
    ),
    observed=st.sampled_from([None, "p-1", "p-2"]),
    wanted=st.sampled_from([None, "p-1", "p-2"]),
)
def test_summary_counts(states: list[list[str]], observed: str | None, wanted: str | None) -> None:
    status = MigNodeStatus.model_validate(
        {
            "observedPlanId": observed,
            "gpus": [
                {
                    "index": g,
                    "uuid": f"GPU-{g}",
                    "model": "NVIDIA H100 80GB HBM3",
                    "migEnabled": True,
                    "computeSlices": 7,
                    "memorySlices": 8,
                    "instances": [
                        {"profile": "1g.10gb", "start": i, "uuid": f"MIG-{g}-{i}", "state": s}
                        for i, s in enumerate(gpu)
                    ],
                }
                for g, gpu in enumerate(states)
            ],
        }
    )
    summary = status.summarized(wanted).summary
    assert summary is not None
    assert summary.gpus == len(states)
    assert summary.instances == sum(len(g) for g in states)
    assert summary.free == sum(g.count("Free") for g in states)
    assert summary.synced is (observed == wanted)


def test_condition_rejects_unknown_status() -> None:
    with pytest.raises(ValidationError) as info:
        Condition.model_validate({"type": "Ready", "status": "Yes", "reason": "x"})
    assert info.value.errors()[0]["loc"] == ("status",)


def test_models_are_frozen() -> None:
    policy = GpuPartitionPolicy.model_validate(yaml.safe_load(POLICY_EXAMPLE))
    with pytest.raises(ValidationError):
        policy.spec.mode = "DryRun"  # type: ignore[misc]


@pytest.mark.parametrize(
    "path", ["manifests/samples/policy-inference.yaml", "manifests/samples/policy-dryrun.yaml"]
)
def test_sample_policies_parse(path: str) -> None:
    body = yaml.safe_load((REPO / path).read_text())
    policy = GpuPartitionPolicy.model_validate(body)
    assert policy.metadata["name"]


def test_what_a_spec_wants_needs_a_plan_id() -> None:
    gpus = [
        {"index": 0, "instances": [{"profile": "3g.40gb", "start": 4}]},
        {"index": 2, "instances": []},
    ]
    planned = MigNodeSpec.model_validate({"planId": "p1", "gpus": gpus})
    assert planned.desired() == {0: frozenset({Instance("3g.40gb", 4)}), 2: frozenset()}
    # not written by a plan (the agent's own empty MigNode, a hand edit): wants nothing
    assert MigNodeSpec.model_validate({"gpus": gpus}).desired() == {}
    assert MigNodeSpec().desired() == {}
    assert MigNode().desired() == {}
    assert MigNode(spec=planned).desired() == planned.desired()

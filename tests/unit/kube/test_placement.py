"""Which nodes a pending pod may run on: nodeName, nodeSelector, required node affinity, taints."""

from __future__ import annotations

from typing import Any

import pytest

from migpart.kube.placement import NodeFacts, NodeFilter, allows, node_facts, pod_placement

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"containers": [], **spec}}


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
        }
    }


NODES = {
    "a": NodeFacts({"pool": "train", "gpus": "8"}),
    "b": NodeFacts({"pool": "infer", "gpus": "2"}),
    "c": NodeFacts({"pool": "infer"}, (GPU_TAINT,)),
}


def allowed(spec: dict[str, Any]) -> set[str]:
    placement = pod_placement(pod(**spec))
    return {name for name, facts in NODES.items() if allows(placement, name, facts)}


@pytest.mark.parametrize(
    ("spec", "nodes"),
    [
        ({}, {"a", "b"}),
        ({"nodeName": "b"}, {"b"}),
        ({"nodeSelector": {"pool": "infer"}}, {"b"}),
        ({"nodeSelector": {"pool": "infer"}, "tolerations": [{"operator": "Exists"}]}, {"b", "c"}),
        ({"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}, {"a", "b", "c"}),
        (
            {
                "tolerations": [
                    {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
                ]
            },
            {"a", "b", "c"},
        ),
        ({"tolerations": [{"key": "nvidia.com/gpu", "value": "absent"}]}, {"a", "b"}),
        (
            {
                "tolerations": [
                    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}
                ]
            },
            {"a", "b"},
        ),
        (
            {
                "affinity": affinity(
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["train"]}]}
                )
            },
            {"a"},
        ),
        (
            {
                "affinity": affinity(
                    {
                        "matchExpressions": [
                            {"key": "pool", "operator": "NotIn", "values": ["train"]}
                        ]
                    }
                )
            },
            {"b"},
        ),
        (
            {"affinity": affinity({"matchExpressions": [{"key": "gpus", "operator": "Exists"}]})},
            {"a", "b"},
        ),
        (
            {
                "affinity": affinity(
                    {"matchExpressions": [{"key": "gpus", "operator": "DoesNotExist"}]}
                )
            },
            set(),
        ),
        (
            {
                "affinity": affinity(
                    {"matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["4"]}]}
                )
            },
            {"a"},
        ),
        (
            {
                "affinity": affinity(
                    {"matchExpressions": [{"key": "gpus", "operator": "Lt", "values": ["4"]}]}
                )
            },
            {"b"},
        ),
        (
            # terms are ORed
            {
                "affinity": affinity(
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]}]},
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["infer"]}]},
                )
            },
            {"a", "b"},
        ),
        (
            # expressions within a term are ANDed
            {
                "affinity": affinity(
                    {
                        "matchExpressions": [
                            {"key": "pool", "operator": "In", "values": ["infer"]}
                        ],
                        "matchFields": [
                            {"key": "metadata.name", "operator": "NotIn", "values": ["b"]}
                        ],
                    }
                )
            },
            set(),
        ),
        # an operator this code does not know is left to the scheduler
        (
            {"affinity": affinity({"matchExpressions": [{"key": "pool", "operator": "Near"}]})},
            {"a", "b"},
        ),
    ],
)
def test_allowed_nodes(spec: dict[str, Any], nodes: set[str]) -> None:
    assert allowed(spec) == nodes


def test_prefer_no_schedule_taints_do_not_exclude() -> None:
    soft = NodeFacts({}, ({"key": "x", "effect": "PreferNoSchedule"},))
    assert allows(pod_placement(pod()), "n", soft)


def test_node_facts_from_a_node_body() -> None:
    body = {"metadata": {"name": "n", "labels": {"pool": "infer"}}, "spec": {"taints": [GPU_TAINT]}}
    assert node_facts(body) == NodeFacts({"pool": "infer"}, (GPU_TAINT,))
    assert node_facts({"metadata": {"name": "n"}}) == NodeFacts({}, ())


def test_filter_says_none_when_nothing_constrains() -> None:
    untainted = {k: v for k, v in NODES.items() if not v.taints}
    assert NodeFilter(untainted).allowed([pod_placement(pod())]) is None
    assert NodeFilter(untainted).allowed([]) is None


def test_filter_intersects_the_pods_sharing_a_claim() -> None:
    train = pod_placement(pod(nodeSelector={"pool": "train"}))
    named = pod_placement(pod(nodeName="b"))
    nodes = NodeFilter(NODES)
    assert nodes.allowed([train]) == frozenset({"a"})
    assert nodes.allowed([train, named]) == frozenset()
    # taints count even for pods without a selector
    assert nodes.allowed([pod_placement(pod())]) == frozenset({"a", "b"})

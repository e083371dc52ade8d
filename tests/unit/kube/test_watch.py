"""kube.watch.Index: what a kopf index holds, kept from lists and watch events, for every kind
a round reads."""

from __future__ import annotations

from typing import Any

from migpart.api.models import GROUP, VERSION
from migpart.controller.watching.indexes import (
    claim_entry,
    class_entry,
    node_entry,
    object_entry,
    waiting_entry,
)
from migpart.kube.watch import Index


def pod(name: str, claims: list[str], uid: str | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": uid or f"uid-{name}"},
        "spec": {
            "resourceClaims": [{"name": c, "resourceClaimName": c} for c in claims],
            "containers": [{"name": "c"}],
            **spec,
        },
        "status": {"phase": "Pending"},
    }


def test_each_object_gives_its_keys_and_several_objects_may_share_one() -> None:
    changes: list[int] = []
    index = Index(waiting_entry, lambda: changes.append(1))
    index.listed([pod("a", ["c1", "c2"]), pod("b", ["c2"]), pod("none", [])])
    assert index.synced.is_set()
    assert sorted(index) == ["ns/c1", "ns/c2"]
    assert len(index["ns/c2"]) == 2
    index.changed("DELETED", pod("a", ["c1", "c2"]))
    assert sorted(index) == ["ns/c2"]
    assert len(index["ns/c2"]) == 1
    assert len(changes) == 2


def test_an_event_replaces_what_the_object_gave_before() -> None:
    index = Index(waiting_entry)
    index.listed([pod("a", ["c1"])])
    index.changed("MODIFIED", pod("a", ["c1"], nodeName="n1"))  # bound: no longer waiting
    assert dict(index) == {}
    index.changed("MODIFIED", pod("a", ["c3"]))
    assert list(index) == ["ns/c3"]


def test_a_new_list_drops_the_objects_deleted_while_the_watch_was_down() -> None:
    index = Index(claim_entry)
    claims = [{"metadata": {"name": n, "namespace": "ns", "uid": n}} for n in ("x", "y")]
    index.listed(claims)
    index.broken()  # keeps what it knows
    assert sorted(index) == ["ns/x", "ns/y"]
    index.listed(claims[1:])
    assert list(index) == ["ns/y"]
    (value,) = index["ns/y"]
    assert value["kind"] == "ResourceClaim"
    assert value["apiVersion"] == "resource.k8s.io/v1"


def test_a_name_reused_by_a_new_object_is_a_new_object() -> None:
    index = Index(waiting_entry)
    index.changed("ADDED", pod("a", ["c1"], uid="old"))
    index.changed("ADDED", pod("a", ["c1"], uid="new"))
    index.changed("DELETED", pod("a", ["c1"], uid="old"))
    assert list(index) == ["ns/c1"]
    assert len(index["ns/c1"]) == 1


def node(name: str, labels: dict[str, str], heartbeat: str = "t0") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "labels": labels},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "lastHeartbeatTime": heartbeat}]},
    }


def test_a_node_event_that_leaves_labels_and_taints_as_they_were_wakes_nothing() -> None:
    """A Node's status changes every few seconds; only its labels and taints matter to a
    round, so only their changes wake the planners."""
    changes: list[int] = []
    index = Index(node_entry, lambda: changes.append(1), quiet_when_same=True)
    index.listed([node("n1", {"pool": "a"})])
    assert len(changes) == 1
    index.changed("MODIFIED", node("n1", {"pool": "a"}, heartbeat="t1"))
    assert len(changes) == 1
    index.changed("MODIFIED", node("n1", {"pool": "b"}, heartbeat="t2"))
    assert len(changes) == 2
    assert [facts.labels for facts in index["n1"]] == [{"pool": "b"}]
    index.changed("ADDED", node("n2", {"pool": "b"}))  # a new node is a change
    index.changed("DELETED", node("n2", {"pool": "b"}))
    assert len(changes) == 4


def test_a_policy_deleted_while_the_watch_was_down_is_gone_after_the_relist() -> None:
    """A kopf index kept such a policy after its relist, and the policy went on owning its
    nodes; this index is replaced by the list."""
    policies = [
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GpuPartitionPolicy", **p}
        for p in (
            {"metadata": {"name": "pa", "uid": "ua"}, "spec": {"nodeSelector": {}}},
            {"metadata": {"name": "pb", "uid": "ub"}, "spec": {}, "status": {"x": 1}},
        )
    ]
    index = Index(object_entry)
    index.listed(policies)
    assert sorted(index) == ["pa", "pb"]
    index.broken()
    index.listed(policies[1:])
    assert list(index) == ["pb"]
    (value,) = index["pb"]
    assert value == policies[1]


def test_a_device_class_keeps_its_metadata_and_spec() -> None:
    body = {"metadata": {"name": "c", "uid": "u"}, "spec": {"selectors": []}, "status": {}}
    index = Index(class_entry)
    index.listed([body])
    assert list(index["c"]) == [{"metadata": body["metadata"], "spec": body["spec"]}]

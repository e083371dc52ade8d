"""kube.watch.Index: what a kopf index holds, kept from lists and watch events."""

from __future__ import annotations

from typing import Any

from migpart.controller.indexes import claim_entry, waiting_entry
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

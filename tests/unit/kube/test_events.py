"""The operator's Events (kube/events.py) name their object, and their reporting component, as
kopf's do."""

from __future__ import annotations

from migpart.kube.events import event_body
from migpart.testing.builders import ClaimBuilder, MigNodeBuilder, profile_is


def test_an_event_about_a_claim_is_in_its_namespace() -> None:
    claim = ClaimBuilder("c1", "team").uid("u-1").request(profile_is("3g.40gb")).obj()
    body = event_body(claim, "Warning", "PlacementConflict", "x" * 2000)
    assert body["metadata"] == {"generateName": "c1.", "namespace": "team"}
    assert body["involvedObject"] == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "name": "c1",
        "namespace": "team",
        "uid": "u-1",
    }
    assert (body["type"], body["reason"], len(body["message"])) == (
        "Warning",
        "PlacementConflict",
        1000,
    )
    assert body["reportingComponent"] == body["source"]["component"] == "migpart"


def test_an_event_about_a_cluster_scoped_object_goes_to_default() -> None:
    body = event_body(MigNodeBuilder("n1").obj(), "Normal", "Seen", "m")
    assert body["metadata"]["namespace"] == "default"
    assert body["involvedObject"]["namespace"] == ""

"""The object builders: each body holds what its setters put in it, in the API's shape."""

from __future__ import annotations

from migpart.api.models import GROUP, VERSION, MigNodeSpec, MigNodeStatus
from migpart.slices.dra import DEVICE_CLASS, DRIVER, allocated_ids
from migpart.testing.builders import (
    POOL_LABEL,
    ClaimBuilder,
    MigNodeBuilder,
    PodBuilder,
    PolicyBuilder,
    SliceBuilder,
    memory_at_least,
    profile_is,
)
from migpart.testing.invariants import allocated_devices


def test_a_claim_and_its_template_share_one_spec() -> None:
    claim = ClaimBuilder("c1", "ns").uid("u1").revision(7)
    claim.request(profile_is("1g.10gb"), count=2).same_gpu("gpu")
    body = claim.obj()
    assert body["apiVersion"] == "resource.k8s.io/v1"
    assert body["kind"] == "ResourceClaim"
    assert body["metadata"] == {
        "name": "c1",
        "namespace": "ns",
        "uid": "u1",
        "resourceVersion": "7",
    }
    assert body["spec"]["devices"] == {
        "requests": [
            {
                "name": "gpu",
                "exactly": {
                    "deviceClassName": DEVICE_CLASS,
                    "count": 2,
                    "selectors": [{"cel": {"expression": profile_is("1g.10gb")}}],
                },
            }
        ],
        "constraints": [{"requests": ["gpu"], "matchAttribute": f"{DRIVER}/parentUUID"}],
    }
    assert "status" not in body
    template = claim.template()
    assert template["kind"] == "ResourceClaimTemplate"
    assert template["spec"] == {"spec": body["spec"]}


def test_an_allocated_claim_reads_as_the_operator_and_the_checker_read_it() -> None:
    body = (
        ClaimBuilder("c1", "ns")
        .request(memory_at_least(20480))
        .allocated("n1", "gpu-0-3g40gb-0")
        .allocated("n1", "e", "nic", "nic.example.com")
        .reserved_for("p1")
        .obj()
    )
    assert {d.device for d in allocated_ids(body)} == {"gpu-0-3g40gb-0"}
    assert allocated_devices(body) == {("n1", "gpu-0-3g40gb-0")}
    assert body["status"]["reservedFor"] == [{"resource": "pods", "name": "p1", "uid": "uid-p1"}]


def test_a_pod_uses_every_claim_in_its_one_container() -> None:
    body = (
        PodBuilder("p1", "ns")
        .claim("c1")
        .claim_template("t1", name="more")
        .node_selector({POOL_LABEL: "a"})
        .env("RUN", "1")
        .ends()
        .unschedulable()
        .obj()
    )
    (container,) = body["spec"]["containers"]
    assert container["resources"] == {"claims": [{"name": "gpu"}, {"name": "more"}]}
    assert container["env"] == [{"name": "RUN", "value": "1"}]
    assert body["spec"]["resourceClaims"] == [
        {"name": "gpu", "resourceClaimName": "c1"},
        {"name": "more", "resourceClaimTemplateName": "t1"},
    ]
    assert body["spec"]["nodeSelector"] == {f"{GROUP}/pool": "a"}
    assert body["spec"]["restartPolicy"] == "Never"
    assert body["status"]["conditions"][0]["reason"] == "Unschedulable"
    bare = PodBuilder("p2").obj()
    assert bare["spec"] == {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}


def test_mignode_slice_and_policy_bodies() -> None:
    node = MigNodeBuilder("n1").labels({"pool": "a"}).spec(MigNodeSpec(plan_id="p1"))
    body = node.status(MigNodeStatus(observed_plan_id="p1")).obj()
    assert body["apiVersion"] == f"{GROUP}/{VERSION}"
    assert body["spec"]["planId"] == body["status"]["observedPlanId"] == "p1"
    assert MigNodeBuilder("n2").obj() == {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "MigNode",
        "metadata": {"name": "n2"},
    }
    slice_body = SliceBuilder("n1-x", "n1", generation=3).device("gpu-0-7g80gb-0", gpuIndex=0).obj()
    assert slice_body["spec"]["pool"]["generation"] == 3
    assert slice_body["spec"]["devices"][0]["attributes"] == {"gpuIndex": {"int": 0}}
    policy = PolicyBuilder("p").pool({"pool": "a"}).spec(mode="DryRun").obj()
    assert policy["spec"] == {"nodeSelector": {"matchLabels": {"pool": "a"}}, "mode": "DryRun"}

"""The relay's pure decisions (controller/relay.py), table by table."""

from __future__ import annotations

from migpart.api.models import GpuSpec, MigInstanceSpec, MigNode, MigNodeSpec, MigNodeStatus
from migpart.controller.relay import binding_entries, relay, relayed_plan_id, verdict
from migpart.dra import DRIVER, INSTANCE_READY, DeviceId, placement_device_fields
from migpart.mig import Instance
from migpart.testing.builders import gpu_status


def node(spec: list[tuple[str, int]] | None, *instances: tuple[str, int, str]) -> MigNode:
    wanted = [MigInstanceSpec(profile=p, start=s) for p, s in spec or []]
    return MigNode(
        metadata={"name": "a"},
        spec=None
        if spec is None
        else MigNodeSpec(plan_id="p1", gpus=[GpuSpec(index=0, instances=wanted)]),
        status=MigNodeStatus(gpus=[gpu_status(0, *instances)]),
    )


def test_a_relayed_plan_id_is_stable_new_and_does_not_grow() -> None:
    once = relayed_plan_id("p1", ["gpu-0-3g40gb-4"])
    assert once == relayed_plan_id("p1", ["gpu-0-3g40gb-4"])
    assert once != "p1"
    again = relayed_plan_id(once, ["gpu-0-1g10gb-0"])
    assert again.startswith("p1+")
    assert len(again) == len(once)
    assert relayed_plan_id(None, ["x"]).startswith("relay+")


def test_the_placement_the_spec_has_wins_over_an_earlier_claim() -> None:
    """c0 sorts first, but c9's placement is in the spec already: c0 conflicts."""
    decision = relay(
        node([("4g.40gb", 0)]), [("ns/c0", "gpu-0-7g80gb-0"), ("ns/c9", "gpu-0-4g40gb-0")]
    )
    assert decision.spec is None
    assert list(decision.conflicts) == [("ns/c0", "gpu-0-7g80gb-0")]


def test_devices_that_exist_or_are_no_placement_are_left_alone() -> None:
    decision = relay(
        node([("3g.40gb", 0)], ("3g.40gb", 0, "Free")),
        [("ns/c1", "gpu-0-3g40gb-0"), ("ns/c2", "gpu-5-3g40gb-0"), ("ns/c3", "eth0")],
    )
    assert (decision.spec, dict(decision.conflicts)) == (None, {})


def test_two_placements_that_fit_together_are_added_in_one_spec() -> None:
    decision = relay(node([]), [("ns/c1", "gpu-0-3g40gb-4"), ("ns/c2", "gpu-0-3g40gb-0")])
    assert decision.spec is not None
    assert decision.spec.desired() == {
        0: frozenset({Instance("3g.40gb", 0), Instance("3g.40gb", 4)})
    }


def test_a_half_created_instance_is_not_ready() -> None:
    half = node([("3g.40gb", 4)], ("3g.40gb", 4, "Free"))
    assert half.status is not None
    row = half.status.gpus[0].instances[0].model_copy(update={"uuid": ""})
    gpu = half.status.gpus[0].model_copy(update={"instances": [row]})
    half = half.model_copy(update={"status": half.status.model_copy(update={"gpus": [gpu]})})
    device = DeviceId("a", "gpu-0-3g40gb-4")
    assert verdict(half, device) is None
    ready = verdict(node([("3g.40gb", 4)], ("3g.40gb", 4, "Free")), device)
    assert ready is not None
    assert ready.type == INSTANCE_READY


def test_binding_entries_write_only_what_is_missing() -> None:
    device = DeviceId("a", "gpu-0-3g40gb-4")
    ready = verdict(node([("3g.40gb", 4)], ("3g.40gb", 4, "Free")), device)
    assert ready is not None
    claim: dict[str, object] = {"status": {}}
    entries = binding_entries(claim, {device: ready}, "2026-01-01T00:00:00Z")
    assert entries is not None
    assert entries[0]["driver"] == DRIVER
    claim["status"] = {"devices": entries}
    assert binding_entries(claim, {device: ready}, "2026-01-01T00:00:09Z") is None


def test_an_offered_device_waits_for_readiness_and_may_fail() -> None:
    fields = placement_device_fields()
    assert fields["bindingConditions"] == [f"{DRIVER}/instance-ready"]
    assert fields["bindingFailureConditions"] == [f"{DRIVER}/instance-failed"]
    assert fields["bindsToNode"] is True

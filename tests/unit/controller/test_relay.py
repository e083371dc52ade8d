"""The relay's pure decisions (controller/relay.py), table by table."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from migpart.api.models import (
    MAX_INSTANCES_PER_GPU,
    FailedInstance,
    GpuSpec,
    MigInstanceSpec,
    MigNode,
    MigNodeSpec,
    MigNodeStatus,
)
from migpart.controller.relay import (
    abandoned,
    binding_entries,
    relay,
    relayed_plan_id,
    verdict,
)
from migpart.dra import DRIVER, INSTANCE_READY, DeviceId, placement_device_fields
from migpart.mig import Instance, device_name
from migpart.testing.builders import gpu_status


def node(
    spec: list[tuple[str, int]] | None,
    *instances: tuple[str, int, str],
    failed: list[tuple[int, str, int]] | None = None,
) -> MigNode:
    """MigNode `a`: one H100 (GPU 0) with `instances`; `failed`: (GPU, profile, start) the
    agent reports it could not create."""
    wanted = [MigInstanceSpec(profile=p, start=s) for p, s in spec or []]
    failures = [
        FailedInstance(gpu=g, profile=p, start=s, reason="NvmlError", message="refused")
        for g, p, s in failed or []
    ]
    return MigNode(
        metadata={"name": "a"},
        spec=None
        if spec is None
        else MigNodeSpec(plan_id="p1", gpus=[GpuSpec(index=0, instances=wanted)]),
        status=MigNodeStatus(gpus=[gpu_status(0, *instances)], failed_instances=failures),
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


# ------------------------------------------------------------ failed placements dropped


def wants(spec: MigNodeSpec | None) -> set[tuple[str, int]]:
    assert spec is not None
    return {(i.profile, i.start) for g in spec.gpus for i in g.instances}


def test_a_failed_placement_no_claim_holds_is_dropped_and_nothing_else() -> None:
    n = node([("3g.40gb", 0), ("3g.40gb", 4)], ("3g.40gb", 0, "Free"), failed=[(0, "3g.40gb", 4)])
    decision = relay(n, [])
    assert decision.dropped == ("gpu-0-3g40gb-4",)
    assert decision.added == ()
    assert wants(decision.spec) == {("3g.40gb", 0)}
    assert decision.spec is not None
    assert decision.spec.plan_id != "p1"
    assert str(decision.spec.plan_id).startswith("p1+")


def test_a_dropped_placement_frees_its_space_for_a_claim_in_the_same_spec() -> None:
    """7g.80gb@0 failed and its claim is gone; another claim got 3g.40gb@4 (which overlaps
    it): one spec drops the first and adds the second, no conflict."""
    n = node([("7g.80gb", 0)], failed=[(0, "7g.80gb", 0)])
    decision = relay(n, [("ns/c2", "gpu-0-3g40gb-4")])
    assert (decision.dropped, decision.added) == (("gpu-0-7g80gb-0",), ("gpu-0-3g40gb-4",))
    assert dict(decision.conflicts) == {}
    assert wants(decision.spec) == {("3g.40gb", 4)}


# Each reported failure below names something the drop must never take: an instance that
# exists (the agent's retry made it: free, half made, or in use already), one a claim holds,
# one the spec does not want, one on a GPU the agent does not report (lost).
NEVER_DROPPED = [
    pytest.param(
        node([("3g.40gb", 4)], ("3g.40gb", 4, "Free"), failed=[(0, "3g.40gb", 4)]),
        [],
        id="created-free",
    ),
    pytest.param(
        node([("3g.40gb", 4)], ("3g.40gb", 4, "Prepared"), failed=[(0, "3g.40gb", 4)]),
        [],
        id="created-in-use",
    ),
    pytest.param(
        node([("3g.40gb", 4)], failed=[(0, "3g.40gb", 4)]), ["gpu-0-3g40gb-4"], id="held-by-a-claim"
    ),
    pytest.param(node([("3g.40gb", 0)], failed=[(0, "3g.40gb", 4)]), [], id="not-in-the-spec"),
    pytest.param(node(None, failed=[(0, "3g.40gb", 4)]), [], id="no-plan"),
    pytest.param(node([("3g.40gb", 4)], failed=[(1, "3g.40gb", 4)]), [], id="gpu-not-reported"),
]


@pytest.mark.parametrize(("n", "held"), NEVER_DROPPED)
def test_the_drop_never_takes_what_exists_or_what_a_claim_holds(
    n: MigNode, held: list[str]
) -> None:
    assert abandoned(n, held) == {}
    decision = relay(n, [(f"ns/c{k}", d) for k, d in enumerate(held)])
    assert (decision.dropped, decision.spec) == ((), None)  # nothing to add either


def test_a_half_made_instance_is_never_dropped() -> None:
    """The agent's retry made the GPU instance but not yet its compute instance (no UUID):
    it exists, and only a round's destroy protocol may take it away."""
    n = node([("3g.40gb", 4)], ("3g.40gb", 4, "Free"), failed=[(0, "3g.40gb", 4)])
    assert n.status is not None
    row = n.status.gpus[0].instances[0].model_copy(update={"uuid": ""})
    gpu = n.status.gpus[0].model_copy(update={"instances": [row]})
    n = n.model_copy(update={"status": n.status.model_copy(update={"gpus": [gpu]})})
    assert abandoned(n, []) == {}
    assert relay(n, []).spec is None


def test_a_placement_backing_off_is_not_added_again_for_a_claim() -> None:
    n = node([("3g.40gb", 0)], ("3g.40gb", 0, "Free"))
    decision = relay(n, [("ns/c2", "gpu-0-3g40gb-4")], {"gpu-0-3g40gb-4"})
    assert decision.spec is None
    assert list(decision.backed_off) == [("ns/c2", "gpu-0-3g40gb-4")]
    assert "3g.40gb@4 on GPU 0" in decision.backed_off[("ns/c2", "gpu-0-3g40gb-4")]
    # one the spec still wants is left as it is (the agent's verdict will come)
    again = relay(node([("3g.40gb", 4)]), [("ns/c2", "gpu-0-3g40gb-4")], {"gpu-0-3g40gb-4"})
    assert (again.spec, again.backed_off) == (None, {})


# every placement of an H100, and the states an instance the agent reports may be in
PLACES = sorted((p.name, start) for p in gpu_status(0).table().profiles for start in p.placements)
STATES = ["Free", "Prepared", "Busy"]


@given(
    wanted=st.sets(st.sampled_from(PLACES), max_size=6),
    made=st.dictionaries(st.sampled_from(PLACES), st.sampled_from(STATES), max_size=4),
    failed=st.sets(st.sampled_from(PLACES), max_size=6),
    held=st.sets(st.sampled_from(PLACES), max_size=4),
    cooling=st.sets(st.sampled_from(PLACES), max_size=3),
)
def test_whatever_the_node_says_the_relay_drops_only_failed_placements_nothing_holds(
    wanted: set[tuple[str, int]],
    made: dict[tuple[str, int], str],
    failed: set[tuple[str, int]],
    held: set[tuple[str, int]],
    cooling: set[tuple[str, int]],
) -> None:
    """Any spec, any instances (free, in use, any overlap), any failures, any claims: every
    instance the spec wanted that exists, or that a claim holds, is still wanted by the spec
    the relay writes, and it drops only failed placements that do not exist. (At most
    MAX_INSTANCES_PER_GPU of them in all: the schema's limit on a GPU's spec, above the 7
    instances an H100 holds.)"""
    assume(len(wanted | set(made) | held) <= MAX_INSTANCES_PER_GPU)
    n = node(
        sorted(wanted),
        *((p, s, state) for (p, s), state in sorted(made.items())),
        failed=[(0, p, s) for p, s in sorted(failed)],
    )
    names = {device_name(0, p, s): (p, s) for p, s in PLACES}
    holding = [(f"ns/c{k}", device_name(0, p, s)) for k, (p, s) in enumerate(sorted(held))]
    decision = relay(n, holding, {device_name(0, p, s) for p, s in cooling})
    for device in decision.dropped:
        place = names[device]
        assert place in wanted & failed
        assert place not in set(made) | held
    if decision.spec is not None:
        kept = wants(decision.spec)
        assert wanted & (set(made) | held) <= kept
        assert wanted - kept == {names[d] for d in decision.dropped}

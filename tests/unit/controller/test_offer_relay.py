"""Offer mode's relay: a claim allocated a placement not created yet gets it added to the
node's spec at once, then the binding condition the agent's report calls for; a placement the
agent could not create leaves the spec once no claim holds it. Each test tries to make it do
more than that: overlapping allocations, an NVML error, a standby or a deposed leader, a
placement already in the spec, the next planning round, a retry that succeeded as the relay
dropped it, a claim given it again, an operator started again."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from migpart.api.models import (
    FailedInstance,
    GpuSpec,
    MigInstanceSpec,
    MigNodeSpec,
)
from migpart.clock import ManualClock
from migpart.controller.offer_relay import FAILED_BACKOFF_S
from migpart.controller.relay import BACKING_OFF
from migpart.dra import DRIVER, INSTANCE_FAILED, INSTANCE_READY, DeviceId, as_iso
from migpart.kube.election import Term, Unelected
from migpart.testing.builders import ClaimBuilder, profile_is
from migpart.testing.effects import InMemoryEffects, Refused
from tests.unit.controller.factories import node_body, offered, offline_state, world
from tests.unit.controller.harness import RelayCluster, run

Body = dict[str, Any]


def spec_p1(*instances: tuple[str, int]) -> MigNodeSpec:
    """Plan p1: GPU 0 wants `instances`; GPU 1 is not listed."""
    wanted = [MigInstanceSpec(profile=p, start=s) for p, s in instances]
    return MigNodeSpec(plan_id="p1", gpus=[GpuSpec(index=0, instances=wanted)])


async def test_a_placement_is_added_to_the_spec_then_marked_ready() -> None:
    world_ = RelayCluster(node_body(5, spec_p1(("3g.40gb", 0)), ("3g.40gb", 0, "Free")))
    claim = offered("c1", "gpu-0-3g40gb-4")
    await world_.claim(claim)
    assert world_.wanted() == [("3g.40gb", 0), ("3g.40gb", 4)]
    [(_, spec)] = world_.effects.specs
    assert str(spec.plan_id).startswith("p1+")
    assert world_.effects.claim_devices == []  # not created yet: no verdict
    # the same claim again, and the node as written: nothing more
    await world_.claim(claim)
    await world_.agent(world_.effects.mignodes["a"])
    assert len(world_.effects.specs) == 1
    # the agent created it
    clock = world_.state.clock
    assert isinstance(clock, ManualClock)
    clock.advance(7)
    done = node_body(2000, spec, ("3g.40gb", 0, "Free"), ("3g.40gb", 4, "Free"))
    await world_.agent(done)
    [(key, devices)] = world_.effects.claim_devices
    assert key == "ns/c1"
    assert devices == [
        {
            "driver": DRIVER,
            "pool": "a",
            "device": "gpu-0-3g40gb-4",
            "conditions": [
                {
                    "type": INSTANCE_READY,
                    "status": "True",
                    "reason": "InstanceCreated",
                    "message": "MIG device MIG-0-3g.40gb-4",
                    "lastTransitionTime": as_iso(clock.now()),
                }
            ],
        }
    ]
    # the claim shows it: written once
    claim["status"]["devices"] = devices
    await world_.claim(claim)
    assert len(world_.effects.claim_devices) == 1
    assert world_.effects.events == []


async def test_a_placement_already_in_the_spec_writes_no_spec() -> None:
    world_ = RelayCluster(
        node_body(5, spec_p1(("3g.40gb", 0), ("3g.40gb", 4)), ("3g.40gb", 0, "Free"))
    )
    await world_.claim(offered("c1", "gpu-0-3g40gb-4"))
    assert world_.effects.specs == []
    assert world_.effects.claim_devices == []


async def test_two_claims_on_overlapping_placements_one_is_created_the_other_fails() -> None:
    world_ = RelayCluster(node_body(5, None))
    first, second = offered("c1", "gpu-0-4g40gb-0"), offered("c2", "gpu-0-7g80gb-0")
    await world_.claim(second, first)
    assert world_.wanted() == [("4g.40gb", 0)]
    [(key, devices)] = world_.effects.claim_devices
    assert key == "ns/c2"
    [condition] = devices[0]["conditions"]
    assert (condition["type"], condition["reason"]) == (INSTANCE_FAILED, "PlacementConflict")
    assert "7g.80gb@0 on GPU 0 overlaps 4g.40gb@0" in condition["message"]
    [event] = world_.effects.events
    assert (event.object, event.type, event.reason) == ("c2", "Warning", "PlacementConflict")
    # the spec is written again by the next event: the first keeps its place, the second
    # never gets in, and nothing else is written
    await world_.agent(world_.effects.mignodes["a"])
    assert len(world_.effects.specs) == 1
    assert world_.wanted() == [("4g.40gb", 0)]


async def test_a_placement_over_an_instance_in_use_is_a_conflict_and_nothing_moves() -> None:
    # the spec (p1) dropped 3g.40gb@4, but it is prepared for a claim: it stays
    world_ = RelayCluster(node_body(5, spec_p1(), ("3g.40gb", 4, "Prepared")))
    await world_.claim(offered("c1", "gpu-0-7g80gb-0"))
    assert world_.effects.specs == []
    [(_, devices)] = world_.effects.claim_devices
    assert devices[0]["conditions"][0]["type"] == INSTANCE_FAILED


async def test_a_gpu_the_spec_does_not_list_keeps_every_instance_it_has() -> None:
    """No planId: the spec wants nothing. The relayed spec must list what GPU 0 has, or the
    agent would destroy the free instance; GPU 1 stays unlisted (left alone)."""
    world_ = RelayCluster(node_body(5, None, ("3g.40gb", 0, "Free"), ("1g.10gb", 6, "Free")))
    await world_.claim(offered("c1", "gpu-0-2g20gb-4"))
    assert world_.wanted() == [("1g.10gb", 6), ("2g.20gb", 4), ("3g.40gb", 0)]
    assert [g.index for g in world_.effects.specs[0][1].gpus] == [0]


async def test_an_nvml_error_fails_the_claim_and_touches_nothing_else() -> None:
    world_ = RelayCluster(node_body(5, spec_p1(("3g.40gb", 0)), ("3g.40gb", 0, "Free")))
    claim = offered("c1", "gpu-0-3g40gb-4")
    other = {"driver": "nic.example.com", "pool": "a", "device": "eth0", "conditions": []}
    claim["status"]["devices"] = [other]
    await world_.claim(claim)
    [(_, spec)] = world_.effects.specs
    nvml = "create 3g.40gb@4 on GPU 0: NVML_ERROR_UNKNOWN (Unknown Error)"
    failure = FailedInstance(gpu=0, profile="3g.40gb", start=4, reason="NvmlError", message=nvml)
    await world_.agent(node_body(2000, spec, ("3g.40gb", 0, "Free"), failed=[failure]))
    [(_, devices)] = world_.effects.claim_devices
    assert devices[0] == other  # another driver's entry is kept as it was
    [condition] = devices[1]["conditions"]
    assert (condition["type"], condition["reason"], condition["message"]) == (
        INSTANCE_FAILED,
        "NvmlError",
        nvml,
    )
    assert [e.reason for e in world_.effects.events] == ["NvmlError"]
    assert len(world_.effects.specs) == 1  # no spec written for it


DEPOSED_TERM = Term(3, "me")


@dataclass
class Deposed:
    """Leads when asked first, then no longer (the Lease lost mid-pass)."""

    asked: int = 0
    term: Term = DEPOSED_TERM

    def holds(self, term: Term | None) -> bool:
        self.asked += 1
        return self.asked == 1

    def current(self) -> Term | None:
        return self.term


async def test_a_standby_writes_nothing() -> None:
    effects = InMemoryEffects(mignodes={"a": node_body(5, None)}, leadership=Deposed(asked=1))
    world_ = RelayCluster(node_body(5, None), effects.under(None))
    await world_.claim(offered("c1", "gpu-0-3g40gb-4"))
    assert (effects.specs, effects.claim_devices, effects.refused) == ([], [], [])


async def test_a_leader_deposed_mid_pass_is_fenced() -> None:
    leadership = Deposed()
    effects = InMemoryEffects(mignodes={"a": node_body(5, None)}, leadership=leadership)
    world_ = RelayCluster(node_body(5, None), effects.under(leadership.term))
    await world_.claim(offered("c1", "gpu-0-3g40gb-4"))
    assert effects.specs == []
    assert effects.refused == [Refused("spec", "a")]


def whole_gpu(name: str) -> Body:
    """A pending claim for 7g.80gb: it fits on GPU 0 only where the placement is."""
    body = ClaimBuilder(name, "ns").uid(f"uid-{name}").revision(1)
    return body.request(profile_is("7g.80gb")).obj()


async def test_the_round_after_the_relay_keeps_the_placement() -> None:
    world_ = RelayCluster(node_body(5, spec_p1(("3g.40gb", 0)), ("3g.40gb", 0, "Free"), gpus=1))
    claim = offered("c1", "gpu-0-3g40gb-4")
    await world_.claim(claim)
    relayed = world_.effects.mignodes["a"]
    # the agent created it; the round sees it free and allocated, and a pending claim that
    # would fit only if it were destroyed
    spec = world_.effects.specs[-1][1]
    done = node_body(2000, spec, ("3g.40gb", 0, "Free"), ("3g.40gb", 4, "Free"), gpus=1)
    assert relayed["spec"]["planId"] == done["spec"]["planId"]
    await run(world_.state, world({"a": done}, [claim, whole_gpu("c2")]))
    assert len(world_.effects.specs) == 1  # the round wrote nothing
    assert world_.state.memory("pa").plan[1].unsatisfied


async def test_the_round_before_the_relay_counts_the_placement_as_used() -> None:
    """The relay has not written yet: the snapshot counts the allocated placement as a used
    instance, so the round plans nothing over it (it would destroy the free 3g.40gb@0 and
    create 7g.80gb@0 otherwise)."""
    body = node_body(5, spec_p1(("3g.40gb", 0)), ("3g.40gb", 0, "Free"), gpus=1)
    effects = InMemoryEffects(mignodes={"a": body}, leadership=Unelected())
    state = offline_state(effects)
    await run(state, world({"a": body}, [offered("c1", "gpu-0-3g40gb-4"), whole_gpu("c2")]))
    assert effects.specs == []
    assert state.memory("pa").plan[1].unsatisfied
    # without the allocation the same round does repartition: the test can fail
    assert isinstance(state.clock, ManualClock)
    state.clock.advance(60)  # past the pacing of the first plan
    await run(state, world({"a": body}, [whole_gpu("c2")]))
    [(_, spec)] = effects.specs
    assert [(i.profile, i.start) for i in spec.gpus[0].instances] == [("7g.80gb", 0)]


async def test_a_round_whose_node_the_relay_wrote_meanwhile_plans_again() -> None:
    """The round plans 7g.80gb@0 over the free 3g.40gb@0; inside its destroy window a claim
    is allocated 3g.40gb@4 and the relay writes it into the spec. The round's spec would drop
    it: the round must plan again instead of writing."""
    body = node_body(5, spec_p1(("3g.40gb", 0)), ("3g.40gb", 0, "Free"), gpus=1)
    world_ = RelayCluster(body)
    claim = offered("c1", "gpu-0-3g40gb-4")
    cluster = world({"a": body}, [whole_gpu("c2")])

    async def allocated_meanwhile(node: str, devices: frozenset[str]) -> None:
        cluster.claims["ns/c1"] = claim  # type: ignore[index]  # the claim watch shows it
        world_.effects.claims = [claim]
        await world_.claim(claim)

    world_.state.hooks.after_withdraw = allocated_meanwhile
    await run(world_.state, cluster)
    assert world_.effects.withdrawals == [("a", frozenset({"gpu-0-3g40gb-0"}))]
    for _, spec in world_.effects.specs:
        wanted = {(i.profile, i.start) for g in spec.gpus for i in g.instances}
        assert ("3g.40gb", 4) in wanted
    assert len(world_.effects.specs) == 1  # the relay's; the round wrote none


# ------------------------------------------------------------ a placement that failed


def refused(profile: str, start: int) -> FailedInstance:
    message = f"create {profile}@{start} on GPU 0: NVML_ERROR_INSUFFICIENT_RESOURCES"
    return FailedInstance(gpu=0, profile=profile, start=start, reason="NvmlError", message=message)


def sent_back(name: str, revision: int) -> Body:
    """Claim `name` as kube-scheduler left it after its failure condition: deallocated."""
    body = ClaimBuilder(name, "ns").uid(f"uid-{name}").revision(revision)
    return body.request(profile_is("3g.40gb")).obj()


async def failed_and_sent_back() -> RelayCluster:
    """c1 was allocated 3g.40gb@4 next to a free 3g.40gb@0, the relay added it, NVML refused
    it, and the scheduler deallocated c1 once it failed."""
    world_ = RelayCluster(node_body(5, spec_p1(("3g.40gb", 0)), ("3g.40gb", 0, "Free")))
    await world_.claim(offered("c1", "gpu-0-3g40gb-4"))
    [(_, relayed)] = world_.effects.specs
    failed = [refused("3g.40gb", 4)]
    await world_.reported(node_body(2000, relayed, ("3g.40gb", 0, "Free"), failed=failed))
    # c1 still holds it: failed, and kept wanted (the agent retries it)
    [(_, devices)] = world_.effects.claim_devices
    assert devices[0]["conditions"][0]["type"] == INSTANCE_FAILED
    assert len(world_.effects.specs) == 1
    await world_.claim(sent_back("c1", 3))
    return world_


async def test_a_failed_placement_leaves_the_spec_once_no_claim_holds_it() -> None:
    world_ = await failed_and_sent_back()
    [_, (_, dropped)] = world_.effects.specs
    assert world_.wanted() == [("3g.40gb", 0)]  # the free instance stays
    assert str(dropped.plan_id).startswith("p1+")
    assert world_.relay.backing_off("a") == {"gpu-0-3g40gb-4"}
    assert world_.relay.backing_off_devices() == {DeviceId("a", "gpu-0-3g40gb-4")}
    # the agent carried it out and no longer reports it failed: nothing more to write
    await world_.reported(node_body(3000, dropped, ("3g.40gb", 0, "Free")))
    assert len(world_.effects.specs) == 2
    assert len(world_.effects.claim_devices) == 1
    # the back-off ends: offered, and planned, again
    told: list[str] = []
    world_.relay.changed = told.append
    world_.relay.expire()
    assert (world_.relay.backing_off("a"), told) == ({"gpu-0-3g40gb-4"}, [])
    clock = world_.state.clock
    assert isinstance(clock, ManualClock)
    clock.advance(FAILED_BACKOFF_S)
    world_.relay.expire()
    assert (world_.relay.backing_off("a"), world_.relay.backoffs, told) == (set(), {}, ["a"])


async def test_a_retry_the_agent_made_as_the_relay_dropped_it_is_kept() -> None:
    """The watch still shows 3g.40gb@4 failed; the API server already has the agent's report
    of its retry, which created it. The drop goes over the MigNode as the relay read it: a
    409, nothing written; the next event shows a free instance, which the relay never drops
    (only a round's destroy protocol may)."""
    spec = spec_p1(("3g.40gb", 0), ("3g.40gb", 4))
    seen = node_body(5, spec, ("3g.40gb", 0, "Free"), failed=[refused("3g.40gb", 4)])
    made = node_body(6, spec, ("3g.40gb", 0, "Free"), ("3g.40gb", 4, "Free"))
    world_ = RelayCluster(seen, InMemoryEffects(mignodes={"a": made}))
    world_.relay.node_changed("a")
    await world_.relay.idle()
    assert world_.effects.specs == []
    assert world_.relay.backing_off("a") == frozenset()  # the drop was not written
    await world_.agent(made)
    world_.relay.settle("a")
    await world_.relay.idle()
    assert world_.effects.specs == []
    assert world_.effects.claim_devices == []


async def test_a_claim_given_a_placement_backing_off_fails_at_once() -> None:
    """After the drop, a claim is allocated the same placement (a slice published before
    the back-off, an operator started again): it is not created again meanwhile."""
    world_ = await failed_and_sent_back()
    await world_.claim(offered("c2", "gpu-0-3g40gb-4", revision=4))
    assert len(world_.effects.specs) == 2  # not added back
    assert world_.wanted() == [("3g.40gb", 0)]
    (key, devices) = world_.effects.claim_devices[-1]
    [condition] = devices[0]["conditions"]
    assert (key, condition["type"], condition["reason"]) == ("ns/c2", INSTANCE_FAILED, BACKING_OFF)
    assert world_.effects.events[-1].reason == BACKING_OFF
    assert world_.relay.refused == {"a": frozenset({"gpu-0-3g40gb-4"})}


async def test_an_operator_started_again_drops_what_the_last_one_left() -> None:
    """Killed after the claim was deallocated, before it dropped the placement: the new
    leader knows no claim on the node, but its agent reports the failure."""
    spec = spec_p1(("3g.40gb", 0), ("3g.40gb", 4))
    world_ = RelayCluster(
        node_body(5, spec, ("3g.40gb", 0, "Free"), failed=[refused("3g.40gb", 4)])
    )
    world_.relay.claims_listed([])
    world_.relay.settle_all()
    await world_.relay.idle()
    assert world_.wanted() == [("3g.40gb", 0)]
    assert world_.relay.backing_off("a") == {"gpu-0-3g40gb-4"}


async def test_a_round_plans_nothing_on_a_placement_backing_off() -> None:
    """7g.80gb@0 failed and was dropped; a pending claim fits nowhere else. The round counts
    it as used until the back-off ends, then plans it again."""
    world_ = RelayCluster(
        node_body(5, spec_p1(("7g.80gb", 0)), failed=[refused("7g.80gb", 0)], gpus=1)
    )
    world_.relay.settle_all()
    await world_.relay.idle()
    [(_, dropped)] = world_.effects.specs
    done = node_body(3000, dropped, gpus=1)
    await world_.reported(done)
    await run(world_.state, world({"a": done}, [whole_gpu("c2")]))
    assert len(world_.effects.specs) == 1
    assert world_.state.memory("pa").plan[1].unsatisfied
    clock = world_.state.clock
    assert isinstance(clock, ManualClock)
    clock.advance(FAILED_BACKOFF_S)
    world_.relay.expire()
    await run(world_.state, world({"a": done}, [whole_gpu("c2")]))
    [_, (_, planned)] = world_.effects.specs
    assert [(i.profile, i.start) for i in planned.gpus[0].instances] == [("7g.80gb", 0)]


async def test_a_round_during_the_back_off_never_wants_the_placement_again() -> None:
    """3g.40gb@4 failed and was dropped. A round that plans a 1g.10gb on the same GPU plans
    beside it (it counts as used), and the spec it writes does not want it back."""
    body = node_body(5, spec_p1(("3g.40gb", 4)), failed=[refused("3g.40gb", 4)], gpus=1)
    world_ = RelayCluster(body)
    world_.relay.settle_all()
    await world_.relay.idle()
    [(_, dropped)] = world_.effects.specs
    done = node_body(3000, dropped, gpus=1)
    await world_.reported(done)
    small = ClaimBuilder("c3", "ns").uid("uid-c3").revision(1).request(profile_is("1g.10gb"))
    await run(world_.state, world({"a": done}, [small.obj()]))
    [_, (_, planned)] = world_.effects.specs
    wanted = [(i.profile, i.start) for i in planned.gpus[0].instances]
    assert [profile for profile, _ in wanted] == ["1g.10gb"]
    assert all(start < 4 for _, start in wanted)  # not over memory slices 4-7

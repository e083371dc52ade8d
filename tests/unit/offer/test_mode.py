"""The allocation mode in effect: `spec.allocation` resolved against what the API server serves,
and how a round reports it (status.allocation, a Warning Event when Offer falls back)."""

from __future__ import annotations

from typing import Any

import pytest

from migpart.api.models import AllocationMode
from migpart.controller.rounds.reconcile import PolicyRound
from migpart.controller.watching.indexes import Cluster
from migpart.kube.features import DraFeatures
from migpart.kube.placement import NodeFacts
from migpart.offer.mode import DRY_RUN, NOT_PUBLISHING, fell_back, resolve_allocation
from migpart.slices.dra import DRIVER
from migpart.testing.effects import InMemoryEffects
from tests.unit.controller.factories import DEVICE_CLASS, mignode, offline_state, policy
from tests.unit.kube.factories import gpu

SERVED = DraFeatures(True, True, "served: partitionable devices, device taints")
NO_TAINTS = DraFeatures(True, False, "served: partitionable devices; not served: device taints")
NONE = DraFeatures(False, False, "not served: partitionable devices, device taints")
UNKNOWN = DraFeatures.unknown("could not ask the API server: HTTP 503 Service Unavailable")
# the mode a served Offer or Auto gets by default: Reactive unless the operator publishes
# offers (`--offer-publishing`, off by default)
OFFERED = "Reactive"


@pytest.mark.parametrize(
    ("requested", "features", "mode"),
    [
        ("Reactive", SERVED, "Reactive"),
        ("Reactive", NONE, "Reactive"),
        ("Auto", SERVED, OFFERED),
        ("Auto", NO_TAINTS, OFFERED),
        ("Auto", NONE, "Reactive"),
        ("Auto", UNKNOWN, "Reactive"),
        ("Offer", SERVED, OFFERED),
        ("Offer", NO_TAINTS, OFFERED),
        ("Offer", NONE, "Reactive"),
        ("Offer", UNKNOWN, "Reactive"),
    ],
)
def test_the_mode_in_effect(requested: AllocationMode, features: DraFeatures, mode: str) -> None:
    resolved = resolve_allocation(requested, features, publishing=False)
    assert resolved.mode == mode
    assert fell_back(requested, resolved) == (requested == "Offer" and mode == "Reactive")


def test_a_fallback_says_what_the_server_does_not_serve() -> None:
    resolved = resolve_allocation("Offer", NONE, publishing=True)
    assert resolved.reason.startswith("Offer requested but not served")
    assert "not served: partitionable devices" in resolved.reason
    assert resolved.reason.endswith("falling back to Reactive")
    assert "HTTP 503" in resolve_allocation("Auto", UNKNOWN, publishing=True).reason


@pytest.mark.parametrize("publishing", [False, True])
def test_what_is_not_served_falls_back_with_or_without_publishing(publishing: bool) -> None:
    resolved = resolve_allocation("Auto", NONE, publishing=publishing)
    assert resolved.mode == "Reactive"
    assert NOT_PUBLISHING not in resolved.reason


def test_without_offer_publishing_a_served_offer_says_it_publishes_reactively() -> None:
    resolved = resolve_allocation("Auto", SERVED, publishing=False)
    assert resolved.reason == f"Auto: Offer served; {NOT_PUBLISHING}"
    assert resolved.mode == "Reactive"  # the column never says Offer over reactive slices


@pytest.mark.parametrize("requested", ["Offer", "Auto"])
def test_with_offer_publishing_a_served_offer_is_offer(requested: AllocationMode) -> None:
    resolved = resolve_allocation(requested, SERVED, publishing=True)
    assert (resolved.mode, resolved.reason) == ("Offer", f"{requested}: Offer served")
    assert resolve_allocation("Reactive", SERVED, publishing=True).mode == "Reactive"


def world(generation: int = 1, **spec: Any) -> Cluster:
    nodes = {"a": mignode("a", 1, gpus=[gpu(0)])}
    return Cluster(
        mignodes=nodes,
        node_labels={"a": {"pool": "a"}},
        policies={"pa": policy("pa", "a", generation, **spec)},
        claims={},
        waiting={},
        device_classes={DRIVER: DEVICE_CLASS},
        node_facts={"a": NodeFacts({"pool": "a"}, ())},
    )


async def run_round(effects: InMemoryEffects, features: DraFeatures, cluster: Cluster) -> None:
    state = offline_state(effects)
    state.offer.dra = features
    await PolicyRound(state, "pa", cluster.policies["pa"], cluster).run()


@pytest.mark.parametrize(("features", "mode"), [(SERVED, OFFERED), (NONE, "Reactive")])
async def test_a_round_reports_the_mode_in_effect(features: DraFeatures, mode: str) -> None:
    effects = InMemoryEffects()
    await run_round(effects, features, world())
    [(_, status)] = effects.statuses
    assert status.allocation is not None
    assert status.allocation.mode == mode
    assert status.allocation.reason.startswith("Auto")
    assert effects.events == []


async def test_offer_not_served_is_a_warning_once_per_generation() -> None:
    effects = InMemoryEffects()
    state = offline_state(effects)
    state.offer.dra = NONE
    for generation in (1, 1, 2):
        cluster = world(generation, allocation="Offer")
        await PolicyRound(state, "pa", cluster.policies["pa"], cluster).run()
    assert [(e.type, e.reason) for e in effects.events] == [("Warning", "OfferNotServed")] * 2
    assert effects.events[0].message.startswith("Offer requested but not served")
    status = effects.statuses[-1][1]
    assert status.allocation is not None
    assert status.allocation.mode == "Reactive"


async def test_a_dry_run_policy_offers_nothing_and_says_so() -> None:
    effects = InMemoryEffects()
    state = offline_state(effects)
    state.offer.dra = SERVED
    state.offer.publishing = True
    cluster = world(allocation="Offer", mode="DryRun")
    await PolicyRound(state, "pa", cluster.policies["pa"], cluster).run()
    [(_, status)] = effects.statuses
    assert status.allocation is not None
    assert status.allocation.mode == "Reactive"  # its nodes publish reactively
    assert status.allocation.reason == f"Offer: Offer served; {DRY_RUN}"
    assert effects.events == []  # served: no OfferNotServed
    assert not state.offer.nodes.offered("a")

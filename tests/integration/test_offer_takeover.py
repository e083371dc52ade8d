"""A new leader takes over an offering node without writing its pool, on the real API server.

Two operators run in-process with `--offer-publishing` and elect a leader through one Lease.
The first leads and publishes the node's pool: its offer on 1.36+ (an Auto policy runs Offer),
reactive mode's slice on 1.34 (offers not served: the policy falls back to Reactive). The
second is a warm standby; the first stops and releases the Lease, and the second takes over.
Its view computes the pool the first wrote, so it writes none: the pool keeps its generation
(issue 35: "the operator restarted: pool unchanged, same generation"). A take-over that did not
first say which nodes offer would write reactive mode's slice over the pool (every placement
gone while kube-scheduler may be allocating one), then the pool again after its first round.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

import pytest

from migpart.controller.core.state import OperatorState
from migpart.controller.runtime.handlers import Election
from migpart.slices.dra import DRIVER
from migpart.testbed import Testbed
from tests.integration.conftest import (
    LONG_LEASE_TIMEOUT_S,
    RunningOperator,
    apply,
    eventually,
    get,
    gpu_status,
    policy_body,
    put_mignode,
    running_operator,
)

pytestmark = pytest.mark.integration

NODE = "takeover-a"
LABELS = {"migpart-test": "takeover"}
POLICY = "takeover"
LEASE = "migpart-takeover"
# the node's one instance: all that reactive mode's slice lists
REACTIVE = ["gpu-0-3g40gb-0"]

Pool = tuple[int, list[str]]


def electing(cluster: Testbed, identity: str) -> AbstractContextManager[RunningOperator]:
    """An operator that publishes offers and campaigns for the test's Lease as `identity`."""
    election = Election(namespace="default", name=LEASE, identity=identity)
    return running_operator(
        cluster, lease_timeout_s=LONG_LEASE_TIMEOUT_S, offer_publishing=True, election=election
    )


def state_of(running: RunningOperator) -> OperatorState:
    state: OperatorState = running.memo.state
    return state


def pool(bed: Testbed) -> Pool | None:
    """The node's pool as (generation, device names), once every slice of one generation is
    there (None before)."""
    slices = [
        s
        for s in get(bed, "resourceslices")["items"]
        if s["spec"]["driver"] == DRIVER and s["spec"]["pool"]["name"] == NODE
    ]
    shapes = {
        (s["spec"]["pool"]["generation"], s["spec"]["pool"]["resourceSliceCount"]) for s in slices
    }
    if len(shapes) != 1:
        return None
    [(generation, count)] = shapes
    if count != len(slices):
        return None
    return generation, sorted(d["name"] for s in slices for d in s["spec"].get("devices") or [])


def mode(bed: Testbed) -> str | None:
    status = get(bed, "gpupartitionpolicy", POLICY).get("status") or {}
    return (status.get("allocation") or {}).get("mode")


def warm(running: RunningOperator, published: Pool) -> bool:
    """Whether the standby's watches have listed, its slice view holding the pool as it is."""
    state = state_of(running)
    watches = state.watches
    if watches.mignodes is None or not all(
        i.synced.is_set() for i in [*watches.watched.values(), watches.mignodes]
    ):
        return False
    seen = state.publisher.view.slices(NODE)
    return bool(seen) and {s.generation for s in seen.values()} == {published[0]}


def took_over(running: RunningOperator) -> bool:
    """Whether the operator leads, its take-over is done and its policy's first round ran."""
    state = state_of(running)
    metrics = state.metrics
    return (
        metrics.leader._value.get() == 1
        and not any(t.get_name() == "take-over" for t in list(state.running.tasks))
        and metrics.rounds.labels(POLICY)._value.get() >= 1
    )


def test_a_new_leader_writes_no_reactive_slice_over_an_offering_nodes_pool(
    cluster: Testbed,
) -> None:
    cluster.add_node(NODE, LABELS)
    put_mignode(cluster, NODE, [gpu_status(0, [("3g.40gb", 0)])])
    with electing(cluster, "first") as first:
        apply(cluster, policy_body(POLICY, LABELS))
        in_effect = eventually(lambda: mode(cluster))
        offering = in_effect == "Offer"

        def published() -> Pool | None:
            now = pool(cluster)
            return now if now is not None and (now[1] != REACTIVE) == offering else None

        eventually(published)
        with electing(cluster, "second") as second:
            before = eventually(published)
            eventually(lambda: warm(second, before))
            assert state_of(second).metrics.leader._value.get() == 0  # a standby
            first.shut_down()  # releases the Lease: the standby takes it at its next try
            eventually(lambda: took_over(second))
            # no slice written: neither reactive mode's nor the offer pool again
            assert second.steps(NODE) == []
            assert pool(cluster) == before
            assert state_of(second).offer.nodes.offered(NODE) == offering
    if not offering:
        # 1.34: partitionable devices not served, Auto runs Reactive
        assert in_effect == "Reactive"
        assert before[1] == REACTIVE

"""The operator in memory, for the controller tests: its state on the in-memory Effects port,
a policy round over a world, the index views the loop reads, and the offer relay's cluster."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from migpart.clock import ManualClock
from migpart.controller.indexes import Indexes, object_entry
from migpart.controller.offer_relay import OfferRelay
from migpart.controller.reconcile import PolicyRound
from migpart.controller.scope import Cluster
from migpart.controller.state import OperatorState
from migpart.kube.watch import Index
from migpart.testing.effects import InMemoryEffects
from tests.unit.controller.factories import offline_state


def operator(effects: InMemoryEffects) -> OperatorState:
    return offline_state(effects)


def clock_of(state: OperatorState) -> ManualClock:
    """The manual clock of an `operator(...)`, for the test to move time on."""
    assert isinstance(state.clock, ManualClock)
    return state.clock


async def run(state: OperatorState, cluster: Cluster) -> PolicyRound:
    round_ = PolicyRound(state, "pa", cluster.policies["pa"], cluster)
    await round_.run()
    return round_


def indexed(state: OperatorState, cluster: Cluster) -> OperatorState:
    """`state` with index views of `cluster` (key -> stored values)."""

    def one_each(values: Mapping[str, Any]) -> dict[str, list[Any]]:
        return {k: [v] for k, v in values.items()}

    state.indexes = Indexes(
        mignodes=one_each(cluster.mignodes),
        nodes=one_each(cluster.node_facts),
        policies=one_each(cluster.policies),
        claims=one_each(cluster.claims),
        waiting={k: list(v) for k, v in cluster.waiting.items()},
        classes=one_each(cluster.device_classes),
    )
    return state


class RelayCluster:
    """An operator state on the in-memory port, its MigNode index and the relay."""

    def __init__(self, mignode: dict[str, Any], effects: InMemoryEffects | None = None) -> None:
        self.effects = effects or InMemoryEffects(mignodes={"a": mignode})
        self.state: OperatorState = offline_state(self.effects)
        self.index = Index(object_entry)
        self.index.listed([mignode])
        empty: dict[str, Any] = {}
        self.state.indexes = Indexes(self.index, empty, empty, empty, empty, empty)
        self.relay = OfferRelay(self.state)
        self.state.relay = self.relay

    async def claim(self, *claims: dict[str, Any]) -> None:
        for c in claims:
            self.relay.claim_changed("MODIFIED", c)
        await self.relay.idle()

    async def agent(self, body: dict[str, Any]) -> None:
        """The agent reports (a MigNode event)."""
        self.index.changed("MODIFIED", body)
        self.relay.node_changed("a")
        await self.relay.idle()

    async def reported(self, body: dict[str, Any]) -> None:
        """The agent wrote its status: the API server has it (what a spec is written over),
        then the watch shows it."""
        self.effects.mignodes["a"] = body
        await self.agent(body)

    def wanted(self) -> list[tuple[str, int]]:
        spec = self.effects.specs[-1][1]
        return sorted((i.profile, i.start) for g in spec.gpus if g.index == 0 for i in g.instances)

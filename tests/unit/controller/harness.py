"""The operator in memory, for the controller tests: its state on the in-memory Effects port,
a policy round over a world, and the index views the loop reads."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from migpart.clock import ManualClock
from migpart.controller.core.state import OperatorState
from migpart.controller.rounds.reconcile import PolicyRound
from migpart.controller.watching.indexes import Cluster, Indexes
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

    state.watches.indexes = Indexes(
        mignodes=one_each(cluster.mignodes),
        nodes=one_each(cluster.node_facts),
        policies=one_each(cluster.policies),
        claims=one_each(cluster.claims),
        waiting={k: list(v) for k, v in cluster.waiting.items()},
        classes=one_each(cluster.device_classes),
    )
    return state

"""The agent refuses a spec from an older operator leadership (a lower spec.leaderTerm than one
it applied), with a Warning Event, and keeps the highest token in its status across restarts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from migpart.agent.kube import leader_term_of, status_patch
from migpart.agent.metrics import AgentMetrics
from migpart.agent.runner import Agent
from migpart.agent.simulator import SimulatedNvml
from migpart.api.models import GpuSpec, MigInstanceSpec, MigNodeSpec, MigNodeStatus
from migpart.testing.mignodes import InMemoryMigNodes
from tests.unit.agent.helpers import running

if TYPE_CHECKING:
    from migpart.agent.checkpoint import Checkpoint


def spec(plan: str, term: int | None, *instances: tuple[str, int]) -> MigNodeSpec:
    gpu = GpuSpec(index=0, instances=[MigInstanceSpec(profile=p, start=s) for p, s in instances])
    return MigNodeSpec(plan_id=plan, gpus=[gpu], leader_term=term)


def profiles(status: MigNodeStatus) -> list[str]:
    return sorted(i.profile for i in status.gpus[0].instances)


async def test_a_spec_from_an_older_leadership_is_refused_and_nothing_of_it_applied(
    sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    store = InMemoryMigNodes(spec("new", 5, ("7g.80gb", 0)))
    agent = Agent("node-a", sim, checkpoint, store, AgentMetrics("node-a"), resync_s=3600)
    async with running(agent):
        done = await store.wait_for(lambda s: s.observed_plan_id == "new")
        assert done.leader_term == 5
        await store.set_spec(spec("stale", 4, ("1g.10gb", 0), ("1g.10gb", 1)))
        await store.wait_for_warning()
        await store.set_spec(spec("newer", 6, ("3g.40gb", 0)))  # a newer one still goes
        after = await store.wait_for(lambda s: s.observed_plan_id == "newer")
    assert after.leader_term == 6
    assert all(s.observed_plan_id != "stale" for s in store.statuses)
    # the stale spec's 1g.10gb were never created
    assert all("1g.10gb" not in profiles(s) for s in store.statuses if s.gpus)
    [(reason, message)] = store.warnings
    assert reason == "SpecRefused"
    assert "leadership 4" in message
    assert "leadership 5" in message


async def test_a_restarted_agent_refuses_by_the_token_in_its_status(
    sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    """The highest token lives in status.leaderTerm: a new agent process reads it back, and a
    stale spec that landed while it was down is refused at start."""
    store = InMemoryMigNodes(spec("stale", 2, ("7g.80gb", 0)), leader_term=3)
    agent = Agent("node-a", sim, checkpoint, store, AgentMetrics("node-a"), resync_s=3600)
    async with running(agent):
        first = await store.wait_for(lambda s: bool(s.gpus))
    assert first.gpus[0].instances == []
    assert first.observed_plan_id is None
    assert first.leader_term == 3
    assert [r for r, _ in store.warnings] == ["SpecRefused"]
    assert leader_term_of(status_patch(first)) == 3


async def test_a_spec_without_a_token_is_applied_and_keeps_the_highest_token(
    sim: SimulatedNvml, checkpoint: Checkpoint
) -> None:
    """No token: an operator without leader election (or from before it) wrote it."""
    store = InMemoryMigNodes(spec("unfenced", None, ("7g.80gb", 0)), leader_term=3)
    agent = Agent("node-a", sim, checkpoint, store, AgentMetrics("node-a"), resync_s=3600)
    async with running(agent):
        done = await store.wait_for(lambda s: s.observed_plan_id == "unfenced")
    assert profiles(done) == ["7g.80gb"]
    assert done.leader_term == 3
    assert store.warnings == []

"""The search is skipped only where it could neither satisfy more nor destroy less."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from migpart.planning import planner
from migpart.planning.bounds import search_cannot_improve
from migpart.planning.model import GpuState, InstanceState, NodeState, PolicyView, Request, Snapshot
from tests.unit.planning.strategies import policies, request_lists, snapshots


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots(max_nodes=3, max_gpus=2), request_lists(), policies())
def test_a_skipped_search_could_not_have_served_more_or_destroyed_less(
    snapshot: Snapshot, requests: list[Request], policy: PolicyView
) -> None:
    skipped = planner.plan(snapshot, requests, policy)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(planner, "search_cannot_improve", lambda *_: False)
        searched = planner.plan(snapshot, requests, policy)
    served = {a.request for a in skipped.assignments}
    assert {a.request for a in searched.assignments} <= served | set(skipped.unsatisfied)
    assert len(searched.assignments) == len(skipped.assignments)
    assert searched.stats.destroyed <= skipped.stats.destroyed or skipped.stats.destroyed > 0


def test_a_request_that_fits_nowhere_beside_used_instances_cannot_be_improved() -> None:
    model = "NVIDIA H100 80GB HBM3"
    used = GpuState("n1", 0, model, (InstanceState("3g.40gb", 0, used=True),))
    snapshot = Snapshot(nodes=(NodeState("n1", (used,)),))
    big = Request("big", ("7g.80gb",))
    small = Request("small", ("3g.40gb",))
    result = planner.plan(snapshot, [big, small])
    assert result.unsatisfied == ("big",)
    assert search_cannot_improve(snapshot, [big, small], result)
    # With the 3g free rather than used, destroying it could serve `big`: the search runs.
    free = GpuState("n1", 0, model, (InstanceState("3g.40gb", 0),))
    assert not search_cannot_improve(Snapshot(nodes=(NodeState("n1", (free,)),)), [big], result)

"""Property tests: every plan for a random snapshot is correct per the plan contract."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from migpart.planning.planner import plan
from tests.unit.planning.contract import check_plan
from tests.unit.planning.strategies import policies, request_lists, snapshots

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(data=st.data())
def test_every_plan_is_correct(data: st.DataObject) -> None:
    snapshot = data.draw(snapshots())
    names = tuple(n.name for n in snapshot.nodes)
    requests = data.draw(request_lists(names))
    policy = data.draw(policies())
    result = plan(snapshot, requests, policy)
    check_plan(snapshot, requests, policy, result)
    assert plan(snapshot, requests, policy) == result, "deterministic"


@SETTINGS
@given(data=st.data())
def test_no_request_loses_to_lower_priority(data: st.DataObject) -> None:
    """Dropping every lower-priority request never lets more high-priority ones through."""
    snapshot = data.draw(snapshots(max_nodes=2, max_gpus=2))
    requests = data.draw(request_lists())
    result = plan(snapshot, requests)
    top = max((r.priority for r in requests), default=0)
    only_top = [r for r in requests if r.priority == top]
    alone = plan(snapshot, only_top)
    satisfied_top = {a.request for a in result.assignments} & {r.name for r in only_top}
    assert len(satisfied_top) >= len(alone.assignments)

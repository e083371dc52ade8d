"""The policy status a round builds on: our own last write beats a body the watch has not
refreshed yet, so `lastPlan` never goes back to an older round."""

from __future__ import annotations

from typing import Any

from migpart.controller.rounds.status import previous_status


def last_plan(plan_id: str) -> dict[str, Any]:
    return {
        "planId": plan_id,
        "time": "2026-11-23T06:03:08Z",
        "durationMillis": 1.5,
        "satisfied": 1,
        "unsatisfied": 0,
        "created": 1,
        "destroyed": 0,
    }


def policy(uid: str, plan_id: str | None) -> dict[str, Any]:
    status = {"lastPlan": last_plan(plan_id)} if plan_id else {}
    return {"metadata": {"name": "p", "uid": uid}, "spec": {}, "status": status}


def test_our_last_write_wins_over_a_stale_body() -> None:
    stale = policy("uid-1", "older")
    got = previous_status(stale, ("uid-1", {"lastPlan": last_plan("newer")}))
    assert got.last_plan is not None
    assert got.last_plan.plan_id == "newer"


def test_the_body_counts_after_a_restart() -> None:
    got = previous_status(policy("uid-1", "before-restart"), None)
    assert got.last_plan is not None
    assert got.last_plan.plan_id == "before-restart"


def test_a_write_for_a_deleted_policy_of_the_same_name_is_ignored() -> None:
    recreated = policy("uid-2", None)
    got = previous_status(recreated, ("uid-1", {"lastPlan": last_plan("of-the-old-one")}))
    assert got.last_plan is None


def test_a_status_someone_else_broke_is_started_afresh() -> None:
    body = policy("uid-1", None)
    body["status"] = {"lastPlan": {"planId": 7}}
    assert previous_status(body).last_plan is None

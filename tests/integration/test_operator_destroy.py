"""The destroy protocol against the real API server (docs/destroy-protocol.md).

A free instance that a plan destroys is first withdrawn from the node's ResourceSlice, then the
claims are read with a quorum read, and only then does MigNode.spec drop it. When a claim got the
device in that window, the device is published again and stays in the spec.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from migpart.slices.dra import DRIVER
from migpart.testbed import Testbed
from tests.integration.conftest import (
    PROFILE_IS,
    RunningOperator,
    add_mignode,
    allocate,
    apply,
    claim_body,
    events,
    eventually,
    get_or_none,
    gpu_status,
    mignode_spec,
    pending_claim,
    policy_body,
)

pytestmark = pytest.mark.integration

BIG = "gpu-0-7g80gb-0"


def _slice_devices(bed: Testbed, node: str) -> list[str]:
    body = get_or_none(bed, "resourceslice", f"{node}-{DRIVER}")
    return sorted(d["name"] for d in ((body or {}).get("spec") or {}).get("devices") or [])


def _spec_profiles(bed: Testbed, node: str) -> list[str] | None:
    """The profiles MigNode.spec asks for on GPU 0, or None while the spec holds no plan."""
    spec = mignode_spec(bed, node)
    if not spec.get("planId"):
        return None
    gpus = [g for g in spec.get("gpus", []) if g["index"] == 0]
    return sorted(i["profile"] for i in gpus[0]["instances"]) if gpus else []


def _node_with_a_free_7g(bed: Testbed, node: str, label: str) -> None:
    """A node whose only GPU holds one free 7g.80gb, a policy over it, and the device published."""
    add_mignode(bed, node, {"migpart-test": label}, [gpu_status(0, [("7g.80gb", 0)])])
    apply(
        bed,
        policy_body(
            f"policy-{label}", {"migpart-test": label}, reconfiguration={"batchWindowSeconds": 0}
        ),
    )
    eventually(lambda: _slice_devices(bed, node) == [BIG])


def test_device_is_withdrawn_before_it_leaves_the_spec(
    cluster: Testbed, operator: RunningOperator
) -> None:
    node = "destroy-d"
    _node_with_a_free_7g(cluster, node, "d")
    seen: list[tuple[list[str], list[str] | None]] = []

    async def look(name: str, gone: frozenset[str]) -> None:
        if name == node:
            # What the API server holds between the withdrawal and the spec write.
            devices = await asyncio.to_thread(_slice_devices, cluster, node)
            spec = await asyncio.to_thread(_spec_profiles, cluster, node)
            seen.append((devices, spec))

    operator.hooks.after_withdraw = look
    # Only destroying the free 7g.80gb makes room for a 1g.10gb.
    pending_claim(cluster, "claim-d", "1g.10gb", pod="pod-d")

    def dropped() -> list[str]:
        profiles = _spec_profiles(cluster, node)
        assert profiles is not None
        assert "7g.80gb" not in profiles
        return profiles

    assert "1g.10gb" in eventually(dropped)
    # In the window the slice no longer offered the device and the spec still held no plan.
    assert seen
    assert seen[0] == ([], None)

    # The spec_written entry is made once the write returns, which can be after `dropped` saw it.
    def journalled() -> bool:
        steps = [(e.step, e.devices) for e in operator.steps(node) if e.step != "slice_published"]
        assert steps[:3] == [
            ("withdrawn", frozenset({BIG})),
            ("confirmed", frozenset({BIG})),
            ("spec_written", frozenset()),
        ]
        return True

    eventually(journalled)


def test_device_allocated_while_withdrawn_is_kept(
    cluster: Testbed, operator: RunningOperator
) -> None:
    node = "destroy-e"
    _node_with_a_free_7g(cluster, node, "e")
    # A claim that nothing plans for (no pod uses it): the "scheduler" gives it the 7g.80gb.
    apply(cluster, claim_body("holder-e", "default", PROFILE_IS.format("7g.80gb")))
    raced: list[frozenset[str]] = []

    async def race(name: str, gone: frozenset[str]) -> None:
        if name == node and not raced:
            raced.append(gone)
            # The allocation lands after the withdrawal and before the protocol's quorum read:
            # the window the protocol exists for.
            await asyncio.to_thread(allocate, cluster, "holder-e", "default", node, BIG)

    operator.hooks.after_withdraw = race
    pending_claim(cluster, "claim-e", "1g.10gb", pod="pod-e")

    aborted = eventually(lambda: events(cluster, "policy-e", reason="DestroyAborted"))
    assert BIG in aborted[0]["message"]
    assert aborted[0]["type"] == "Warning"
    assert raced == [frozenset({BIG})]
    # Published again, and the spec never drops it: the allocated device now counts as used, and
    # with the GPU full the 1g.10gb claim stays unserved rather than costing someone's device.
    eventually(lambda: _slice_devices(cluster, node) == [BIG])
    profiles = _spec_profiles(cluster, node)
    assert profiles is None or profiles == ["7g.80gb"]
    steps = [e.step for e in operator.steps(node)]
    assert "kept" in steps
    assert "confirmed" not in steps
    kept = next(e for e in operator.steps(node) if e.step == "kept")
    assert kept.devices == frozenset({BIG})
    # Later rounds (the pod is still pending) neither withdraw it again nor write a spec.
    time.sleep(3)  # about fifteen rounds at the fixture's 0.2 s tick: time to do it wrong
    assert [e.step for e in operator.steps(node)].count("withdrawn") == 1
    assert "spec_written" not in [e.step for e in operator.steps(node)]

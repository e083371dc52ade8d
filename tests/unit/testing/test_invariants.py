"""The invariant checkers: destroyed while allocated, ordered by resourceVersion whichever
watch delivers first; and no memory slice allocated twice."""

from __future__ import annotations

from typing import Any

from migpart.mig import lookup_table
from migpart.slices.dra import DRIVER
from migpart.testing.builders import ClaimBuilder, MigNodeBuilder
from migpart.testing.invariants import DestroyedWhileAllocated, Violation, overlapping_allocations

DEVICE = "gpu-0-1g10gb-0"


def mignode(revision: int, *starts: int) -> dict[str, Any]:
    instances = [{"profile": "1g.10gb", "start": s} for s in starts]
    status = {"gpus": [{"index": 0, "instances": instances}]}
    return MigNodeBuilder("n1").revision(revision).status(status).obj()


def claim(revision: int, *devices: str, driver: str = DRIVER) -> dict[str, Any]:
    body = ClaimBuilder("c1", "ns").revision(revision).request()
    for device in devices:
        body.allocated("n1", device, driver=driver)
    return body.obj()


def test_a_device_gone_while_its_claim_holds_it_is_a_violation() -> None:
    ledger = DestroyedWhileAllocated()
    ledger.on_mignode("ADDED", mignode(1, 0))
    ledger.on_claim("MODIFIED", claim(2, DEVICE))
    ledger.on_mignode("MODIFIED", mignode(3))
    assert ledger.violations == [Violation("n1", DEVICE, "ns/c1")]
    assert str(ledger.violations[0]) == f"n1/{DEVICE} (held by ns/c1)"


def test_order_is_by_revision_not_by_delivery() -> None:
    ledger = DestroyedWhileAllocated()
    ledger.on_mignode("ADDED", mignode(1, 0))
    ledger.on_mignode("MODIFIED", mignode(5))
    # allocated at 3, before it vanished at 5, delivered after
    ledger.on_claim("MODIFIED", claim(3, DEVICE))
    assert len(ledger.violations) == 1
    # allocated at 7, after it vanished: no violation
    late = DestroyedWhileAllocated()
    late.on_mignode("ADDED", mignode(1, 0))
    late.on_mignode("MODIFIED", mignode(5))
    late.on_claim("MODIFIED", claim(7, DEVICE))
    assert late.violations == []


def test_a_release_delivered_late_still_clears_the_device() -> None:
    ledger = DestroyedWhileAllocated()
    ledger.on_mignode("ADDED", mignode(1, 0))
    ledger.on_claim("MODIFIED", claim(2, DEVICE))
    ledger.on_mignode("MODIFIED", mignode(6))
    ledger.on_claim("DELETED", claim(4, DEVICE))  # released at 4 < 6, delivered after
    assert ledger.violations == []


def test_other_drivers_and_deleted_mignodes_do_not_count() -> None:
    ledger = DestroyedWhileAllocated()
    ledger.on_mignode("ADDED", mignode(1, 0))
    ledger.on_claim("MODIFIED", claim(2, DEVICE, driver="gpu.nvidia.com"))
    ledger.on_mignode("MODIFIED", mignode(3))
    assert ledger.violations == []
    ledger.on_claim("MODIFIED", claim(4, "gpu-0-1g10gb-1"))
    ledger.on_mignode("MODIFIED", mignode(5, 1))
    ledger.on_mignode("DELETED", mignode(6, 1))  # deleting the object destroys no instance
    ledger.on_mignode("ADDED", mignode(7))  # made again, empty: a new baseline
    assert ledger.violations == []


def test_a_poll_counts_only_holdings_that_span_the_whole_gap() -> None:
    ledger = DestroyedWhileAllocated(every_change=False)
    ledger.mignodes_listed([mignode(1, 0)])
    ledger.claims_listed([claim(2, DEVICE)])
    # between the looks at revisions 1 and 9 the device went: the claim, seen at 2, may have
    # come after it
    ledger.mignodes_listed([mignode(9)])
    assert ledger.violations == []
    polled = DestroyedWhileAllocated(every_change=False)
    polled.claims_listed([claim(2, DEVICE)])
    polled.mignodes_listed([mignode(3, 0)])
    polled.mignodes_listed([mignode(9)])
    polled.claims_listed([claim(2, DEVICE)])  # still held at 2, released only after
    assert polled.violations == [Violation("n1", DEVICE, "ns/c1")]


def test_a_claim_missing_from_a_poll_was_released_after_its_last_look() -> None:
    ledger = DestroyedWhileAllocated(every_change=False)
    ledger.claims_listed([claim(2, DEVICE)])
    ledger.mignodes_listed([mignode(3, 0)])
    ledger.claims_listed([])  # deleted somewhere after 2
    ledger.mignodes_listed([mignode(9)])
    assert ledger.violations == []


def test_a_claim_listed_unchanged_held_its_device_until_that_look() -> None:
    ledger = DestroyedWhileAllocated(every_change=False)
    ledger.mignodes_listed([mignode(3, 0)])
    ledger.claims_listed([claim(4, DEVICE)])
    ledger.mignodes_listed([mignode(3, 0)])  # unchanged, so still there after 4
    ledger.claims_listed([claim(4, DEVICE)])
    ledger.mignodes_listed([mignode(9)])  # gone at 9...
    ledger.claims_listed([claim(4, DEVICE)])  # ...while the claim, unchanged since 4, held it
    ledger.mignodes_listed([mignode(9)])
    ledger.claims_listed([])  # deleted later: the violation stands
    assert ledger.violations == [Violation("n1", DEVICE, "ns/c1")]


def test_holders_listed_at_one_revision() -> None:
    ledger = DestroyedWhileAllocated(every_change=False)
    ledger.held({"checkpoint n1": [("n1", DEVICE)]}, 10)
    ledger.present("n1", [DEVICE], 10)
    ledger.held({"checkpoint n1": [("n1", DEVICE)]}, 12)
    ledger.present("n1", [], 12)
    assert ledger.violations == [Violation("n1", DEVICE, "checkpoint n1")]
    freed = DestroyedWhileAllocated(every_change=False)
    freed.held({"checkpoint n1": [("n1", DEVICE)]}, 10)
    freed.present("n1", [DEVICE], 10)
    freed.held({}, 12)
    freed.present("n1", [], 12)
    assert freed.violations == []


def test_overlapping_placements_of_one_gpu_are_allocated_twice() -> None:
    """Offer mode lists every placement: counters must keep two claims off overlapping ones."""
    table = lookup_table("NVIDIA H100 80GB HBM3", None, "model")
    held = {
        "ns/a": {("n1", "gpu-0-1g10gb-0")},
        "ns/b": {("n1", "gpu-0-1g10gb-1"), ("n1", "gpu-1-7g80gb-0")},
        "ns/c": {("n2", "gpu-0-7g80gb-0")},  # another node: no clash
    }
    assert overlapping_allocations(held, lambda node: table) == set()
    held["ns/d"] = {("n1", "gpu-0-4g40gb-0")}  # over a's and b's 1g.10gb on GPU 0
    held["ns/e"] = {("n2", "gpu-0-7g80gb-0")}  # c's device itself
    assert overlapping_allocations(held, lambda node: table) == {
        "n1/gpu-0-1g10gb-0 + n1/gpu-0-4g40gb-0 (ns/a, ns/d)",
        "n1/gpu-0-1g10gb-1 + n1/gpu-0-4g40gb-0 (ns/b, ns/d)",
        "n2/gpu-0-7g80gb-0 + n2/gpu-0-7g80gb-0 (ns/c, ns/e)",
    }
    # without the node's model only the same device given twice is seen
    assert overlapping_allocations(held, lambda node: None) == {
        "n2/gpu-0-7g80gb-0 + n2/gpu-0-7g80gb-0 (ns/c, ns/e)"
    }

"""The publisher's view of its slices from the watch: the newest state wins, other drivers'
slices are not ours, a deletion leaves a tombstone and a generation floor."""

from __future__ import annotations

from typing import Any

from migpart.kube.slice_watch import SliceView
from migpart.slices.content import slice_index, slice_name
from tests.unit.kube.factories import watched_slice as watched


def test_the_view_keeps_the_newest_slice_it_has_seen() -> None:
    view = SliceView()
    assert view.observe(watched("n1", 3, 30)) == "n1"
    view.observe(watched("n1", 2, 20))  # an older event arriving late
    assert view.get("n1").generation == 3  # type: ignore[union-attr]
    view.observe(watched("n1", 4, 40))
    assert view.get("n1").generation == 4  # type: ignore[union-attr]


def test_other_drivers_slices_are_not_ours() -> None:
    view = SliceView()
    theirs = watched("n1", 1, 10)
    theirs["spec"]["driver"] = "gpu.nvidia.com"
    assert view.observe(theirs) is None
    renamed = watched("n1", 1, 10)
    renamed["metadata"]["name"] = "n1-something-else"
    assert view.observe(renamed) is None
    assert view._slices == {}


def test_a_deleted_slice_is_forgotten_unless_we_wrote_a_newer_one() -> None:
    view = SliceView()
    view.observe(watched("n1", 2, 20))
    assert view.deleted(watched("n1", 2, 20)) == "n1"
    assert "n1" not in view._slices
    view.observe(watched("n1", 1, 50))  # written again since
    assert view.deleted(watched("n1", 2, 20)) is None
    assert view.get("n1").resource_version == "50"  # type: ignore[union-attr]


def test_a_relist_forgets_the_slices_it_does_not_hold_keeping_their_generations() -> None:
    view = SliceView()
    view.observe(watched("n1", 3, 30))
    view.observe(watched("n2", 5, 31))
    assert view.relisted([watched("n2", 5, 31)]) == ["n1"]
    assert view.get("n1") is None
    assert view.floor("n1") == 3
    assert view.get("n2") is not None


def pool_slice(node: str, index: int, generation: int, revision: int) -> dict[str, Any]:
    """Slice `index` of the node's pool, as the watch shows it."""
    body = watched(node, generation, revision)
    body["metadata"]["name"] = slice_name(node, index)
    return body


def test_every_slice_of_a_pool_is_ours_and_kept_apart() -> None:
    view = SliceView()
    assert view.observe(pool_slice("n1", 0, 2, 20)) == "n1"
    assert view.observe(pool_slice("n1", 1, 2, 21)) == "n1"
    assert view.observe(pool_slice("n1", 2, 3, 22)) == "n1"
    assert set(view.slices("n1")) == {slice_name("n1", i) for i in range(3)}
    assert view.generation("n1") == 3
    for name in (f"{slice_name('n1')}-1", f"{slice_name('n1')}-x", f"{slice_name('n1')}-00"):
        theirs = watched("n1", 1, 10)
        theirs["metadata"]["name"] = name
        assert view.observe(theirs) is None


def test_a_relist_forgets_one_slice_of_a_pool_and_keeps_the_others() -> None:
    view = SliceView()
    for i in range(3):
        view.observe(pool_slice("n1", i, 4, 40 + i))
    assert view.relisted([pool_slice("n1", 0, 4, 40), pool_slice("n1", 2, 4, 42)]) == ["n1"]
    assert set(view.slices("n1")) == {slice_name("n1"), slice_name("n1", 2)}
    assert view.floor("n1") == 4


def test_slice_names_and_indices_are_inverse() -> None:
    for i in (0, 1, 2, 10, 100):
        assert slice_index(slice_name("n1", i), "n1") == i
    assert slice_index(slice_name("n10", 1), "n1") is None
    # kube-scheduler tries a pool's slices in name order: that must be the pool's order
    pool = [slice_name("n1", i) for i in range(100)]
    assert sorted(pool) == pool

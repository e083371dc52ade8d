"""What a node's ResourceSlice lists, and that each device is exactly what selectors are judged
against (the planner's virtual device), for every profile of the real H100 and H200 tables."""

from __future__ import annotations

from typing import Any, cast

import pytest

from migpart.api.models import (
    GpuSpec,
    GpuStatus,
    MigInstanceSpec,
    MigNode,
    MigNodeSpec,
    MigNodeStatus,
)
from migpart.dra import DRIVER
from migpart.kube import slices
from migpart.kube.cel import device_from_slice, virtual_device
from migpart.kube.slices import (
    SlicePublisher,
    devices_digest,
    instance_device,
    slice_body,
    slice_devices,
)
from migpart.mig import builtin_table
from tests.unit.kube.factories import H100, gpu


def node(gpus: list[GpuStatus], spec: dict[int, list[tuple[str, int]]] | None = None) -> MigNode:
    return MigNode(
        metadata={"name": "n"},
        spec=None
        if spec is None
        else MigNodeSpec(
            plan_id="p",
            gpus=[
                GpuSpec(index=i, instances=[MigInstanceSpec(profile=p, start=s) for p, s in insts])
                for i, insts in spec.items()
            ],
        ),
        status=MigNodeStatus(gpus=gpus),
    )


def names(n: MigNode, withdrawn: tuple[str, ...] = ()) -> list[str]:
    return [str(d["name"]) for d in slice_devices(n, withdrawn)]


def test_created_instances_are_published_sorted_without_a_spec() -> None:
    n = node(
        [gpu(1, ("7g.80gb", 0, "Free")), gpu(0, ("3g.40gb", 4, "Free"), ("1g.10gb", 0, "Free"))]
    )
    assert names(n) == ["gpu-0-1g10gb-0", "gpu-0-3g40gb-4", "gpu-1-7g80gb-0"]


def test_a_free_instance_the_spec_drops_is_not_published_a_used_one_is() -> None:
    gpus = [gpu(0, ("3g.40gb", 0, "Free"), ("3g.40gb", 4, "Prepared"), ("1g.10gb", 6, "Busy"))]
    # the plan keeps nothing on GPU 0: the free instance leaves, the used ones stay
    assert names(node(gpus, {0: []})) == ["gpu-0-1g10gb-6", "gpu-0-3g40gb-4"]


def test_a_gpu_the_spec_does_not_mention_is_published_as_is() -> None:
    n = node([gpu(0, ("7g.80gb", 0, "Free")), gpu(1, ("7g.80gb", 0, "Free"))], {0: []})
    assert names(n) == ["gpu-1-7g80gb-0"]


def test_a_spec_without_a_plan_id_wants_nothing_and_drops_nothing() -> None:
    """The agent leaves such a spec alone (`MigNodeSpec.desired`), so every created instance
    stays published: nothing was withdrawn for it."""
    n = node([gpu(0, ("7g.80gb", 0, "Free"))], {0: []})
    unplanned = n.model_copy(update={"spec": n.spec.model_copy(update={"plan_id": None})})
    assert names(unplanned) == ["gpu-0-7g80gb-0"]


def test_withdrawn_devices_are_left_out_even_when_in_use() -> None:
    n = node([gpu(0, ("3g.40gb", 0, "Free"), ("3g.40gb", 4, "Prepared"))])
    assert names(n, ("gpu-0-3g40gb-0",)) == ["gpu-0-3g40gb-4"]


def test_gpus_without_mig_publish_nothing() -> None:
    assert names(node([gpu(0, ("7g.80gb", 0, "Free"), mig=False)])) == []


def test_digest_changes_exactly_when_the_content_does() -> None:
    a = slice_devices(node([gpu(0, ("1g.10gb", 0, "Free"))]))
    b = slice_devices(node([gpu(0, ("1g.10gb", 0, "Busy"))]))  # state is not published
    c = slice_devices(node([gpu(0, ("1g.10gb", 1, "Free"))]))
    assert devices_digest(a) == devices_digest(b) != devices_digest(c)


@pytest.mark.parametrize("model", [H100, "NVIDIA H200"])
def test_published_devices_are_what_selectors_are_judged_against(model: str) -> None:
    table = builtin_table(model)
    for profile in table.profiles:
        start = profile.placements[-1]
        status = gpu(3, (profile.name, start, "Free"), model=model)
        published = instance_device(status, status.instances[0])
        expected = virtual_device(
            table,
            profile.name,
            gpu_index=3,
            start=start,
            parent_uuid="GPU-3",
            uuid=f"MIG-3-{profile.name}-{start}",
        )
        assert device_from_slice(DRIVER, published) == expected, profile.name


def test_an_instance_of_a_profile_the_table_lacks_is_published_without_capacity() -> None:
    full = gpu(0, ("1g.10gb", 0, "Free"))
    status = full.model_copy(update={"profiles": [p for p in full.profiles if p.name != "1g.10gb"]})
    device = instance_device(status, status.instances[0])
    assert device["attributes"]["profile"] == {"string": "1g.10gb"}
    assert device["capacity"] == {}


def watched(node: str, generation: int, revision: int) -> dict[str, Any]:
    body = slice_body(node, [], generation)
    body["metadata"]["resourceVersion"] = str(revision)
    return body


def test_the_publisher_keeps_the_newest_slice_it_has_seen() -> None:
    publisher = SlicePublisher(cast(Any, None))
    assert publisher.observe_slice(watched("n1", 3, 30)) == "n1"
    publisher.observe_slice(watched("n1", 2, 20))  # an older event arriving late
    assert publisher._slices["n1"].generation == 3
    publisher.observe_slice(watched("n1", 4, 40))
    assert publisher._slices["n1"].generation == 4


def test_other_drivers_slices_are_not_ours() -> None:
    publisher = SlicePublisher(cast(Any, None))
    theirs = watched("n1", 1, 10)
    theirs["spec"]["driver"] = "gpu.nvidia.com"
    assert publisher.observe_slice(theirs) is None
    renamed = watched("n1", 1, 10)
    renamed["metadata"]["name"] = "n1-something-else"
    assert publisher.observe_slice(renamed) is None
    assert publisher._slices == {}


def test_a_deleted_slice_is_forgotten_unless_we_wrote_a_newer_one() -> None:
    publisher = SlicePublisher(cast(Any, None))
    publisher.observe_slice(watched("n1", 2, 20))
    assert publisher.slice_deleted(watched("n1", 2, 20)) == "n1"
    assert "n1" not in publisher._slices
    publisher.observe_slice(watched("n1", 1, 50))  # written again since
    assert publisher.slice_deleted(watched("n1", 2, 20)) is None
    assert publisher._slices["n1"].resource_version == "50"


def test_a_recreated_slice_continues_the_generations_of_the_deleted_one() -> None:
    publisher = SlicePublisher(cast(Any, None))
    publisher.observe_slice(watched("n1", 7, 70))
    assert publisher.slice_deleted(watched("n1", 7, 70)) == "n1"
    assert publisher._floors["n1"] == 7  # the next create writes generation 8
    publisher.forget("n1")  # the MigNode went: a new one starts afresh
    assert "n1" not in publisher._floors


async def test_an_unavailable_node_without_a_slice_gets_none_written() -> None:
    """No API call at all (the publisher has no client here): a wiped slice stays wiped."""
    publisher = SlicePublisher(cast(Any, None), gate=lambda node: "LeaseExpired")
    n1 = node([gpu(0, ("1g.10gb", 0, "Free"))])
    publisher.observe(n1.model_copy(update={"metadata": {"name": "n1"}}))
    result = await publisher.publish("n1")
    assert not result.written
    assert result.devices == frozenset()


async def test_an_unchanged_node_is_neither_recomputed_nor_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The resync publishes every node every period: for a node whose MigNode, withdrawals
    and availability did not change, that is a dict lookup (no API call: the publisher has no
    client here)."""
    publisher = SlicePublisher(cast(Any, None))
    n1 = node([gpu(0, ("1g.10gb", 0, "Free"), ("1g.10gb", 1, "Free"))]).model_copy(
        update={"metadata": {"name": "n1"}}
    )
    publisher.observe(n1)
    devices = slice_devices(n1)
    publisher.observe_slice(watched_with("n1", devices))
    computed: list[MigNode] = []
    compute = slices.SliceContent.of

    def counting(n: MigNode, *args: Any) -> slices.SliceContent:
        computed.append(n)
        return compute(n, *args)

    monkeypatch.setattr(slices.SliceContent, "of", counting)
    for _ in range(3):
        result = await publisher.publish("n1")
        assert not result.written
        assert result.devices == {str(d["name"]) for d in devices}
    assert len(computed) == 1  # once, then from the cache
    # a new body of the same MigNode (a watch event) is computed again ...
    publisher.observe(n1.model_copy())
    await publisher.publish("n1")
    assert len(computed) == 2
    # ... and so is a withdrawal, and a change of availability (both change the content)
    current = publisher.node("n1")
    assert current is not None
    publisher._withdrawn["n1"] = {str(devices[0]["name"])}
    assert len(publisher._content("n1", current, False).devices) == 1
    assert publisher._content("n1", current, True).devices == []
    assert len(computed) == 4


def test_the_device_cache_gives_what_building_each_device_gives() -> None:
    """Devices and digest from the cache are those built afresh, instance for instance; an
    instance of a new uuid, or of a profile whose reported capacity differs, is built again."""
    cache = slices.DeviceCache()
    layouts = [
        [("1g.10gb", s, "Free") for s in range(7)],
        [("3g.40gb", 0, "Busy"), ("2g.20gb", 4, "Free"), ("1g.10gb", 6, "Prepared")],
        [("7g.80gb", 0, "Free")],
    ]
    for round_ in range(4):  # each GPU has each layout once, then the first one again
        n = node([gpu(i, *layouts[(i + round_) % 3]) for i in range(4)])
        content = slices.SliceContent.of(n, frozenset(), False, cache)
        assert content.devices == slice_devices(n)
        assert content.digest == devices_digest(slice_devices(n))
    # 11 instances per GPU, of which 1g.10gb at 6 twice (Free, then Prepared: the same device)
    assert len(cache._entries) == 4 * 10
    other = gpu(0, ("1g.10gb", 0, "Free"))
    bigger = other.profiles[0].model_copy(update={"memory_mib": 1})
    changed = other.model_copy(update={"profiles": [bigger, *other.profiles[1:]]})
    device, _ = cache.get(changed, changed.instances[0])
    assert device["capacity"]["memory"] == {"value": str(1024 * 1024)}


def watched_with(node: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    body = slice_body(node, devices, 1)
    body["metadata"]["resourceVersion"] = "10"
    return body


def test_a_patch_response_older_than_a_watched_status_does_not_hide_its_instances() -> None:
    """The race CI hit once: the operator patches a spec; the agent creates the instance and
    writes its status; the watch shows that status before the patch's response is taken in.
    Both bodies carry the same generation (a status write does not bump it); the response is
    the older revision and must not replace the newer body, or the slice never lists the
    instance (no later event would show it again)."""
    publisher = SlicePublisher(cast(Any, None))
    created = node([gpu(0, ("3g.40gb", 4, "Free"))], spec={0: [("3g.40gb", 4)]})
    response = node([], spec={0: [("3g.40gb", 4)]})
    publisher.observe(created.model_copy(update={"metadata": _meta(generation=2, rv="11")}))
    publisher.observe(response.model_copy(update={"metadata": _meta(generation=2, rv="10")}))
    kept = publisher.node("n1")
    assert kept is not None
    assert kept.metadata["resourceVersion"] == "11"
    assert names(kept) == ["gpu-0-3g40gb-4"]
    # and the other way round: a watch event older than a patch already seen is ignored too
    older_spec = node([], spec={0: [("7g.80gb", 0)]})
    publisher.observe(older_spec.model_copy(update={"metadata": _meta(generation=1, rv="9")}))
    assert publisher.node("n1") is kept
    # a newer body replaces it, whatever its generation
    publisher.observe(response.model_copy(update={"metadata": _meta(generation=2, rv="12")}))
    newest = publisher.node("n1")
    assert newest is not None
    assert newest.metadata["resourceVersion"] == "12"


def test_without_revisions_the_generation_orders_mignode_bodies() -> None:
    publisher = SlicePublisher(cast(Any, None))
    first = node([gpu(0, ("1g.10gb", 0, "Free"))])
    publisher.observe(first.model_copy(update={"metadata": {"name": "n1", "generation": 3}}))
    publisher.observe(first.model_copy(update={"metadata": {"name": "n1", "generation": 2}}))
    assert publisher.node("n1") is not None
    assert publisher.node("n1").metadata["generation"] == 3  # type: ignore[union-attr]
    same = first.model_copy(update={"metadata": {"name": "n1", "generation": 3, "x": 1}})
    publisher.observe(same)
    assert publisher.node("n1") is same  # a tie keeps the body seen last


def _meta(*, generation: int, rv: str) -> dict[str, Any]:
    return {"name": "n1", "generation": generation, "resourceVersion": rv}


def test_a_write_response_older_than_a_watched_deletion_does_not_revive_the_slice() -> None:
    """The replace is answered at revision 300; the watch shows the slice deleted at 301
    before the response is taken in. The response must not bring the slice back into the
    view, or the rewrite that the deletion asked for (and every resync) would find the digest
    unchanged and never create it again. A GET answered before the deletion is the same."""
    publisher = SlicePublisher(cast(Any, None))
    publisher.observe_slice(watched("n1", 4, 290))
    assert publisher.slice_deleted(watched("n1", 5, 301)) == "n1"
    publisher._wrote("n1", watched("n1", 5, 300))
    assert "n1" not in publisher._slices
    assert publisher._floors["n1"] == 5  # the create that follows writes generation 6
    publisher._keep("n1", slices.SliceState.of(watched("n1", 5, 300)))
    assert "n1" not in publisher._slices
    # a slice written after the deletion is taken in, and the deletion is forgotten
    publisher._wrote("n1", watched("n1", 6, 310))
    assert publisher._slices["n1"].generation == 6
    assert "n1" not in publisher._deleted


async def test_a_fenced_publish_sends_nothing() -> None:
    """The fence runs right before the write: when it raises, no request is made (the
    publisher has no client here: one would fail differently)."""
    from migpart.errors import NotLeader

    publisher = SlicePublisher(cast(Any, None))
    n1 = node([gpu(0, ("1g.10gb", 0, "Free"))]).model_copy(update={"metadata": {"name": "n1"}})
    publisher.observe(n1)
    checked: list[str] = []

    def fence() -> None:
        checked.append("n1")
        raise NotLeader("slice n1: not written")

    with pytest.raises(NotLeader):
        await publisher.publish("n1", fence)
    with pytest.raises(NotLeader):
        await publisher.withdraw("n1", ["gpu-0-1g10gb-0"], fence)
    assert checked == ["n1", "n1"]
    # a publish that needs no write does not ask
    publisher.observe_slice(watched_with("n1", slice_devices(n1)))
    publisher._withdrawn.clear()
    assert not (await publisher.publish("n1", fence)).written
    assert checked == ["n1", "n1"]

"""Behaviour every NvmlBackend shares (read-only part, also run on a real GPU)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from migpart.mig import CATALOG, Instance, layout_problems

if TYPE_CHECKING:
    from migpart.agent.backend import NvmlBackend


async def test_inventory_lists_gpus_with_unique_uuids(any_backend: NvmlBackend) -> None:
    gpus = await any_backend.gpus()
    assert gpus
    assert [g.index for g in gpus] == list(range(len(gpus)))
    assert len({g.uuid for g in gpus}) == len(gpus)
    assert all(g.uuid.startswith("GPU-") and g.model for g in gpus)


async def test_profile_tables_are_self_consistent(any_backend: NvmlBackend) -> None:
    for gpu in await any_backend.gpus():
        table = await any_backend.profile_table(gpu.index)
        assert table.model == gpu.model
        if gpu.model in CATALOG:
            known = CATALOG[gpu.model]
            assert {p.name: p for p in table.profiles} == {p.name: p for p in known.profiles}
            assert (table.compute_slices, table.memory_slices) == (
                known.compute_slices,
                known.memory_slices,
            )
        for prof in table.profiles:
            assert prof.placements
            assert all(s + prof.memory_slices <= table.memory_slices for s in prof.placements)
            assert not layout_problems(table, [Instance(prof.name, prof.placements[0])])


async def test_instances_are_a_valid_layout(any_backend: NvmlBackend) -> None:
    for gpu in await any_backend.gpus():
        table = await any_backend.profile_table(gpu.index)
        found = await any_backend.instances(gpu.index) if gpu.mig_enabled else []
        assert not layout_problems(table, [Instance(i.profile, i.start) for i in found])
        assert all(i.gpu == gpu.index for i in found)
        assert all(i.uuid.startswith("MIG-") for i in found if i.ci_id is not None)

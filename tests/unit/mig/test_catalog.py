"""The built-in catalog equals, field for field, the real NVML dumps of an H100 and an H200."""

from __future__ import annotations

import pytest

from migpart.mig import CATALOG, Instance, enumerate_layouts, layout_problems, lookup_table
from migpart.mig.profiles import device_name, parse_profile_name
from tests.nvml_dumps import DUMPS, assert_profile_is_dumped, dump_profiles


@pytest.mark.parametrize("dump", DUMPS)
def test_catalog_equals_nvml_dump(dump: str) -> None:
    model, profiles = dump_profiles(dump)
    table = CATALOG[model]
    assert len(table.profiles) == len(profiles)
    for raw in profiles:
        assert_profile_is_dumped(table.profile(str(raw["name"]).removeprefix("MIG ")), raw)
    full = max(table.profiles, key=lambda p: p.compute_slices)
    assert table.compute_slices == full.compute_slices
    assert table.memory_slices == full.memory_slices


@pytest.mark.parametrize("model", sorted(CATALOG))
def test_every_catalog_table_is_consistent(model: str) -> None:
    table = CATALOG[model]
    for prof in table.profiles:
        compute, _ = parse_profile_name(prof.name)
        assert compute == prof.compute_slices
        assert all(
            s >= 0 and s + prof.memory_slices <= table.memory_slices for s in prof.placements
        )
    # the whole GPU as one instance is a valid layout
    whole = next(p for p in table.profiles if p.compute_slices == table.compute_slices)
    assert not layout_problems(table, [Instance(whole.name, 0)])
    assert len(enumerate_layouts(table, frozenset())) > len(table.profiles)


def test_unknown_model_names_the_field() -> None:
    with pytest.raises(Exception, match=r"nodes\[3\]\.gpus\[0\]\.model: unknown model"):
        lookup_table("NVIDIA Z9000", None, "nodes[3].gpus[0].model")


@pytest.mark.parametrize(
    ("gpu", "profile", "start", "name"),
    [(0, "3g.40gb", 0, "gpu-0-3g40gb-0"), (3, "1g.10gb+me", 6, "gpu-3-1g10gbme-6")],
)
def test_device_name(gpu: int, profile: str, start: int, name: str) -> None:
    assert device_name(gpu, profile, start) == name

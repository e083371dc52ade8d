"""The built-in catalog equals, field for field, the real NVML dumps of an H100 and an H200."""

from __future__ import annotations

import json

import pytest

from migpart.mig import CATALOG, Instance, enumerate_layouts, layout_problems, lookup_table
from migpart.mig.profiles import device_name, parse_profile_name
from tests.conftest import FIXTURES


def _dump_table(path: str) -> tuple[str, list[dict[str, object]]]:
    data = json.loads((FIXTURES / "nvml" / path).read_text())
    device = data["devices"][0]
    return device["name"], [p for p in device["gi_profiles"] if "err" not in p]


@pytest.mark.parametrize("dump", ["h100-80gb-hbm3.nvml.json", "h200-141gb.nvml.json"])
def test_catalog_equals_nvml_dump(dump: str) -> None:
    model, profiles = _dump_table(dump)
    table = CATALOG[model]
    assert len(table.profiles) == len(profiles)
    for raw in profiles:
        name = str(raw["name"]).removeprefix("MIG ")
        prof = table.profile(name)
        placements = [tuple(p) for p in raw["placements"]]  # type: ignore[attr-defined]
        assert prof.compute_slices == raw["sliceCount"]
        assert prof.max_instances == raw["instanceCount"]
        assert prof.memory_mib == raw["memorySizeMB"]
        assert prof.multiprocessors == raw["multiprocessorCount"]
        assert prof.copy_engines == raw["copyEngineCount"]
        assert prof.decoders == raw["decoderCount"]
        assert prof.encoders == raw["encoderCount"]
        assert prof.jpegs == raw["jpegCount"]
        assert prof.ofas == raw["ofaCount"]
        assert prof.nvml_index == raw["profile_index"]
        assert prof.nvml_id == raw["id"]
        assert prof.placements == tuple(start for start, _ in placements)
        assert {size for _, size in placements} == {prof.memory_slices}
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

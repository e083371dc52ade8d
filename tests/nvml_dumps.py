"""The real NVML dumps under tests/fixtures/nvml, and the check that a `Profile` says what a
dump's GPU-instance profile says, field for field: the built-in catalog and the simulator both
answer to them."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from tests.conftest import FIXTURES

if TYPE_CHECKING:
    from collections.abc import Mapping

    from migpart.mig import Profile

DUMPS = ["h100-80gb-hbm3.nvml.json", "h200-141gb.nvml.json"]


def dump_profiles(dump: str) -> tuple[str, list[dict[str, Any]]]:
    """The GPU model of a dump's first device and the GPU-instance profiles NVML answered
    for (those without an `err`), in NVML's order."""
    device = json.loads((FIXTURES / "nvml" / dump).read_text())["devices"][0]
    return device["name"], [p for p in device["gi_profiles"] if "err" not in p]


def assert_profile_is_dumped(prof: Profile, raw: Mapping[str, Any]) -> None:
    assert f"MIG {prof.name}" == raw["name"]
    assert prof.nvml_index == raw["profile_index"]
    assert prof.nvml_id == raw["id"]
    assert prof.compute_slices == raw["sliceCount"]
    assert prof.max_instances == raw["instanceCount"]
    assert prof.memory_mib == raw["memorySizeMB"]
    assert prof.multiprocessors == raw["multiprocessorCount"]
    assert prof.copy_engines == raw["copyEngineCount"]
    assert prof.decoders == raw["decoderCount"]
    assert prof.encoders == raw["encoderCount"]
    assert prof.jpegs == raw["jpegCount"]
    assert prof.ofas == raw["ofaCount"]
    # [start, memory slices] per placement, in NVML's order
    assert [[s, prof.memory_slices] for s in prof.placements] == raw["placements"]

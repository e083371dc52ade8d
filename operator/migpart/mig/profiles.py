"""MIG profile tables: what one GPU model can be cut into.

A table is the product of NVML's GPU-instance profile info and possible placements
(`nvmlDeviceGetGpuInstanceProfileInfo`, `nvmlDeviceGetGpuInstancePossiblePlacements`).
Placements are start indices in memory-slice units; an instance of a profile occupies the
memory slices `[start, start + memory_slices)` and `compute_slices` of the GPU's compute slices.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from migpart.errors import UnknownProfile

# `1g.10gb`, `1g.10gb+me`, `1c.3g.40gb` (compute-instance profiles are not GPU-instance
# profiles, but the syntax check accepts what NVML names could look like).
PROFILE_NAME_RE = re.compile(r"^(?:[1-9]c\.)?[1-9]g\.[1-9][0-9]{0,3}gb(?:\+[a-z]+)*$")


def parse_profile_name(name: str) -> tuple[int, int]:
    """Return (compute slices, memory GB) named by a profile such as `3g.40gb`."""
    if not PROFILE_NAME_RE.match(name):
        raise UnknownProfile("", f"malformed MIG profile name {name!r} (expected e.g. 3g.40gb)")
    core = name.split("+", 1)[0].split(".")
    return int(core[-2][:-1]), int(core[-1][:-2])


def device_name(gpu_index: int, profile: str, start: int) -> str:
    """The ResourceSlice device name of an instance, e.g. `gpu-0-3g40gb-0`."""
    compact = profile.replace(".", "").replace("+", "")
    return f"gpu-{gpu_index}-{compact}-{start}"


@dataclass(frozen=True, slots=True)
class Profile:
    """One GPU-instance profile of one GPU model."""

    name: str
    compute_slices: int
    memory_slices: int
    placements: tuple[int, ...]
    max_instances: int
    memory_mib: int
    multiprocessors: int
    copy_engines: int = 0
    decoders: int = 0
    encoders: int = 0
    jpegs: int = 0
    ofas: int = 0
    # NVML identifiers: the profile index passed to GetGpuInstanceProfileInfo and the
    # profile id passed to CreateGpuInstanceWithPlacement. -1 when unknown.
    nvml_index: int = -1
    nvml_id: int = -1

    def mask(self, start: int) -> int:
        """Bit mask of the memory slices an instance at `start` occupies."""
        return ((1 << self.memory_slices) - 1) << start


@dataclass(frozen=True, slots=True)
class ModelTable:
    """Every GPU-instance profile of one GPU model, keyed by the NVML product name."""

    model: str
    compute_slices: int
    memory_slices: int
    profiles: tuple[Profile, ...]
    _by_name: dict[str, Profile] = field(init=False, repr=False, compare=False, hash=False)
    pci_device_ids: tuple[int, ...] = field(default=(), compare=False, hash=False)
    """The model's PCI device ids (vendor 0x10DE), e.g. 0x2330 for the H100 SXM5 80GB: what a
    mig-parted `device-filter` names. Known for the built-in catalog; a table read from NVML
    or given in a snapshot has none."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {p.name: p for p in self.profiles})

    def __hash__(self) -> int:
        return hash((self.model, self.compute_slices, self.memory_slices, self.profiles))

    @property
    def profile_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.profiles)

    def has(self, name: str) -> bool:
        return name in self._by_name

    def profile(self, name: str) -> Profile:
        try:
            return self._by_name[name]
        except KeyError:
            raise UnknownProfile(
                "",
                f"profile {name!r} is not offered by {self.model} "
                f"(offered: {', '.join(self.profile_names)})",
            ) from None

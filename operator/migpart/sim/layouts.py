"""Static layouts: mig-parted config files, the built-in `all-balanced` and `all-7g`, and the
per-GPU shapes that the search for the best fixed mix combines.

A mig-parted config (`version: v1`, `mig-configs: {NAME: [{device-filter: PCI ids,
devices: all | [i, ...], mig-enabled: bool, mig-devices: {PROFILE: COUNT}}]}`) gives instance
counts per GPU, not placements; each GPU gets the first valid layout
(`migpart.mig.enumerate_layouts`, smallest placements first) with exactly those counts. A GPU
with `mig-enabled: false` is one whole-GPU device, which the simulator counts as the largest
profile. NVIDIA's stock configs (mig-parted's example, the GPU Operator's default) cover many
models in one file: entries whose `device-filter` excludes the simulated model do not apply to
it (mig-parted applies an entry only to the GPUs its filter names), and profiles the model does
not offer are skipped with a warning.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import yaml

from migpart.errors import InvalidInput
from migpart.mig import Instance, ModelTable, addable_placements, enumerate_layouts
from migpart.sim.workload import plain_profiles

# Instances per GPU for each GPU: one tuple of instances per GPU index.
StaticLayout = tuple[tuple[Instance, ...], ...]


def by_size(table: ModelTable, compute: int) -> str:
    """The plain profile with `compute` compute slices and the least memory."""
    for name in plain_profiles(table):
        if table.profile(name).compute_slices == compute:
            return name
    raise InvalidInput("", f"{table.model} has no profile with {compute} compute slices")


def layout_with(table: ModelTable, counts: Mapping[str, int], where: str) -> tuple[Instance, ...]:
    """The first valid layout holding exactly `counts` instances of each profile."""
    for name in counts:
        if not table.has(name):
            offered = ", ".join(table.profile_names)
            raise InvalidInput(
                f"{where}.{name}", f"{name!r} is not offered by {table.model} ({offered})"
            )
    found = _first_layout(table, tuple(sorted((p, n) for p, n in counts.items() if n)))
    if found is None:
        wanted = ", ".join(f"{n} x {p}" for p, n in sorted(counts.items()))
        raise InvalidInput(where, f"{wanted} do not fit on one {table.model}")
    return found


@lru_cache(maxsize=256)
def _first_layout(
    table: ModelTable, counts: tuple[tuple[str, int], ...]
) -> tuple[Instance, ...] | None:
    want = Counter(dict(counts))
    size = sum(want.values())
    for layout in enumerate_layouts(table, frozenset()):
        if len(layout) == size and Counter(i.profile for i in layout) == want:
            return tuple(sorted(layout, key=lambda i: i.start))
    return None


def balanced(table: ModelTable) -> dict[str, int]:
    """mig-parted's `all-balanced`: on 7-slice models 2 x 1g, 1 x 2g, 1 x 3g; on 4-slice models
    2 x 1g, 1 x 2g (the smallest memory of each)."""
    if table.compute_slices >= 7:
        return {by_size(table, 1): 2, by_size(table, 2): 1, by_size(table, 3): 1}
    return {by_size(table, 1): 2, by_size(table, 2): 1}


def uniform(table: ModelTable, counts: Mapping[str, int], gpus: int) -> StaticLayout:
    layout = layout_with(table, counts, "layout")
    return tuple(layout for _ in range(gpus))


def whole(table: ModelTable) -> dict[str, int]:
    return {plain_profiles(table)[-1]: 1}


NVIDIA_VENDOR_ID = 0x10DE
ENTRY_FIELDS = ("device-filter", "devices", "mig-enabled", "mig-devices")
# mig-parted's profile names (go-nvlib's grammar): `1g.10gb`, `1c.3g.40gb`, `1g.10gb+me`,
# `1g.24gb+me.all`, `1g.24gb-me`, `2g.48gb+gfx`. Wider than the names migpart's own models use:
# a name of this shape that the model does not offer is skipped, anything else is an error.
MIG_PARTED_PROFILE_RE = re.compile(
    r"^(?:[1-9][0-9]*c\.)?[1-9][0-9]*g\.[1-9][0-9]*gb(?:[+-][a-z]+(?:\.[a-z]+)*)*$"
)


@dataclass(frozen=True)
class ConfigLayout:
    """One mig-parted config as the layouts of a node's GPUs of one model."""

    layout: StaticLayout
    skipped: tuple[str, ...] = ()
    """Profiles the config names that the model does not offer (left out of the layout)."""
    applies: bool = True
    """Whether any entry's `device-filter` admits the model (none: the config is not for it)."""


@dataclass(frozen=True)
class MigPartedLayouts:
    """The static policies (`static:NAME`) a mig-parted config gives one model, and the
    warnings to show: one per kept config and profile it skipped, and one line naming the
    configs left out (a stock file covers many models: one line, not one per config)."""

    layouts: dict[str, StaticLayout]
    warnings: tuple[str, ...]


def read_mig_parted(text: str, source: str) -> dict[str, Any]:
    """The `mig-configs` of a mig-parted config file, checked for its version. A ConfigMap
    holding one (the GPU Operator's `default-mig-parted-config`, as `kubectl get -o yaml`
    prints it) is read from its `config.yaml` key, or its only key."""
    doc = _yaml(text, source)
    if isinstance(doc, dict) and doc.get("kind") == "ConfigMap":
        data = doc.get("data")
        if not isinstance(data, dict) or not data:
            raise InvalidInput(f"{source}: data", "the ConfigMap holds no mig-parted config")
        key = "config.yaml" if "config.yaml" in data else next(iter(data))
        if len(data) > 1 and key != "config.yaml":
            raise InvalidInput(f"{source}: data", f"expected a key config.yaml, got {sorted(data)}")
        source = f"{source}: data.{key}"
        doc = _yaml(str(data[key]), source)
    if not isinstance(doc, dict):
        raise InvalidInput(source, "expected a mig-parted config (version: v1, mig-configs)")
    if doc.get("version") != "v1":
        raise InvalidInput(f"{source}: version", f"expected v1, got {doc.get('version')!r}")
    configs = doc.get("mig-configs")
    if not isinstance(configs, dict) or not configs:
        raise InvalidInput(f"{source}: mig-configs", "expected a map of named configs")
    return configs


def _yaml(text: str, source: str) -> object:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidInput(source, f"invalid YAML: {exc}".replace("\n", " ")) from None


def mig_parted_layouts(
    table: ModelTable, configs: Mapping[str, object], gpus: int, source: str
) -> MigPartedLayouts:
    """Every config of a mig-parted file as a static policy for nodes of `gpus` GPUs of one
    model. Profiles the model does not offer are skipped; a config left with nothing for the
    model (its device-filters exclude it, or it named only such profiles) is left out."""
    layouts: dict[str, StaticLayout] = {}
    warnings: list[str] = []
    left_out: list[str] = []
    for name, entries in configs.items():
        found = mig_parted_layout(table, str(name), entries, gpus, source)
        if not found.applies or (found.skipped and not any(found.layout)):
            left_out.append(str(name))
            continue
        layouts[f"static:{name}"] = found.layout
        warnings.extend(
            f"{source}: mig-configs.{name}: {profile} is not offered by {table.model}, skipped"
            for profile in found.skipped
        )
    if left_out:
        warnings.append(
            f"{source}: {len(left_out)} of {len(configs)} configs are for other models than "
            f"{table.model} (device-filter, or only profiles it does not offer), left out: "
            + ", ".join(left_out)
        )
    return MigPartedLayouts(layouts, tuple(warnings))


def mig_parted_layout(
    table: ModelTable, name: str, entries: object, gpus: int, source: str
) -> ConfigLayout:
    """One named mig-parted config as the layout of each of a node's `gpus` GPUs, read as
    mig-parted applies it: an entry applies to the GPUs its `devices` names whose PCI device
    id its `device-filter` (absent: every model) admits; a later entry wins over an earlier
    one for the same GPU."""
    where = f"{source}: mig-configs.{name}"
    if not isinstance(entries, list) or not entries:
        raise InvalidInput(where, "expected a list of device groups")
    per_gpu: list[tuple[Instance, ...] | None] = [None] * gpus
    skipped: dict[str, None] = {}
    applies = False
    for k, entry in enumerate(entries):
        at = f"{where}[{k}]"
        if not isinstance(entry, dict):
            raise InvalidInput(at, "expected an object with devices and mig-enabled")
        for key in entry:
            if key not in ENTRY_FIELDS:
                raise InvalidInput(
                    f"{at}.{key}", f"unknown field (known: {', '.join(ENTRY_FIELDS)})"
                )
        indices = _devices(entry.get("devices"), gpus, f"{at}.devices")
        enabled = entry.get("mig-enabled")
        if not isinstance(enabled, bool):
            raise InvalidInput(f"{at}.mig-enabled", "expected true or false")
        counts = _mig_devices(entry.get("mig-devices", {}), f"{at}.mig-devices")
        if not _admits(entry.get("device-filter"), table, f"{at}.device-filter"):
            continue
        applies = True
        if not enabled:
            layout = layout_with(table, whole(table), at)
        else:
            for profile in counts:
                if not table.has(profile):
                    skipped[profile] = None
            offered = {p: n for p, n in counts.items() if table.has(p)}
            layout = layout_with(table, offered, f"{at}.mig-devices")
        for index in indices:
            per_gpu[index] = layout
    # GPUs that no group names keep no instance (MIG on, nothing created).
    return ConfigLayout(tuple(layout or () for layout in per_gpu), tuple(skipped), applies)


def _devices(devices: object, gpus: int, where: str) -> list[int]:
    if devices == "all":
        return list(range(gpus))
    if isinstance(devices, list) and all(
        isinstance(d, int) and not isinstance(d, bool) for d in devices
    ):
        return [d for d in devices if 0 <= d < gpus]
    raise InvalidInput(where, "expected 'all' or a list of GPU indices")


def _mig_devices(counts: object, where: str) -> dict[str, int]:
    if not isinstance(counts, dict) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts.values()
    ):
        raise InvalidInput(where, "expected a map of profile: count")
    for profile in counts:
        if not MIG_PARTED_PROFILE_RE.match(str(profile)):
            raise InvalidInput(f"{where}.{profile}", "not a MIG profile name (e.g. 3g.40gb)")
    return {str(p): n for p, n in counts.items()}


def _admits(device_filter: object, table: ModelTable, where: str) -> bool:
    """Whether a `device-filter` (a PCI id like 0x233010DE, or a list of them; absent: every
    model) admits the model. A filter with a subsystem id (`0x233010DE:0x16C110DE`) names one
    board of the chip: the simulated model stands for all its boards, so the chip decides."""
    if device_filter is None:
        return True
    filters = [device_filter] if isinstance(device_filter, str) else device_filter
    if not isinstance(filters, list) or not all(isinstance(f, str) for f in filters):
        raise InvalidInput(where, "expected a PCI device id (e.g. 0x233010DE) or a list of them")
    admitted = False
    for text in filters:
        parts = text.split(":")
        if len(parts) > 2:
            raise InvalidInput(where, f"{text!r}: expected DEVICEVENDOR[:SUBDEVICESUBVENDOR]")
        packed, *_subsystem = [_pci_id(part, where) for part in parts]
        device, vendor = packed >> 16, packed & 0xFFFF
        admitted |= vendor == NVIDIA_VENDOR_ID and device in table.pci_device_ids
    return admitted


def _pci_id(text: str, where: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        value = -1
    if not 0 <= value < 1 << 32:
        raise InvalidInput(where, f"{text!r} is not a PCI device id (e.g. 0x233010DE)")
    return value


def shapes(table: ModelTable) -> dict[str, tuple[Instance, ...]]:
    """Full GPU layouts (nothing more fits) of the smallest-memory profile of each size, the
    candidates of the best-static search, keyed by their compute slices: `7`, `4+3`, `3+3`,
    `3+2+1+1`, ..."""
    sizes = sorted({table.profile(n).compute_slices for n in plain_profiles(table)})
    names = {by_size(table, s) for s in sizes}
    found: dict[str, tuple[Instance, ...]] = {}
    for layout in enumerate_layouts(table, frozenset()):
        if not layout or any(i.profile not in names for i in layout):
            continue
        if any(i.profile in names for i in addable_placements(table, layout)):
            continue
        key = "+".join(
            sorted((str(table.profile(i.profile).compute_slices) for i in layout), key=int)[::-1]
        )
        found.setdefault(key, tuple(sorted(layout, key=lambda i: i.start)))
    return found

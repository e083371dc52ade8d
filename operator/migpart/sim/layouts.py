"""Static layouts: mig-parted config files, the built-in `all-balanced` and `all-7g`, and the
per-GPU shapes that the search for the best fixed mix combines.

A mig-parted config (`version: v1`, `mig-configs: {NAME: [{devices: all | [i, ...],
mig-enabled: bool, mig-devices: {PROFILE: COUNT}}]}`) gives instance counts per GPU, not
placements; each GPU gets the first valid layout (`migpart.mig.enumerate_layouts`, smallest
placements first) with exactly those counts. A GPU with `mig-enabled: false` is one whole-GPU
device, which the simulator counts as the largest profile.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
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


def read_mig_parted(text: str, source: str) -> dict[str, Any]:
    """The `mig-configs` of a mig-parted config file, checked for its version."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidInput(source, f"invalid YAML: {exc}".replace("\n", " ")) from None
    if not isinstance(doc, dict):
        raise InvalidInput(source, "expected a mig-parted config (version: v1, mig-configs)")
    if doc.get("version") != "v1":
        raise InvalidInput(f"{source}: version", f"expected v1, got {doc.get('version')!r}")
    configs = doc.get("mig-configs")
    if not isinstance(configs, dict) or not configs:
        raise InvalidInput(f"{source}: mig-configs", "expected a map of named configs")
    return configs


def mig_parted_layout(
    table: ModelTable, name: str, entries: object, gpus: int, source: str
) -> StaticLayout:
    """One named mig-parted config as the layout of each of a node's `gpus` GPUs."""
    where = f"{source}: mig-configs.{name}"
    if not isinstance(entries, list) or not entries:
        raise InvalidInput(where, "expected a list of device groups")
    per_gpu: list[tuple[Instance, ...] | None] = [None] * gpus
    for k, entry in enumerate(entries):
        at = f"{where}[{k}]"
        if not isinstance(entry, dict):
            raise InvalidInput(at, "expected an object with devices and mig-enabled")
        devices = entry.get("devices")
        if devices == "all":
            indices = list(range(gpus))
        elif isinstance(devices, list) and all(
            isinstance(d, int) and not isinstance(d, bool) for d in devices
        ):
            indices = [d for d in devices if 0 <= d < gpus]
        else:
            raise InvalidInput(f"{at}.devices", "expected 'all' or a list of GPU indices")
        enabled = entry.get("mig-enabled")
        if not isinstance(enabled, bool):
            raise InvalidInput(f"{at}.mig-enabled", "expected true or false")
        if not enabled:
            layout = layout_with(table, whole(table), at)
        else:
            counts = entry.get("mig-devices", {})
            if not isinstance(counts, dict) or not all(
                isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts.values()
            ):
                raise InvalidInput(f"{at}.mig-devices", "expected a map of profile: count")
            layout = layout_with(table, {str(p): n for p, n in counts.items()}, f"{at}.mig-devices")
        for index in indices:
            per_gpu[index] = layout
    # GPUs that no group names keep no instance (MIG on, nothing created).
    return tuple(layout or () for layout in per_gpu)


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

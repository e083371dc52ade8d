"""Pure MIG geometry: profile tables, the built-in catalog, layouts and their validity.

Nothing here performs I/O, logs or reads the clock.
"""

from migpart.mig.catalog import CATALOG, builtin_table, lookup_table
from migpart.mig.layout import (
    Instance,
    addable_placements,
    check_layout,
    enumerate_layouts,
    layout_problems,
    memory_mask,
)
from migpart.mig.profiles import ModelTable, Profile, device_name, parse_profile_name

__all__ = [
    "CATALOG",
    "Instance",
    "ModelTable",
    "Profile",
    "addable_placements",
    "builtin_table",
    "check_layout",
    "device_name",
    "enumerate_layouts",
    "layout_problems",
    "lookup_table",
    "memory_mask",
    "parse_profile_name",
]

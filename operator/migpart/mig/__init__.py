"""Pure MIG geometry: profile tables, the built-in catalog, layouts and their validity.

Nothing here performs I/O, logs or reads the clock.
"""

from migpart.mig.catalog import CATALOG, builtin_table, lookup_table
from migpart.mig.layout import Instance, addable_placements, enumerate_layouts, layout_problems
from migpart.mig.occupancy import Occupancy
from migpart.mig.profiles import ModelTable, Profile, device_name, parse_profile_name

__all__ = [
    "CATALOG",
    "Instance",
    "ModelTable",
    "Occupancy",
    "Profile",
    "addable_placements",
    "builtin_table",
    "device_name",
    "enumerate_layouts",
    "layout_problems",
    "lookup_table",
    "parse_profile_name",
]

"""The cost of a change to a GPU layout, as the planner and the node packer both count it.

A cost is a vector compared in lexicographic order: free instances destroyed, GPUs newly
changed, instances created, preference rank (how far down its request's list of profiles a
device is), capacity lost. It is kept in one int, five unsigned 24-bit fields with the most
significant first, so that costs add and compare as vectors with plain int operations.

Capacity lost is the drop of `free_capacity`: best fit keeps the free space in large blocks.
"""

from __future__ import annotations

from functools import lru_cache

from migpart.mig import Instance, ModelTable, Occupancy

FIELD = 24
DESTROYED = 4 * FIELD
CHANGED = 3 * FIELD
CREATED = 2 * FIELD
RANK = FIELD


def cost_of(destroyed: int, changed: int, created: int, rank: int, lost: int) -> int:
    return (
        (destroyed << DESTROYED)
        | (changed << CHANGED)
        | (created << CREATED)
        | (rank << RANK)
        | lost
    )


@lru_cache(maxsize=8192)
def free_capacity(table: ModelTable, taken: frozenset[Instance]) -> int:
    """How much the space beside `taken` can still host, weighted by compute slices.

    For every profile (media-extension variants aside) the most instances that fit, ignoring
    the other profiles. Less of it lost means the free space stays in larger blocks.
    """
    occupancy = Occupancy.of(table, taken)
    return sum(
        occupancy.fit(prof) * prof.compute_slices for prof in table.profiles if "+" not in prof.name
    )

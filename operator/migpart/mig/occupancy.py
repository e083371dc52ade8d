"""What a set of MIG instances takes of one GPU, and what still fits beside it.

Three of the four layout rules (see `migpart.mig.layout`) are sums over the instances: the
memory slices they cover, the compute slices they use and how many there are of each profile.
`Occupancy` holds those sums once, so that every check of "does this still fit" (the layout
enumeration, the planner's cost of a device, the exact node packer) asks the same object
instead of adding them up again its own way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from migpart.mig.profiles import ModelTable, Profile

if TYPE_CHECKING:
    from migpart.mig.layout import Instance


@dataclass(frozen=True, slots=True)
class Occupancy:
    """The memory slices (a bit mask), compute slices and instances per profile that a set
    of instances takes of one GPU of `table`. Overlapping instances are not checked here:
    their memory slices are merged."""

    table: ModelTable
    mask: int
    compute: int
    counts: Mapping[str, int]

    @classmethod
    def of(cls, table: ModelTable, instances: Iterable[Instance]) -> Occupancy:
        mask = 0
        compute = 0
        counts: dict[str, int] = {}
        for inst in instances:
            prof = table.profile(inst.profile)
            mask |= prof.mask(inst.start)
            compute += prof.compute_slices
            counts[inst.profile] = counts.get(inst.profile, 0) + 1
        return cls(table, mask, compute, counts)

    def count(self, profile: str) -> int:
        """How many instances of `profile` there are."""
        return self.counts.get(profile, 0)

    def headroom(self, prof: Profile) -> int:
        """How many more instances of `prof` the instance limit and the compute slices allow,
        memory slices aside."""
        return min(
            prof.max_instances - self.count(prof.name),
            (self.table.compute_slices - self.compute) // prof.compute_slices,
        )

    def fit(self, prof: Profile) -> int:
        """The most instances of `prof` that fit beside these ones, other profiles ignored.

        Placements are taken earliest first, which is optimal for ranges of equal length.
        """
        limit = self.headroom(prof)
        fit = 0
        occupied = self.mask
        for start in prof.placements:
            if fit >= limit:
                break
            m = prof.mask(start)
            if not occupied & m:
                occupied |= m
                fit += 1
        return fit

    def admits(self, other: Occupancy) -> bool:
        """Whether instances that occupy `other` can join these ones: no memory slice in
        common, and the compute slices and every instance limit kept."""
        if self.mask & other.mask or self.compute + other.compute > self.table.compute_slices:
            return False
        table = self.table
        return all(
            self.count(p) + n <= table.profile(p).max_instances for p, n in other.counts.items()
        )

"""The `planning.candidates.Selectors` port with real CEL (`kube.cel`): DeviceClass and request
selectors evaluated against a virtual device of each MIG profile.

Verdicts are cached per (selectors, profile table): the operator re-reads every pending claim
whose outcome it must compute again, claims from one template repeat the same selectors, and
evaluating them costs about a millisecond each in cel-python. Profile tables are interned by
`controller.rounds.scope.ScopeCache`, so every GPU of a model hits the same entry.
"""

from __future__ import annotations

from functools import lru_cache

from migpart.errors import SelectorError
from migpart.kube.cel import Device, matches, virtual_device
from migpart.mig.profiles import ModelTable, Profile
from migpart.planning.candidates import Verdict, by_size
from migpart.slices.dra import DRIVER


@lru_cache(maxsize=64)
def _table_devices(table: ModelTable) -> tuple[tuple[Profile, Device], ...]:
    """Virtual devices of every profile of `table`, smallest first (built once per table)."""
    return tuple((p, virtual_device(table, p.name)) for p in by_size(table))


@lru_cache(maxsize=8192)
def _verdicts(selectors: tuple[str, ...], table: ModelTable) -> tuple[tuple[Profile, Verdict], ...]:
    out: list[tuple[Profile, Verdict]] = []
    for profile, device in _table_devices(table):
        try:
            out.append((profile, matches(selectors, device)))
        except SelectorError as ex:
            out.append((profile, ex))
    return tuple(out)


class CelSelectors:
    """Selectors evaluated with cel-python (see the module docstring)."""

    def verdicts(
        self, selectors: tuple[str, ...], table: ModelTable
    ) -> tuple[tuple[Profile, Verdict], ...]:
        return _verdicts(selectors, table)

    def bare(self, selectors: tuple[str, ...]) -> bool:
        try:
            return matches(selectors, Device(driver=DRIVER, attributes={}, capacity={}))
        except SelectorError:
            return False


CEL = CelSelectors()

"""The invariant that matters: no device disappears from its node while a claim holds it.

Every harness that looks at a cluster checks it with this one ledger: the e2e suite, the
scale and chaos benchmarks, the demo's replay. It orders "held since A" and "gone at R" by
etcd revisions (resourceVersion), not by when a watch or a poll happened to deliver them, so
a watch on claims that runs behind a watch on MigNodes reports nothing false.

A watch sees every change at its own revision (`every_change=True`). A poll sees a change
only somewhere after its previous look at that object and at or before this one, and an
object listed unchanged stood so at least up to the highest revision seen by then; a holding
counts only when it certainly spans the disappearance: held at or before the node's previous
look, released only after this one. So a poll never reports what did not happen, provided it
lists the MigNodes before the claims (a release before a device went then shows in the list).

Violations are judged when asked for, from everything seen so far: a release that arrives
after the disappearance it preceded still clears it.

The other invariant every harness checks is that no GPU's memory is allocated twice
(`overlapping_allocations`): two claims never hold the same device, nor, in offer mode, where
the pool lists every placement and its GPU's counters keep overlapping ones apart, two
placements of one GPU that share a memory slice.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from itertools import combinations
from typing import TYPE_CHECKING, Any

from migpart.mig import device_name
from migpart.slices.dra import DRIVER

if TYPE_CHECKING:
    from migpart.mig import ModelTable

Device = tuple[str, str]
"""(node, device name); a node's pool carries the node's name."""


@dataclass(frozen=True, order=True)
class Violation:
    node: str
    device: str
    holder: str

    def __str__(self) -> str:
        return f"{self.node}/{self.device} (held by {self.holder})"


@dataclass
class _Holding:
    holder: str
    since: int
    until: int | None = None  # the first revision at which it was certainly released


def allocated_devices(claim: Mapping[str, Any]) -> set[Device]:
    """(node, device) of every device of ours allocated to the claim (pool name = node)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return {
        (r["pool"], r["device"])
        for r in (allocation.get("devices") or {}).get("results") or []
        if r.get("driver") == DRIVER
    }


def present_devices(mignode: Mapping[str, Any]) -> set[str]:
    """The devices of the instances a MigNode's status reports."""
    return {
        device_name(g["index"], i["profile"], i["start"])
        for g in (mignode.get("status") or {}).get("gpus") or []
        for i in g.get("instances") or []
    }


def claim_key(claim: Mapping[str, Any]) -> str:
    meta = claim["metadata"]
    return f"{meta.get('namespace', '')}/{meta['name']}"


def _revision(obj: Mapping[str, Any]) -> int:
    return int(obj["metadata"]["resourceVersion"])


class DestroyedWhileAllocated:
    """The ledger: who held which device over which revisions, and when devices vanished."""

    def __init__(self, *, every_change: bool = True) -> None:
        self.every_change = every_change
        self._holdings: dict[Device, list[_Holding]] = {}
        self._held: dict[str, tuple[int, set[Device]]] = {}  # holder -> (revision, devices)
        self._present: dict[str, tuple[int, set[str]]] = {}  # node -> (revision, devices)
        self._vanished: dict[Device, list[tuple[int, int]]] = {}  # gone in (after, at]
        self._seen = 0  # the highest revision seen so far: a poll's own time is no earlier

    def _after(self, last: int, at: int) -> int:
        """The revision after which a change seen at `at` happened."""
        return at - 1 if self.every_change else last

    def _look(self, at: int) -> int:
        """The revision an object seen now stood at: its own in a watch; in a poll, the highest
        seen so far, since an object listed unchanged still stood so when it was listed."""
        self._seen = max(self._seen, at)
        return at if self.every_change else self._seen

    # ------------------------------------------------------------------ primitives

    def hold(self, holder: str, devices: Iterable[Device], at: int) -> None:
        """`holder` holds exactly `devices` as of revision `at`."""
        last, before = self._held.get(holder, (at, set()))
        now = set(devices)
        mark = self._look(at)
        self._end(holder, before - now, self._after(last, at) + 1)
        for key in now - before:
            self._holdings.setdefault(key, []).append(_Holding(holder, at))
        if now:
            self._held[holder] = (mark, now)
        else:
            self._held.pop(holder, None)

    def held(self, holders: Mapping[str, Iterable[Device]], at: int) -> None:
        """A full listing at one revision: the holders it omits hold nothing any more."""
        for holder, devices in holders.items():
            self.hold(holder, devices, at)
        self._release_absent(holders.keys())

    def present(self, node: str, devices: Iterable[str], at: int) -> None:
        """The node has exactly `devices` as of revision `at` (its first look: a baseline)."""
        now = set(devices)
        mark = self._look(at)
        if node in self._present:
            last, before = self._present[node]
            for device in before - now:
                self._vanished.setdefault((node, device), []).append((self._after(last, at), at))
        self._present[node] = (mark, now)

    def forget(self, node: str) -> None:
        """The node's object is gone; deleting it destroys no instance."""
        self._present.pop(node, None)

    def _release_absent(self, keep: Collection[str]) -> None:
        """Holders a full listing omits: gone some time after they were last seen."""
        for holder in [h for h in self._held if h not in keep]:
            last, devices = self._held.pop(holder)
            self._end(holder, devices, last + 1)

    def _end(self, holder: str, keys: Iterable[Device], until: int) -> None:
        for key in keys:
            for holding in self._holdings[key]:
                if holding.holder == holder and holding.until is None:
                    holding.until = until

    # ------------------------------------------------------------------ API bodies

    def on_claim(self, event_type: str, claim: Mapping[str, Any]) -> None:
        """A ResourceClaim watch event (ADDED, MODIFIED, DELETED), raw JSON."""
        devices = set() if event_type == "DELETED" else allocated_devices(claim)
        self.hold(claim_key(claim), devices, _revision(claim))

    def on_mignode(self, event_type: str, mignode: Mapping[str, Any]) -> None:
        """A MigNode watch event (ADDED, MODIFIED, DELETED), raw JSON."""
        if event_type == "DELETED":
            self.forget(mignode["metadata"]["name"])
        else:
            self.present(mignode["metadata"]["name"], present_devices(mignode), _revision(mignode))

    def claims_listed(self, claims: Iterable[Mapping[str, Any]]) -> None:
        """Every ResourceClaim a poll listed; the ones missing from it were deleted."""
        keys = set()
        for claim in claims:
            keys.add(claim_key(claim))
            self.on_claim("MODIFIED", claim)
        self._release_absent(keys)

    def mignodes_listed(self, mignodes: Iterable[Mapping[str, Any]]) -> None:
        """Every MigNode a poll listed (the ones missing from it are forgotten)."""
        names = set()
        for mignode in mignodes:
            names.add(mignode["metadata"]["name"])
            self.on_mignode("MODIFIED", mignode)
        for node in [n for n in self._present if n not in names]:
            self.forget(node)

    # ------------------------------------------------------------------ the verdict

    @property
    def violations(self) -> list[Violation]:
        """Every device that vanished while a holding certainly spanned it, sorted."""
        found = {
            Violation(key[0], key[1], holding.holder)
            for key, gone in self._vanished.items()
            for holding in self._holdings.get(key, [])
            for after, at in gone
            if holding.since <= after and (holding.until is None or holding.until > at)
        }
        return sorted(found)


def _masks(table: ModelTable, gpu: int) -> dict[str, int]:
    """Device name -> the memory slices it takes, for every placement of one GPU."""
    return {
        device_name(gpu, p.name, start): p.mask(start)
        for p in table.profiles
        for start in p.placements
    }


def overlapping_allocations(
    held: Mapping[str, Iterable[Device]], table_of: Callable[[str], ModelTable | None]
) -> set[str]:
    """Devices that `held` (holder -> devices, e.g. claim -> its allocated devices) gives out
    twice: one device to two holders, or two placements of one GPU that share a memory slice
    (`table_of(node)` is the node's GPU model; None: only the first check), each pair as
    `node/device + node/device (holder, holder)`."""
    by_gpu: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for holder, devices in held.items():
        for node, device in devices:
            gpu = device.split("-", 2)[1] if device.startswith("gpu-") else ""
            by_gpu.setdefault((node, gpu), []).append((device, holder))
    masks: dict[tuple[str, str], dict[str, int]] = {}
    found = set()
    for (node, gpu), taken in by_gpu.items():
        table = table_of(node)
        if table is not None and gpu.isdigit():
            masks[(node, gpu)] = _masks(table, int(gpu))
        mask = masks.get((node, gpu), {})
        for (a, holder_a), (b, holder_b) in combinations(sorted(taken), 2):
            if a == b or mask.get(a, 0) & mask.get(b, 0):
                found.add(f"{node}/{a} + {node}/{b} ({holder_a}, {holder_b})")
    return found

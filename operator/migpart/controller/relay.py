"""Offer mode, the pure half of the relay: from "the scheduler allocated a placement that does
not exist yet" to the spec that creates it and the claim's binding conditions.

In offer mode a node's slice lists, besides its instances, placements not created yet; the
scheduler allocates one to a claim at once and waits in PreBind for the claim's
`status.devices` entry to say `INSTANCE_READY` (KEP-5007 binding conditions, `migpart.dra`).
The operator then, between planning rounds (`controller/offer_relay.py` carries it out):

1. adds each allocated placement without an instance to the node's MigNode spec (`relay`), so
   that the agent creates it. A placement that overlaps one the spec already wants, or an
   instance in use, is not added: it is a *conflict* (two claims got overlapping placements
   from slices that changed under the scheduler); nothing is ever dropped or destroyed for it;
2. once the agent reports the instance, sets `INSTANCE_READY` on the claim; when the agent
   reports it failed (`status.failedInstances`), or the placement conflicts, sets
   `INSTANCE_FAILED` with the reason, and kube-scheduler sends the pod back to scheduling
   (`binding_entries`);
3. drops from the spec each placement the agent could not create once no claim holds it any
   more (`abandoned`): nothing exists there, so nothing is destroyed, and the agent stops
   retrying it. Without that the failed placement would stay wanted for ever, and the planner,
   which counts it as used (`kube.snapshot`), would never give its space to anything else. A
   placement dropped so is not created again for a while (the relay's back-off,
   `controller/offer_relay.py`): one a claim holds meanwhile fails at once (`backed_off`).

The spec `relay` writes keeps everything else the spec wanted and gets a new planId derived from
the previous one (`relayed_plan_id`), so that the node counts as reconfiguring until the agent
carried it out. The planner counts an allocated placement as a used instance
(`kube.snapshot`), so the next round keeps it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from migpart.api.models import FailedInstance, GpuSpec, MigInstanceSpec, MigNode, MigNodeSpec
from migpart.dra import DRIVER, INSTANCE_FAILED, INSTANCE_READY, DeviceId
from migpart.mig import Instance, ModelTable, device_name, layout_problems
from migpart.types import Body

# The reason of the failure condition of a claim allocated a placement the relay dropped lately
# because the agent could not create it (`RelayDecision.backed_off`).
BACKING_OFF = "PlacementBackingOff"


@dataclass(frozen=True, slots=True)
class Placement:
    """A device name of the node resolved to its MIG placement."""

    gpu: int
    instance: Instance
    table: ModelTable


def placements(node: MigNode) -> dict[str, Placement]:
    """Device name -> placement, for every placement of every MIG-enabled GPU the agent
    reports (with its profile table)."""
    out: dict[str, Placement] = {}
    for gpu in node.status.gpus if node.status else []:
        if not gpu.mig_enabled or not gpu.profiles:
            continue
        table = gpu.table()
        for profile in table.profiles:
            for start in profile.placements:
                name = device_name(gpu.index, profile.name, start)
                out[name] = Placement(gpu.index, Instance(profile.name, start), table)
    return out


def existing(node: MigNode) -> dict[int, dict[Instance, str]]:
    """GPU -> instance -> its state, as the agent reports them."""
    return {
        g.index: {Instance(i.profile, i.start): i.state for i in g.instances}
        for g in (node.status.gpus if node.status else [])
    }


@dataclass(frozen=True)
class RelayDecision:
    """What `relay` decided for one node."""

    spec: MigNodeSpec | None  # the spec to write; None: nothing to add or drop
    added: tuple[str, ...] = ()
    # (claim key, device) -> why the placement cannot be created
    conflicts: Mapping[tuple[str, str], str] = field(default_factory=dict)
    # the placements the spec drops (`abandoned`): it must be written over the MigNode as read
    dropped: tuple[str, ...] = ()
    # (claim key, device) -> why a placement in its back-off is not added again
    backed_off: Mapping[tuple[str, str], str] = field(default_factory=dict)


def relayed_plan_id(previous: str | None, added: Iterable[str]) -> str:
    """The planId of a spec that adds `added` to the one of plan `previous`: the same
    inputs give the same id (a relay repeated writes nothing new), and it differs from
    `previous`, so the node counts as reconfiguring until the agent observes it."""
    base = (previous or "relay").split("+", 1)[0][:100]
    digest = hashlib.sha256(f"{previous}|{','.join(sorted(added))}".encode()).hexdigest()
    return f"{base}+{digest[:12]}"


def abandoned(node: MigNode, held: Iterable[str]) -> dict[str, Placement]:
    """The placements the spec wants that the agent reports it could not create
    (`status.failedInstances`), that do not exist, not even half made, on a GPU the agent
    reports, and that no device name in `held` (what claims hold on the node) names: nothing
    waits for them, and the agent would retry them for ever. Dropping them from the spec
    destroys nothing."""
    if node.status is None or not node.status.failed_instances:
        return {}
    desired = node.desired()
    actual = existing(node)
    table = placements(node)
    holding = set(held)
    out: dict[str, Placement] = {}
    for failure in node.status.failed_instances:
        name = device_name(failure.gpu, failure.profile, failure.start)
        where = table.get(name)
        if where is None or name in holding or where.gpu not in actual:
            continue
        if where.instance in desired.get(where.gpu, ()) and where.instance not in actual[where.gpu]:
            out[name] = where
    return out


def relay(
    node: MigNode, held: Sequence[tuple[str, str]], backing_off: Iterable[str] = ()
) -> RelayDecision:
    """The spec adding the placements that `held` names on `node` and that have no instance,
    and dropping the ones the agent could not create that no claim holds (`abandoned`).

    `held`: (claim key, device name) of our devices that claims' allocations name in the
    node's pool. A device already in the spec, or that exists, is left as it is
    (idempotent); one that is not a placement of the node is ignored. Placements are taken
    in the order: those the spec has, then by claim key; one that does not fit next to what
    the GPU keeps (what the spec wants less what is dropped, or what exists where the spec
    does not list the GPU, plus every instance in use) and what was added before it is a
    conflict. `backing_off`: placements dropped lately (the relay's back-off); one a claim
    holds is not added again but `backed_off`.
    """
    table = placements(node)
    actual = existing(node)
    desired = node.desired()
    dropped = abandoned(node, (device for _, device in held))
    gone: dict[int, set[Instance]] = {}
    for place in dropped.values():
        gone.setdefault(place.gpu, set()).add(place.instance)
    cooling = set(backing_off)
    kept: dict[int, set[Instance]] = {}
    added: dict[int, list[Instance]] = {}
    names: list[str] = []
    conflicts: dict[tuple[str, str], str] = {}
    backed_off: dict[tuple[str, str], str] = {}

    def keeps(gpu: int) -> set[Instance]:
        if gpu not in kept:
            now = actual.get(gpu, {})
            base = set(desired[gpu]) - gone.get(gpu, set()) if gpu in desired else set(now)
            kept[gpu] = base | {i for i, state in now.items() if state != "Free"}
        return kept[gpu]

    def order(item: tuple[str, str]) -> tuple[bool, str, str]:
        where = table.get(item[1])
        wanted = where is not None and where.instance in desired.get(where.gpu, frozenset())
        return (not wanted, item[0], item[1])

    for key, device in sorted(set(held), key=order):
        where = table.get(device)
        if where is None or where.instance in actual.get(where.gpu, {}):
            continue
        keep = keeps(where.gpu)
        if where.instance in keep:
            continue
        if device in cooling:
            what = f"{where.instance.profile}@{where.instance.start} on GPU {where.gpu}"
            backed_off[(key, device)] = (
                f"{what} could not be created lately; not tried again before its back-off ends"
            )
            continue
        problems = layout_problems(where.table, [where.instance, *sorted(keep)])
        if problems:
            conflicts[(key, device)] = _conflict(where, keep)
            continue
        keep.add(where.instance)
        added.setdefault(where.gpu, []).append(where.instance)
        names.append(device)
    for gpu in gone:
        keeps(gpu)
    if not names and not dropped:
        return RelayDecision(None, conflicts=conflicts, backed_off=backed_off)
    changes = [*names, *(f"-{d}" for d in sorted(dropped))]
    return RelayDecision(
        _spec(node, kept, set(added) | set(gone), changes),
        tuple(names),
        conflicts,
        tuple(sorted(dropped)),
        backed_off,
    )


def _conflict(where: Placement, keep: set[Instance]) -> str:
    mask = where.table.profile(where.instance.profile).mask(where.instance.start)
    clash = [
        f"{i.profile}@{i.start}"
        for i in sorted(keep)
        if where.table.has(i.profile) and where.table.profile(i.profile).mask(i.start) & mask
    ]
    what = f"{where.instance.profile}@{where.instance.start} on GPU {where.gpu}"
    if clash:
        return f"{what} overlaps {', '.join(clash)}, wanted or in use on the node"
    return f"{what} does not fit next to what the GPU keeps"


def _spec(
    node: MigNode,
    kept: Mapping[int, set[Instance]],
    changed: Iterable[int],
    names: Sequence[str],
) -> MigNodeSpec:
    """The node's spec with each GPU of `changed` wanting what it keeps; `names` says what
    changed (for the planId)."""
    spec = node.spec if node.spec is not None and node.spec.plan_id is not None else None
    gpus = {g.index: g for g in spec.gpus} if spec is not None else {}
    for index in sorted(changed):
        gpus[index] = GpuSpec(
            index=index,
            instances=[
                MigInstanceSpec(profile=i.profile, start=i.start) for i in sorted(kept[index])
            ],
        )
    return MigNodeSpec(
        plan_id=relayed_plan_id(spec.plan_id if spec else None, names),
        gpus=[gpus[i] for i in sorted(gpus)],
    )


# ---------------------------------------------------------------- binding conditions


@dataclass(frozen=True, slots=True)
class Verdict:
    """A binding condition to set on one device of a claim."""

    type: str
    reason: str
    message: str


def verdict(node: MigNode | None, device: DeviceId, conflict: str | None = None) -> Verdict | None:
    """What the claim's entry for `device` must say now: ready once the agent reports the
    instance with its MIG device, failed when the agent reports it failed or `conflict`
    says why it cannot be created, None while it is still being created."""
    if conflict is not None:
        return Verdict(INSTANCE_FAILED, "PlacementConflict", conflict)
    if node is None or node.status is None:
        return None
    where = placements(node).get(device.device)
    if where is None:
        return None
    for gpu in node.status.gpus:
        if gpu.index != where.gpu:
            continue
        for inst in gpu.instances:
            if Instance(inst.profile, inst.start) == where.instance and inst.uuid:
                return Verdict(INSTANCE_READY, "InstanceCreated", f"MIG device {inst.uuid}")
    failed = _failed(node.status.failed_instances, where)
    if failed is not None:
        reason = "InstanceRefused" if failed.reason == "Overlap" else "NvmlError"
        return Verdict(INSTANCE_FAILED, reason, failed.message or failed.reason)
    return None


def _failed(failures: Iterable[FailedInstance], where: Placement) -> FailedInstance | None:
    return next(
        (
            f
            for f in failures
            if f.gpu == where.gpu and Instance(f.profile, f.start) == where.instance
        ),
        None,
    )


def device_entry(device: DeviceId, verdict: Verdict, now: str) -> dict[str, Any]:
    """The claim's `status.devices` entry carrying `verdict` (a metav1.Condition)."""
    return {
        "driver": DRIVER,
        "pool": device.pool,
        "device": device.device,
        "conditions": [
            {
                "type": verdict.type,
                "status": "True",
                "reason": verdict.reason,
                "message": verdict.message[:1024],
                "lastTransitionTime": now,
            }
        ],
    }


def entries_of(claim: Body) -> dict[DeviceId, dict[str, Any]]:
    """Our entries in the claim's `status.devices`, by device."""
    return {
        DeviceId(str(e.get("pool") or ""), str(e.get("device") or "")): e
        for e in (claim.get("status") or {}).get("devices") or []
        if e.get("driver") == DRIVER and not e.get("shareID")
    }


def says(entry: Mapping[str, Any] | None, verdict: Verdict) -> bool:
    """Whether `entry` carries `verdict`'s condition as True already."""
    return any(
        c.get("type") == verdict.type and c.get("status") == "True"
        for c in (entry or {}).get("conditions") or []
    )


def binding_entries(
    claim: Body, verdicts: Mapping[DeviceId, Verdict], now: str
) -> list[dict[str, Any]] | None:
    """The claim's whole `status.devices` list with `verdicts` set, or None when every
    verdict is there already. Entries of other drivers and our other devices are kept as
    they are (a merge patch replaces the list)."""
    ours = entries_of(claim)
    todo = {d: v for d, v in verdicts.items() if not says(ours.get(d), v)}
    if not todo:
        return None
    out = [
        e
        for e in (claim.get("status") or {}).get("devices") or []
        if not (
            e.get("driver") == DRIVER
            and DeviceId(str(e.get("pool") or ""), str(e.get("device") or "")) in todo
        )
    ]
    out.extend(device_entry(d, v, now) for d, v in sorted(todo.items()))
    return out

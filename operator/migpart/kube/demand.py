"""One claim's demand (`ClaimDemand`): which MIG profiles, how many, and on one GPU or not.

A policy's demand, what `controller.scope` gathers from the claims that fall under it, is
built from these. Pure functions over API bodies (dicts as the API server returns them,
resource.k8s.io/v1): the operator feeds them pending claims, the DeviceClasses and the GPU
models' profile tables, and gets planner `Request`s, or an `Unsatisfiable` that says in words
why migpart cannot help.

How a claim maps onto `planning.model.Request` (one Request per claim, because a pod's devices
are all on its node):

- A request is *ours* when its DeviceClass selectors accept a virtual migpart device of some
  profile; requests of other drivers' classes (or of classes not given) are ignored, and a claim
  with no request of ours yields None. Admin-access requests are ignored (they need no new
  device).
- Candidate profiles of a request: every profile of every given model table that the policy
  permits and whose virtual device (`migpart.kube.cel.virtual_device`) passes the class and the
  request selectors, smallest first (memory slices, compute slices, plain before `+me`).
- `exactly`: `count` (allocationMode ExactCount, default 1). `All` is Unsatisfiable: it asks for
  every matching device, which a partitioner cannot grow towards.
- `firstAvailable`: alternatives in order. The first alternative with candidates fixes the count.
  With count 1 the candidates of every later count-1 alternative are appended (preference
  order); with a larger count only that alternative is used, because the planner may mix
  profiles within a request and mixed devices would satisfy no single alternative.
- Several requests of ours in one claim: the Request's profiles are the profiles every request
  accepts (intersection, in the first request's order) and its count is the sum. Sound (any
  device serves any request) but incomplete: a claim for one 1g.10gb *and* one 3g.40gb has an
  empty intersection and is reported Unsatisfiable (a planner limitation, documented in
  docs/api.md).
- Constraints: `matchAttribute` on `parentUUID` or `gpuIndex` (domain mig.migpart.io) means all
  devices on one GPU: `ClaimDemand.same_gpu` is set and profiles of which `count` instances cannot
  share one GPU are dropped; the Request carries `same_gpu` too, so the planner puts all the
  devices on one GPU. `profile`: only the most preferred candidate is
  kept. `uuid` with more than one device can never hold. `productName` and `placementStart` are
  not enforced (the scheduler still checks them). A constraint on an attribute of another domain
  cannot hold for migpart devices: Unsatisfiable. `distinctAttribute` is ignored.
- Profile names are per model but a Request lists names only: `by_model` keeps the candidates
  per model, and `node_models` (node -> GPU models) narrows `Request.nodes` to nodes having a model
  with candidates.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from migpart.dra import DRIVER
from migpart.kube.cel import Device, SelectorError, matches, virtual_device
from migpart.kube.placement import Placement
from migpart.mig.profiles import ModelTable, Profile
from migpart.planning.model import PolicyView, Request
from migpart.planning.overtime import aged

# A request whose oldest waiting pod was created this long ago ranks above the younger
# requests of its priority (`aged_requests`); the simulator's default too.
AGE_S = 1200.0

_SAME_GPU_ATTRIBUTES = frozenset({"parentUUID", "gpuIndex"})
_UNENFORCED_ATTRIBUTES = frozenset({"productName", "placementStart"})


@dataclass(frozen=True, slots=True)
class ClaimDemand:
    """What one pending claim needs from the planner."""

    claim: str
    request: Request
    same_gpu: bool = False
    # model -> candidate profiles on that model (preference order)
    by_model: Mapping[str, tuple[str, ...]] | None = None


@dataclass(frozen=True, slots=True)
class Unsatisfiable:
    """A claim of ours that no layout permitted by the policy can serve, and why.

    `error` is set when a selector failed to compile or evaluate (surface it as an Event).
    """

    claim: str
    reason: str
    error: SelectorError | None = None


@dataclass(frozen=True, slots=True)
class _Need:
    """One resolved request (or chosen alternative): candidates per model and a count."""

    name: str
    by_model: dict[str, tuple[str, ...]]
    count: int


class _Unsat(Exception):
    def __init__(self, reason: str, error: SelectorError | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.error = error


def _size_key(p: Profile) -> tuple[int, int, bool, int, str]:
    return (p.memory_slices, p.compute_slices, "+" in p.name, p.memory_mib, p.name)


def claim_name(claim: Mapping[str, Any]) -> str:
    meta = claim.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def class_selectors(device_class: Mapping[str, Any]) -> list[str]:
    """The CEL expressions of a DeviceClass (resource.k8s.io/v1 `spec.selectors[].cel`)."""
    spec = device_class.get("spec") or {}
    return [s["cel"]["expression"] for s in spec.get("selectors") or [] if s.get("cel")]


def _request_selectors(body: Mapping[str, Any]) -> list[str]:
    return [s["cel"]["expression"] for s in body.get("selectors") or [] if s.get("cel")]


@lru_cache(maxsize=64)
def _table_devices(table: ModelTable) -> tuple[tuple[Profile, Device], ...]:
    """Virtual devices of every profile of `table`, smallest first (built once per table)."""
    return tuple((p, virtual_device(table, p.name)) for p in sorted(table.profiles, key=_size_key))


Verdict = bool | SelectorError


@lru_cache(maxsize=8192)
def _verdicts(selectors: tuple[str, ...], table: ModelTable) -> tuple[tuple[Profile, Verdict], ...]:
    """Whether each profile's virtual device passes `selectors` (or the error it raised).

    Cached: the operator re-reads every pending claim each round, and claims from one template
    repeat the same selectors; evaluating them costs about a millisecond each in cel-python.
    """
    out: list[tuple[Profile, Verdict]] = []
    for profile, device in _table_devices(table):
        try:
            out.append((profile, matches(selectors, device)))
        except SelectorError as ex:
            out.append((profile, ex))
    return tuple(out)


def is_ours(device_class: Mapping[str, Any], tables: Mapping[str, ModelTable]) -> bool:
    """Whether the class selects migpart devices: its selectors accept some virtual device.

    A selector that fails on our devices (e.g. it reads another driver's attribute) means the
    class is meant for another driver.
    """
    selectors = tuple(class_selectors(device_class))
    if not tables:
        try:
            return matches(selectors, Device(driver=DRIVER, attributes={}, capacity={}))
        except SelectorError:
            return False
    return any(v is True for t in tables.values() for _, v in _verdicts(selectors, t))


def _candidates(
    name: str,
    body: Mapping[str, Any],
    classes: Mapping[str, Mapping[str, Any]],
    tables: Mapping[str, ModelTable],
    policy: PolicyView,
    policy_name: str,
) -> _Need | None:
    """Resolve one `exactly` request or one `firstAvailable` alternative; None if not ours."""
    class_name = body.get("deviceClassName", "")
    device_class = classes.get(class_name)
    if device_class is None or not is_ours(device_class, tables):
        return None
    if body.get("adminAccess"):
        return None
    if body.get("allocationMode", "ExactCount") == "All":
        raise _Unsat(
            f"request {name}: allocationMode All asks for every matching device; migpart only"
            " creates devices for an exact count"
        )
    count = int(body.get("count", 1) or 1)
    if not tables:
        raise _Unsat(f"request {name}: no MIG GPU model is known (no MigNode reports a GPU)")
    cls_sel = tuple(class_selectors(device_class))
    req_sel = tuple(_request_selectors(body))
    by_model: dict[str, list[str]] = {}
    forbidden: list[str] = []
    for model in sorted(tables):
        table = tables[model]
        class_ok = _verdicts(cls_sel, table)
        request_ok = _verdicts(req_sel, table)
        for (profile, in_class), (_, ok) in zip(class_ok, request_ok, strict=True):
            if in_class is not True:
                continue
            if isinstance(ok, SelectorError):
                raise _Unsat(
                    f"request {name}: selector failed: {ok.reason} (selector: {ok.expression})", ok
                )
            if not ok:
                continue
            if policy.permits(profile.name):
                by_model.setdefault(model, []).append(profile.name)
            else:
                forbidden.append(profile.name)
    if not by_model:
        wanted = " && ".join(req_sel) or f"device class {class_name}"
        models = ", ".join(sorted(tables))
        who = f"policy {policy_name}" if policy_name else "the policy"
        reason = f"request {name}: no MIG profile of {models} allowed by {who} satisfies {wanted}"
        if forbidden:
            names = ", ".join(dict.fromkeys(forbidden))
            reason += f" ({names} would, but {who} does not allow it)"
        raise _Unsat(reason)
    return _Need(name, {m: tuple(ps) for m, ps in by_model.items()}, count)


def _resolve_request(
    request: Mapping[str, Any],
    classes: Mapping[str, Mapping[str, Any]],
    tables: Mapping[str, ModelTable],
    policy: PolicyView,
    policy_name: str,
) -> _Need | None:
    name = str(request.get("name", ""))
    if request.get("exactly") is not None:
        return _candidates(name, request["exactly"], classes, tables, policy, policy_name)
    alternatives: list[_Need] = []
    failures: list[_Unsat] = []
    for sub in request.get("firstAvailable") or []:
        sub_name = f"{name}/{sub.get('name', '')}"
        try:
            need = _candidates(sub_name, sub, classes, tables, policy, policy_name)
        except _Unsat as ex:
            failures.append(ex)
            continue
        if need is not None:
            alternatives.append(need)
    if not alternatives:
        if failures:
            raise _Unsat("; ".join(f.reason for f in failures), failures[0].error)
        return None
    chosen = alternatives[0]
    if chosen.count > 1:
        return _Need(name, chosen.by_model, chosen.count)
    merged: dict[str, list[str]] = {}
    for alt in alternatives:
        if alt.count != 1:
            continue
        for model, names in alt.by_model.items():
            have = merged.setdefault(model, [])
            have.extend(n for n in names if n not in have)
    return _Need(name, {m: tuple(ns) for m, ns in merged.items()}, 1)


def _ordered_union(by_model: Mapping[str, tuple[str, ...]]) -> tuple[str, ...]:
    """Candidate names across models (in model-name order), each once, order kept."""
    seen: dict[str, None] = {}
    for model in sorted(by_model):
        for n in by_model[model]:
            seen.setdefault(n, None)
    return tuple(seen)


def _fits_one_gpu(table: ModelTable, profile: str, count: int) -> bool:
    p = table.profile(profile)
    return (
        count <= p.max_instances
        and count * p.memory_slices <= table.memory_slices
        and count * p.compute_slices <= table.compute_slices
    )


def claim_demand(
    claim: Mapping[str, Any],
    classes: Mapping[str, Mapping[str, Any]],
    tables: Mapping[str, ModelTable],
    policy: PolicyView,
    *,
    policy_name: str = "",
    priority: int = 0,
    nodes: frozenset[str] | None = None,
    node_models: Mapping[str, Iterable[str]] | None = None,
) -> ClaimDemand | Unsatisfiable | None:
    """What `claim` needs from migpart; None when it is allocated or asks nothing of ours.

    `classes`: DeviceClass name -> body. `tables`: GPU model -> profile table (the models the
    policy's nodes have). `nodes`: restrict the Request to these nodes. `node_models`: node ->
    its GPU models, to drop nodes whose models have no candidate profile.
    """
    name = claim_name(claim)
    if (claim.get("status") or {}).get("allocation"):
        return None
    devices = (claim.get("spec") or {}).get("devices") or {}
    try:
        needs = [
            n
            for r in devices.get("requests") or []
            if (n := _resolve_request(r, classes, tables, policy, policy_name)) is not None
        ]
        if not needs:
            return None
        return _combine(name, needs, devices, tables, priority, nodes, node_models)
    except _Unsat as ex:
        return Unsatisfiable(name, ex.reason, ex.error)


def _combine(
    name: str,
    needs: list[_Need],
    devices: Mapping[str, Any],
    tables: Mapping[str, ModelTable],
    priority: int,
    nodes: frozenset[str] | None,
    node_models: Mapping[str, Iterable[str]] | None,
) -> ClaimDemand:
    count = sum(n.count for n in needs)
    by_model: dict[str, tuple[str, ...]] = {}
    for model in sorted(tables):
        lists = [n.by_model.get(model, ()) for n in needs]
        common = tuple(p for p in lists[0] if all(p in other for other in lists[1:]))
        if common:
            by_model[model] = common
    if not by_model:
        raise _Unsat(
            f"requests {', '.join(n.name for n in needs)} accept no common MIG profile; migpart"
            " plans a claim's devices as one group of interchangeable profiles"
        )
    same_gpu = False
    single_profile = False
    for constraint in devices.get("constraints") or []:
        attribute = constraint.get("matchAttribute")
        if not attribute:
            continue
        domain, _, short = str(attribute).rpartition("/")
        if (domain or DRIVER) != DRIVER:
            raise _Unsat(
                f"constraint matchAttribute {attribute}: migpart devices have no attributes of"
                f" domain {domain}"
            )
        if short in _SAME_GPU_ATTRIBUTES:
            same_gpu = True
        elif short == "profile":
            single_profile = True
        elif short == "uuid" and count > 1:
            raise _Unsat(f"constraint matchAttribute {attribute}: {count} devices never share one")
        elif short not in _UNENFORCED_ATTRIBUTES and short != "uuid":
            raise _Unsat(f"constraint matchAttribute {attribute}: migpart devices have no {short}")
    if same_gpu:
        by_model = {
            m: kept
            for m, names in by_model.items()
            if (kept := tuple(p for p in names if _fits_one_gpu(tables[m], p, count)))
        }
        if not by_model:
            raise _Unsat(f"{count} devices of the requested profiles do not fit on one GPU")
    # Preference order: the first need's order (size order for exactly, alternative order for
    # firstAvailable), across models.
    profiles = _ordered_union(by_model)
    if single_profile:
        profiles = profiles[:1]
        by_model = {m: ps[:1] for m, ps in by_model.items() if profiles[0] in ps}
    if node_models is not None:
        eligible = frozenset(n for n, ms in node_models.items() if any(m in by_model for m in ms))
        nodes = eligible if nodes is None else nodes & eligible
    request = Request(
        name=name, profiles=profiles, count=count, priority=priority, nodes=nodes, same_gpu=same_gpu
    )
    return ClaimDemand(claim=name, request=request, same_gpu=same_gpu, by_model=by_model)


def aged_requests(
    requests: Iterable[Request],
    waiting: Mapping[str, Iterable[Placement]],
    now: datetime,
    age_s: float = AGE_S,
) -> list[Request]:
    """The requests with their priorities spread by age (`planning.overtime.aged`), so that
    within one priority the planner serves the claims that waited longest first.

    A request's age is that of the oldest waiting pod using its claim (`waiting`: claim key ->
    the pods' placements, whose `created` is the pod's creationTimestamp); a pod without a
    readable timestamp counts as just created.
    """
    requests = list(requests)
    waited: dict[str, float] = {}
    for r in requests:
        created = [_timestamp(p.get("created")) for p in waiting.get(r.name, ())]
        known = [c for c in created if c is not None]
        if known:
            waited[r.name] = max(0.0, (now - min(known)).total_seconds())
    return aged(requests, waited, age_s)


def _timestamp(raw: object) -> datetime | None:
    if not isinstance(raw, str) or not raw:
        return None
    try:
        parsed = datetime.fromisoformat(raw)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None

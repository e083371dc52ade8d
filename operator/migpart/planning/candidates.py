"""Which MIG profiles one DRA device request accepts (`resolve_request`): the rules of
`planning.demand` for a single request of a claim.

- A request is *ours* when its DeviceClass selectors accept a virtual migpart device of some
  profile (`is_ours`); requests of other drivers' classes (or of classes not given) are
  ignored. Admin-access requests are ignored (they need no new device).
- Candidate profiles of a request: every profile of every given model table that the policy
  permits and whose virtual device (`migpart.kube.cel.virtual_device`) passes the class and the
  request selectors, smallest first (`by_size`: memory slices, compute slices, plain before
  `+me`).
- `exactly`: `count` (allocationMode ExactCount, default 1). `All` is unservable: it asks for
  every matching device, which a partitioner cannot grow towards.
- `firstAvailable`: alternatives in order. The first alternative with candidates fixes the count.
  With count 1 the candidates of every later count-1 alternative are appended (preference
  order); with a larger count only that alternative is used, because the planner may mix
  profiles within a request and mixed devices would satisfy no single alternative.

The selectors are CEL, evaluated with cel-python against the device format of the slices
(`kube.cel`); this module asks a `Selectors` port for the verdicts instead (the operator and
the demo hand in `kube.selectors.CEL`), so that the rules stay pure and below their caller.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol

from migpart.errors import SelectorError
from migpart.mig.profiles import ModelTable, Profile
from migpart.planning.model import PolicyView

# Whether a device passes the selectors, or why they could not say.
Verdict = bool | SelectorError


class Selectors(Protocol):
    """Evaluates DRA device selectors (CEL expressions, all of which must hold)."""

    def verdicts(
        self, selectors: tuple[str, ...], table: ModelTable
    ) -> tuple[tuple[Profile, Verdict], ...]:
        """The verdict on the virtual device of every profile of `table`, in `by_size` order."""
        ...

    def bare(self, selectors: tuple[str, ...]) -> bool:
        """Whether a device of our driver with no attributes passes (False when one fails)."""
        ...


class Unservable(Exception):
    """A request (or claim) of ours that no layout permitted by the policy can serve."""

    def __init__(self, reason: str, error: SelectorError | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.error = error


@dataclass(frozen=True, slots=True)
class ResolvedRequest:
    """One resolved request (or chosen alternative): candidates per model and a count."""

    name: str
    by_model: dict[str, tuple[str, ...]]
    count: int


@dataclass(frozen=True, slots=True)
class RequestContext:
    """What a request is resolved against: DeviceClass name -> body, GPU model -> profile table
    (the models of the policy's nodes), the policy, the selectors' evaluator, and the policy's
    name for the reasons."""

    classes: Mapping[str, Mapping[str, Any]]
    tables: Mapping[str, ModelTable]
    policy: PolicyView
    selectors: Selectors
    policy_name: str = ""


def _size_key(p: Profile) -> tuple[int, int, bool, int, str]:
    return (p.memory_slices, p.compute_slices, "+" in p.name, p.memory_mib, p.name)


@lru_cache(maxsize=64)
def by_size(table: ModelTable) -> tuple[Profile, ...]:
    """The profiles of `table`, smallest first: the preference order of candidates."""
    return tuple(sorted(table.profiles, key=_size_key))


def class_selectors(device_class: Mapping[str, Any]) -> list[str]:
    """The CEL expressions of a DeviceClass (resource.k8s.io/v1 `spec.selectors[].cel`)."""
    spec = device_class.get("spec") or {}
    return [s["cel"]["expression"] for s in spec.get("selectors") or [] if s.get("cel")]


def _request_selectors(body: Mapping[str, Any]) -> list[str]:
    return [s["cel"]["expression"] for s in body.get("selectors") or [] if s.get("cel")]


def is_ours(
    device_class: Mapping[str, Any], tables: Mapping[str, ModelTable], selectors: Selectors
) -> bool:
    """Whether the class selects migpart devices: its selectors accept some virtual device.

    A selector that fails on our devices (e.g. it reads another driver's attribute) means the
    class is meant for another driver.
    """
    expressions = tuple(class_selectors(device_class))
    if not tables:
        return selectors.bare(expressions)
    return any(v is True for t in tables.values() for _, v in selectors.verdicts(expressions, t))


def _candidates(name: str, body: Mapping[str, Any], ctx: RequestContext) -> ResolvedRequest | None:
    """Resolve one `exactly` request or one `firstAvailable` alternative; None if not ours."""
    tables, selectors = ctx.tables, ctx.selectors
    class_name = body.get("deviceClassName", "")
    device_class = ctx.classes.get(class_name)
    if device_class is None or not is_ours(device_class, tables, selectors):
        return None
    if body.get("adminAccess"):
        return None
    if body.get("allocationMode", "ExactCount") == "All":
        raise Unservable(
            f"request {name}: allocationMode All asks for every matching device; migpart only"
            " creates devices for an exact count"
        )
    count = int(body.get("count", 1) or 1)
    if not tables:
        raise Unservable(f"request {name}: no MIG GPU model is known (no MigNode reports a GPU)")
    cls_sel = tuple(class_selectors(device_class))
    req_sel = tuple(_request_selectors(body))
    by_model: dict[str, list[str]] = {}
    forbidden: list[str] = []
    for model in sorted(tables):
        table = tables[model]
        class_ok = selectors.verdicts(cls_sel, table)
        request_ok = selectors.verdicts(req_sel, table)
        for (profile, in_class), (_, ok) in zip(class_ok, request_ok, strict=True):
            if in_class is not True:
                continue
            if isinstance(ok, SelectorError):
                raise Unservable(
                    f"request {name}: selector failed: {ok.reason} (selector: {ok.expression})", ok
                )
            if not ok:
                continue
            if ctx.policy.permits(profile.name):
                by_model.setdefault(model, []).append(profile.name)
            else:
                forbidden.append(profile.name)
    if not by_model:
        wanted = " && ".join(req_sel) or f"device class {class_name}"
        models = ", ".join(sorted(tables))
        who = f"policy {ctx.policy_name}" if ctx.policy_name else "the policy"
        reason = f"request {name}: no MIG profile of {models} allowed by {who} satisfies {wanted}"
        if forbidden:
            names = ", ".join(dict.fromkeys(forbidden))
            reason += f" ({names} would, but {who} does not allow it)"
        raise Unservable(reason)
    return ResolvedRequest(name, {m: tuple(ps) for m, ps in by_model.items()}, count)


def resolve_request(request: Mapping[str, Any], ctx: RequestContext) -> ResolvedRequest | None:
    """The candidates and count of one request of a claim (`spec.devices.requests[]`); None
    when it is not ours. Raises `Unservable` when it is ours and nothing can serve it."""
    name = str(request.get("name", ""))
    if request.get("exactly") is not None:
        return _candidates(name, request["exactly"], ctx)
    alternatives: list[ResolvedRequest] = []
    failures: list[Unservable] = []
    for sub in request.get("firstAvailable") or []:
        sub_name = f"{name}/{sub.get('name', '')}"
        try:
            need = _candidates(sub_name, sub, ctx)
        except Unservable as ex:
            failures.append(ex)
            continue
        if need is not None:
            alternatives.append(need)
    if not alternatives:
        if failures:
            raise Unservable("; ".join(f.reason for f in failures), failures[0].error)
        return None
    chosen = alternatives[0]
    if chosen.count > 1:
        return ResolvedRequest(name, chosen.by_model, chosen.count)
    merged: dict[str, list[str]] = {}
    for alt in alternatives:
        if alt.count != 1:
            continue
        for model, names in alt.by_model.items():
            have = merged.setdefault(model, [])
            have.extend(n for n in names if n not in have)
    return ResolvedRequest(name, {m: tuple(ns) for m, ns in merged.items()}, 1)

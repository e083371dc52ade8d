"""One claim's demand (`ClaimDemand`): which MIG profiles, how many, and on one GPU or not.

A policy's demand, what `controller.rounds.scope` gathers from the claims that fall under it, is
built from these. Pure functions over API bodies (dicts as the API server returns them,
resource.k8s.io/v1): the operator feeds them pending claims, the DeviceClasses, the GPU
models' profile tables and a selector evaluator (`kube.selectors.CEL`), and gets planner
`Request`s, or an `Unsatisfiable` that says in words why migpart cannot help.

How a claim maps onto `planning.model.Request` (one Request per claim, because a pod's devices
are all on its node):

- Each request of the claim is resolved on its own (`planning.candidates`: which requests are
  ours, their candidate profiles, `exactly`, `firstAvailable`); a claim with no request of ours
  yields None.
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
from typing import Any

from migpart.errors import SelectorError
from migpart.mig.profiles import ModelTable
from migpart.planning.candidates import (
    RequestContext,
    ResolvedRequest,
    Selectors,
    Unservable,
    resolve_request,
)
from migpart.planning.model import PolicyView, Request
from migpart.slices.dra import DRIVER

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


def claim_name(claim: Mapping[str, Any]) -> str:
    meta = claim.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


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
    selectors: Selectors,
    *,
    policy_name: str = "",
    priority: int = 0,
    nodes: frozenset[str] | None = None,
    node_models: Mapping[str, Iterable[str]] | None = None,
) -> ClaimDemand | Unsatisfiable | None:
    """What `claim` needs from migpart; None when it is allocated or asks nothing of ours.

    `classes`: DeviceClass name -> body. `tables`: GPU model -> profile table (the models the
    policy's nodes have). `selectors`: evaluates the CEL selectors. `nodes`: restrict the
    Request to these nodes. `node_models`: node -> its GPU models, to drop nodes whose models
    have no candidate profile.
    """
    name = claim_name(claim)
    if (claim.get("status") or {}).get("allocation"):
        return None
    devices = (claim.get("spec") or {}).get("devices") or {}
    ctx = RequestContext(classes, tables, policy, selectors, policy_name)
    try:
        needs = [
            n for r in devices.get("requests") or [] if (n := resolve_request(r, ctx)) is not None
        ]
        if not needs:
            return None
        return _combine(name, needs, devices, tables, priority, nodes, node_models)
    except Unservable as ex:
        return Unsatisfiable(name, ex.reason, ex.error)


def _combine(
    name: str,
    needs: list[ResolvedRequest],
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
        raise Unservable(
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
            raise Unservable(
                f"constraint matchAttribute {attribute}: migpart devices have no attributes of"
                f" domain {domain}"
            )
        if short in _SAME_GPU_ATTRIBUTES:
            same_gpu = True
        elif short == "profile":
            single_profile = True
        elif short == "uuid" and count > 1:
            raise Unservable(
                f"constraint matchAttribute {attribute}: {count} devices never share one"
            )
        elif short not in _UNENFORCED_ATTRIBUTES and short != "uuid":
            raise Unservable(
                f"constraint matchAttribute {attribute}: migpart devices have no {short}"
            )
    if same_gpu:
        by_model = {
            m: kept
            for m, names in by_model.items()
            if (kept := tuple(p for p in names if _fits_one_gpu(tables[m], p, count)))
        }
        if not by_model:
            raise Unservable(f"{count} devices of the requested profiles do not fit on one GPU")
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

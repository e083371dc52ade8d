"""The allocation mode in effect for a policy: its `spec.allocation` against what the API server
serves (`migpart.kube.features`), decided by one pure function.

Auto is Offer where the server serves partitionable devices (Kubernetes 1.36+), else
Reactive. Offer asked of a server that does not serve them falls back to Reactive, says why in
the status, and is told once per policy generation as a Warning Event (`fell_back`).
Reactive is Reactive everywhere.
"""

from __future__ import annotations

from migpart.api.models import AllocationMode, AllocationStatus, PolicyMode
from migpart.kube.features import DraFeatures

NOT_PUBLISHING = (
    "offer publishing not enabled (migpart operator --offer-publishing): devices are published "
    "reactively"
)


def resolve_allocation(
    requested: AllocationMode, features: DraFeatures, publishing: bool
) -> AllocationStatus:
    """The mode in effect for a policy that asks for `requested`, and why. `publishing`: the
    operator publishes offers (`migpart operator --offer-publishing`, off by default); without
    it a policy whose server serves offers stays Reactive, and its status and the Allocation
    column say so (never "Offer" while the slices are reactive)."""
    if requested == "Reactive":
        return AllocationStatus(mode="Reactive", reason="Reactive requested")
    if not features.offer_served:
        prefix = "Offer requested but not served" if requested == "Offer" else "Auto"
        return AllocationStatus(
            mode="Reactive", reason=f"{prefix}: {features.detail}; falling back to Reactive"
        )
    if not publishing:
        reason = f"{requested}: Offer served; {NOT_PUBLISHING}"
        return AllocationStatus(mode="Reactive", reason=reason)
    return AllocationStatus(mode="Offer", reason=f"{requested}: Offer served")


DRY_RUN = "DryRun: nothing is offered, devices are published reactively"


def acting(resolved: AllocationStatus, mode: PolicyMode) -> AllocationStatus:
    """The mode in effect once the policy's `spec.mode` is counted: a DryRun policy creates
    nothing, so it offers nothing, and its nodes publish reactively."""
    if resolved.mode == "Offer" and mode == "DryRun":
        return AllocationStatus(mode="Reactive", reason=f"{resolved.reason}; {DRY_RUN}")
    return resolved


def fell_back(requested: AllocationMode, resolved: AllocationStatus) -> bool:
    """Whether a policy asked for Offer and does not get it (worth a Warning Event)."""
    return requested == "Offer" and resolved.mode != "Offer"

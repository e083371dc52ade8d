"""The allocation mode in effect for a policy: its `spec.allocation` against what the API server
serves (`migpart.kube.features`), decided by one pure function.

Auto is Offer where the server serves partitionable devices and binding conditions, else
Reactive. Offer asked of a server that does not serve them falls back to Reactive, says why in
the status, and is told once per policy generation as a Warning Event (`fell_back`).
Reactive is Reactive everywhere.
"""

from __future__ import annotations

from migpart.api.models import AllocationMode, AllocationStatus
from migpart.kube.features import DraFeatures

OFFER_PUBLISHING = False
"""Whether this build publishes offers. Until the offer publisher is wired in, a policy whose
server serves offers stays Reactive, and its status and the Allocation column say so (never
"Offer" while the slices are reactive); flipped once offer publishing lands. The offer relay
(`migpart.controller.offer_relay`) runs only for policies whose mode in effect is Offer."""
NOT_PUBLISHING = "offer publishing not enabled in this build: devices are published reactively"


def resolve_allocation(requested: AllocationMode, features: DraFeatures) -> AllocationStatus:
    """The mode in effect for a policy that asks for `requested`, and why."""
    if requested == "Reactive":
        return AllocationStatus(mode="Reactive", reason="Reactive requested")
    if not features.offer_served:
        prefix = "Offer requested but not served" if requested == "Offer" else "Auto"
        return AllocationStatus(
            mode="Reactive", reason=f"{prefix}: {features.detail}; falling back to Reactive"
        )
    if not OFFER_PUBLISHING:
        reason = f"{requested}: Offer served; {NOT_PUBLISHING}"
        return AllocationStatus(mode="Reactive", reason=reason)
    return AllocationStatus(mode="Offer", reason=f"{requested}: Offer served")


def fell_back(requested: AllocationMode, resolved: AllocationStatus) -> bool:
    """Whether a policy asked for Offer and does not get it (worth a Warning Event)."""
    return requested == "Offer" and resolved.mode != "Offer"

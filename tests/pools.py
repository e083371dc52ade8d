"""An offering node's stable pool with a fixed list of placements, as the slice publisher's
slices function: what the publisher's unit and integration tests hand it in place of the
operator's (`migpart.offer.nodes`), which orders the placements by the policy."""

from __future__ import annotations

from migpart.api.models import MigNode
from migpart.kube.slice_publisher import SlicesFn
from migpart.mig.catalog import CATALOG
from migpart.offer.pool import stable_pool
from migpart.planning.model import DeviceRef
from migpart.slices.content import DeviceCache, SliceContent


def every_placement(model: str, gpus: int) -> list[DeviceRef]:
    """Every placement of every profile of `model` on GPUs 0 to `gpus` - 1, in table order."""
    table = CATALOG[model]
    return [
        DeviceRef(i, p.name, s) for i in range(gpus) for p in table.profiles for s in p.placements
    ]


def offering(order: list[DeviceRef]) -> SlicesFn:
    """The slices function of a stable pool listing `order`."""

    def slices(
        node: MigNode, withdrawn: frozenset[str], available: bool, cache: DeviceCache
    ) -> list[SliceContent]:
        return stable_pool(node, order, available=available, cache=cache)

    return slices

"""What the agent tests share: a GPU's layout as (profile, start) pairs, and a claim prepared
on an instance as the kubelet plugin records it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from migpart.agent.checkpoint import Checkpoint, PreparedClaim, PreparedDevice
from migpart.dra import DRIVER
from migpart.mig import device_name

if TYPE_CHECKING:
    from migpart.agent.backend import MigInstance, NvmlBackend


async def layout(sim: NvmlBackend, gpu: int = 0) -> list[tuple[str, int]]:
    return [(i.profile, i.start) for i in await sim.instances(gpu)]


def prepare(checkpoint: Checkpoint, uid: str, inst: MigInstance) -> None:
    name = device_name(inst.gpu, inst.profile, inst.start)
    checkpoint.put(
        PreparedClaim(
            uid,
            "default",
            f"claim-{uid}",
            (
                PreparedDevice(
                    name,
                    inst.gpu,
                    inst.profile,
                    inst.start,
                    inst.uuid,
                    f"{DRIVER}/mig={uid}-{name}",
                ),
            ),
        )
    )

"""CDI spec files: how the container runtime learns what a prepared MIG device means.

kubelet hands the CDI device ids that NodePrepareResources returns to the runtime
(containerd/CRI-O), which looks them up in the spec files under /var/run/cdi and applies their
container edits: the device nodes of the GPU, of nvidiactl and of the MIG capability files that
grant access to the GPU instance and compute instance, and `NVIDIA_VISIBLE_DEVICES=MIG-<uuid>`
for the NVIDIA container toolkit. One file per claim, so unpreparing a claim is one unlink.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from migpart.agent.checkpoint import atomic_write
from migpart.slices.dra import DRIVER

if TYPE_CHECKING:
    from pathlib import Path

CDI_VERSION = "0.6.0"
VENDOR = DRIVER  # CDI kinds are `vendor/class`; ours is named after the DRA driver
CLASS = "mig"
KIND = f"{VENDOR}/{CLASS}"
CAPS_PROC = "/proc/driver/nvidia/capabilities"

# nvidia-caps minors (/proc/driver/nvidia-caps/mig-minors): 1 config, 2 monitor, then per GPU
# 15 GPU instances of 9 minors each (GI access, then CI 0..7 access).
_GI_PER_GPU = 15
_MINORS_PER_GI = 9


@dataclass(frozen=True, slots=True)
class CdiDevice:
    """One MIG device as the container will see it."""

    name: str
    gpu_minor: int
    gi_id: int
    ci_id: int
    mig_uuid: str


def cdi_id(name: str) -> str:
    return f"{KIND}={name}"


def cdi_name(claim_uid: str, device: str) -> str:
    """CDI device name: unique per claim, so a re-prepared claim never collides."""
    return re.sub(r"[^a-zA-Z0-9_.:-]", "-", f"{claim_uid}-{device}")


def cap_minor(caps_root: Path | None, gpu_minor: int, gi_id: int, ci_id: int | None) -> int:
    """The nvidia-cap minor granting access to a GI (ci_id None) or a CI of it.

    Read from `<caps_root>/gpu<minor>/mig/gi<id>[/ci<id>]/access` ("DeviceFileMinor: N") when
    the driver exposes it; otherwise the driver's fixed numbering, which is what the simulator
    writes.
    """
    if caps_root is not None:
        access = caps_root / f"gpu{gpu_minor}" / "mig" / f"gi{gi_id}"
        if ci_id is not None:
            access = access / f"ci{ci_id}"
        try:
            for line in (access / "access").read_text().splitlines():
                key, _, value = line.partition(":")
                if key.strip() == "DeviceFileMinor":
                    return int(value)
        except (FileNotFoundError, NotADirectoryError, ValueError):
            pass
    gi_minor = 3 + (gpu_minor * _GI_PER_GPU + gi_id) * _MINORS_PER_GI
    return gi_minor if ci_id is None else gi_minor + 1 + ci_id


def spec_for(devices: list[CdiDevice], caps_root: Path | None) -> dict[str, object]:
    """The CDI spec (as JSON data) exposing `devices`."""
    entries = []
    for d in devices:
        gi_cap = cap_minor(caps_root, d.gpu_minor, d.gi_id, None)
        ci_cap = cap_minor(caps_root, d.gpu_minor, d.gi_id, d.ci_id)
        entries.append(
            {
                "name": d.name,
                "containerEdits": {
                    "env": [f"NVIDIA_VISIBLE_DEVICES={d.mig_uuid}"],
                    "deviceNodes": [
                        {"path": f"/dev/nvidia{d.gpu_minor}"},
                        {"path": f"/dev/nvidia-caps/nvidia-cap{gi_cap}"},
                        {"path": f"/dev/nvidia-caps/nvidia-cap{ci_cap}"},
                    ],
                },
            }
        )
    return {
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "devices": entries,
        "containerEdits": {"deviceNodes": [{"path": "/dev/nvidiactl"}]},
    }


class CdiWriter:
    """Writes and removes the per-claim spec files in the CDI directory."""

    def __init__(self, cdi_dir: Path, caps_root: Path | None) -> None:
        self.cdi_dir = cdi_dir
        self.caps_root = caps_root

    def path(self, claim_uid: str) -> Path:
        return self.cdi_dir / f"{VENDOR}-{claim_uid}.json"

    def write(self, claim_uid: str, devices: list[CdiDevice]) -> None:
        body = spec_for(devices, self.caps_root)
        atomic_write(self.path(claim_uid), json.dumps(body, indent=1) + "\n")

    def remove(self, claim_uid: str) -> None:
        self.path(claim_uid).unlink(missing_ok=True)

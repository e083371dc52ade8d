"""Which claims are prepared on which MIG instances, on disk so that it survives restarts.

The checkpoint is the agent's promise to kubelet: an instance named here belongs to a running
or starting pod and is never destroyed, whatever MigNode.spec says. It is written atomically
(temporary file, fsync, rename, fsync of the directory) so that a crash leaves either the old
or the new content, never a torn file. `lock` serializes the plugin's prepare with the
reconciler's destroy, so a claim cannot be prepared on an instance in the instant that the
reconciler decided it was free.

It also keeps the placements an offering node reports unusable (`migpart.agent.failures`), so
that a restarted agent goes on reporting them and the operator's taint on their devices does
not come off and on again with every agent restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

VERSION = 1


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One allocated device of a prepared claim and the MIG instance behind it."""

    device: str
    gpu: int
    profile: str
    start: int
    uuid: str
    cdi_id: str
    requests: tuple[str, ...] = ()
    pool: str = ""


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


UnusableReason = Literal["Overlap", "NvmlError"]


@dataclass(frozen=True, slots=True)
class UnusablePlacement:
    """A placement whose instance could not be made at `failures` prepares in a row
    (`migpart.agent.failures`): why the last one failed (`reason`, `FailedInstance.reason`)
    and what it said (`error`)."""

    gpu: int
    profile: str
    start: int
    reason: UnusableReason
    error: str
    failures: int

    @property
    def placement(self) -> tuple[int, str, int]:
        """(gpu, profile, start), the key `Checkpoint.prepared` uses too."""
        return (self.gpu, self.profile, self.start)


class Checkpoint:
    """The prepared claims of this node (and its unusable placements), loaded from and saved
    to `path`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = asyncio.Lock()
        self._claims: dict[str, PreparedClaim] = {}
        self._unusable: tuple[UnusablePlacement, ...] = ()
        # The state directory is the agent's own: only root on the node reads which claims run
        # where (a hostPath that kubelet created 0755 is narrowed here).
        owner_only_dir(path.parent)
        self.load()

    def load(self) -> None:
        """Read the file (a missing file is an empty checkpoint)."""
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            self._claims = {}
            self._unusable = ()
            return
        claims: dict[str, PreparedClaim] = {}
        for uid, c in raw.get("claims", {}).items():
            devices = tuple(
                PreparedDevice(
                    device=d["device"],
                    gpu=int(d["gpu"]),
                    profile=d["profile"],
                    start=int(d["start"]),
                    uuid=d["uuid"],
                    cdi_id=d["cdi_id"],
                    requests=tuple(d.get("requests", ())),
                    pool=d.get("pool", ""),
                )
                for d in c["devices"]
            )
            claims[uid] = PreparedClaim(uid, c["namespace"], c["name"], devices)
        self._claims = claims
        # absent from files written before the agent reported unusable placements
        self._unusable = tuple(
            UnusablePlacement(
                gpu=int(u["gpu"]),
                profile=u["profile"],
                start=int(u["start"]),
                reason=u["reason"],
                error=u.get("error", ""),
                failures=int(u["failures"]),
            )
            for u in raw.get("unusable", [])
            if u.get("reason") in get_args(UnusableReason)
        )

    def get(self, uid: str) -> PreparedClaim | None:
        return self._claims.get(uid)

    def claims(self) -> list[PreparedClaim]:
        return sorted(self._claims.values(), key=lambda c: c.uid)

    def prepared(self) -> dict[tuple[int, str, int], list[str]]:
        """(gpu, profile, start) -> "namespace/name" of the claims prepared on the instance."""
        out: dict[tuple[int, str, int], list[str]] = {}
        for claim in self.claims():
            for d in claim.devices:
                out.setdefault((d.gpu, d.profile, d.start), []).append(claim.ref)
        return out

    def unusable(self) -> tuple[UnusablePlacement, ...]:
        return self._unusable

    def set_unusable(self, placements: Iterable[UnusablePlacement]) -> None:
        """Keep `placements` as the node's unusable ones (saved only when they changed)."""
        ordered = tuple(sorted(placements, key=lambda u: u.placement))
        if ordered != self._unusable:
            self._unusable = ordered
            self._save()

    def put(self, claim: PreparedClaim) -> None:
        self._claims[claim.uid] = claim
        self._save()

    def remove(self, uid: str) -> None:
        if self._claims.pop(uid, None) is not None:
            self._save()

    def _save(self) -> None:
        body: dict[str, object] = {
            "version": VERSION,
            "claims": {
                uid: {
                    "namespace": c.namespace,
                    "name": c.name,
                    "devices": [{**asdict(d), "requests": list(d.requests)} for d in c.devices],
                }
                for uid, c in sorted(self._claims.items())
            },
        }
        if self._unusable:  # left out when empty: the file stays as older agents wrote it
            body["unusable"] = [asdict(u) for u in self._unusable]
        atomic_write(self.path, json.dumps(body, indent=1, sort_keys=True) + "\n")


def owner_only_dir(path: Path) -> None:
    """Create `path` (and its parents) if missing and make it 0700."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)


def atomic_write(path: Path, text: str) -> None:
    """Replace `path` with `text` so that readers and crashes see old or new, never half.

    The file is owner-only (0600): mkstemp creates it so, and the rename keeps its mode.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)

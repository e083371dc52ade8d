"""When the local search cannot improve a plan on what the benchmark's quality measures.

The search (`migpart.planning.search`) spends up to about a second per plan looking for more
satisfied requests or fewer destroyed instances. Neither can improve when the plan destroys
nothing and every request it leaves unsatisfied fits on no node even alone, with every free
instance gone (only used instances are fixed). That is the common round of a busy cluster: a
few requests wait for capacity that is not there, and `migpart simulate` plans thousands of
such rounds. The bound is a relaxation, so it never skips a search that could satisfy more.
"""

from __future__ import annotations

from collections.abc import Sequence

from migpart.mig import Instance, Occupancy
from migpart.planning.model import Plan, Request, Snapshot


def search_cannot_improve(snapshot: Snapshot, requests: Sequence[Request], best: Plan) -> bool:
    """True when `best` destroys nothing and each unsatisfied request has no node that could
    host it alone beside the used instances."""
    if best.stats.destroyed:
        return False
    left = set(best.unsatisfied)
    if not left:
        return True
    hosts = _Hosts(snapshot)
    return not any(hosts.could_host(r) for r in requests if r.name in left and r.count > 0)


class _Hosts:
    """Per node and GPU, what the used instances leave: an upper bound on the devices of each
    profile that the GPU could ever offer a request."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.nodes: list[tuple[str, list[Occupancy]]] = []
        for node in snapshot.nodes:
            gpus = []
            for gpu in node.gpus:
                table = snapshot.table(gpu.model)
                used = [Instance(i.profile, i.start) for i in gpu.instances if i.used]
                gpus.append(Occupancy.of(table, used))
            self.nodes.append((node.name, gpus))
        self._fit: dict[tuple[int, int, tuple[str, ...]], int] = {}

    def _devices(self, n: int, g: int, occupancy: Occupancy, profiles: tuple[str, ...]) -> int:
        key = (n, g, profiles)
        if key not in self._fit:
            table = occupancy.table
            self._fit[key] = sum(
                occupancy.fit(table.profile(p)) for p in dict.fromkeys(profiles) if table.has(p)
            )
        return self._fit[key]

    def could_host(self, request: Request) -> bool:
        for n, (name, gpus) in enumerate(self.nodes):
            if request.nodes is not None and name not in request.nodes:
                continue
            per_gpu = [self._devices(n, g, occ, request.profiles) for g, occ in enumerate(gpus)]
            room = max(per_gpu, default=0) if request.same_gpu else sum(per_gpu)
            if room >= request.count:
                return True
        return False

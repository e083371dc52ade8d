"""Spares: free instances a policy keeps ready, added after every request is placed.

Free instances of the spare profile anywhere count; missing ones are created in free space
only (nothing is destroyed for a spare), each where it costs least, so on GPUs that are
already changing first.
"""

from __future__ import annotations

from migpart.mig import Instance
from migpart.planning.classes import GpuClasses, Option
from migpart.planning.cost import DESTROYED
from migpart.planning.model import PolicyView


def add_spares(classes: GpuClasses, cids: list[list[int]], policy: PolicyView) -> None:
    """Change the nodes' GPU classes `cids` in place to hold the policy's spares."""
    for spare in policy.spares:
        if spare.count <= 0 or not policy.permits(spare.profile):
            continue
        have = sum(
            1
            for node_cids in cids
            for cid in node_cids
            for f in classes.free[cid]
            if f.profile == spare.profile
        )
        created: list[tuple[int, int, Instance]] = []
        while have < spare.count:
            best: tuple[int, int, int, Option] | None = None
            for node, node_cids in enumerate(cids):
                for pos, cid in enumerate(node_cids):
                    option = classes.best_create(cid, spare.profile)
                    if option is None or option.cost >> DESTROYED:
                        continue
                    cand = (option.cost, node, pos, option)
                    if best is None or cand[:3] < best[:3]:
                        best = cand
            if best is None:
                break
            _, node, pos, option = best
            # Pinned while more spares are placed (so the next one goes elsewhere)...
            cids[node][pos] = option.to_class
            created.append((node, pos, option.instance))
            have += 1
        # ...then released: a spare is a free instance.
        for node, pos, inst in created:
            cid = cids[node][pos]
            cids[node][pos] = classes.intern(
                classes.table[cid], classes.pinned[cid] - {inst}, classes.free[cid] | {inst}, True
            )

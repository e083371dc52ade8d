"""What a request would cost on a node: its cheapest devices there, one at a time.

A node's state is the classes of its GPUs (`migpart.planning.classes`). Its cheapest `count`
devices of some profiles are its GPUs' chains merged, the cheapest next device each time; with
`same_gpu`, the cheapest single GPU whose chain holds them all. Devices are added one cheapest
at a time, so the cheapest k devices are the first k of the cheapest n: one evaluation per
(state, profiles, same GPU) serves every count, and it goes as deep as the largest request of
those profiles at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from migpart.mig import Instance
from migpart.planning.classes import GpuClasses, Steps
from migpart.planning.model import Request


@dataclass(slots=True)
class _Prefixes:
    """A node's cheapest k devices of some profiles, for k = 1, 2, ...: `found[k - 1]`."""

    found: list[tuple[int, Steps]]
    ended: bool  # no further device fits


class Evaluator:
    """Evaluations of requests on node states, cached by (state, profiles, same GPU)."""

    def __init__(self, classes: GpuClasses, requests: Sequence[Request]) -> None:
        self.classes = classes
        self.cache: dict[tuple[tuple[int, ...], tuple[str, ...], bool], _Prefixes] = {}
        # The most devices any request of (profiles, same GPU) asks for: evaluations go that
        # deep at once, so that one serves all the counts of its profiles.
        self.depth: dict[tuple[tuple[str, ...], bool], int] = {}
        for request in requests:
            key = (tuple(dict.fromkeys(request.profiles)), request.same_gpu)
            self.depth[key] = max(self.depth.get(key, 0), request.count)

    def evaluate(
        self, cids: tuple[int, ...], profiles: tuple[str, ...], count: int, same_gpu: bool = False
    ) -> tuple[int, Steps] | None:
        """Cost and devices of `count` devices on a node whose GPUs are in classes `cids`,
        added one cheapest device at a time (all on one GPU with `same_gpu`); None when they
        do not fit."""
        key = (cids, profiles, same_gpu)
        known = self.cache.get(key)
        if known is None or (len(known.found) < count and not known.ended):
            depth = max(count, self.depth.get((profiles, same_gpu), 0))
            known = self.cache[key] = self._prefixes(cids, profiles, depth, same_gpu)
        return known.found[count - 1] if count <= len(known.found) else None

    def _prefixes(
        self, cids: tuple[int, ...], profiles: tuple[str, ...], count: int, same_gpu: bool
    ) -> _Prefixes:
        """The cheapest 1, 2, ... `count` devices on GPUs in classes `cids`.

        Devices are added one cheapest at a time, so the cheapest k devices are the first k
        of the cheapest `count`: one evaluation serves every count of the shape.
        """
        chains = [self.classes.chain(cid, profiles, count) for cid in cids]
        found: list[tuple[int, Steps]] = []
        if same_gpu:
            # For each count, the cheapest GPU that can hold every device by itself.
            for k in range(count):
                best_pos = -1
                best_cost = 0
                for pos, links in enumerate(chains):
                    if k < len(links) and (best_pos < 0 or links[k][3] < best_cost):
                        best_pos = pos
                        best_cost = links[k][3]
                if best_pos < 0:
                    return _Prefixes(found, True)
                links = chains[best_pos][: k + 1]
                found.append((best_cost, tuple([(best_pos, link[1]) for link in links])))
            return _Prefixes(found, False)
        # The node's cheapest device, again and again: its GPUs' chains merged.
        taken = [0] * len(cids)
        total = 0
        steps: list[tuple[int, Instance]] = []
        for _ in range(count):
            best_pos = -1
            best_cost = 0
            for pos, links in enumerate(chains):
                j = taken[pos]
                if j < len(links) and (best_pos < 0 or links[j][0] < best_cost):
                    best_pos = pos
                    best_cost = links[j][0]
            if best_pos < 0:
                return _Prefixes(found, True)
            total += best_cost
            steps.append((best_pos, chains[best_pos][taken[best_pos]][1]))
            taken[best_pos] += 1
            found.append((total, tuple(steps)))
        return _Prefixes(found, False)

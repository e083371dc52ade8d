"""The planning objective over time: what one round cannot see, decided from the requests'
ages and the demand mix seen so far.

`plan()` maximises what it can satisfy now. Replayed over a day of the Alibaba trace
(`migpart simulate`), that alone loses to first-fit dynamic MIG: an instance freed by a
departing whole-GPU pod is handed at once to the next whole-GPU pod, so a small request that
has waited longer is overtaken again and again. These pure functions carry the round-to-round
part; the caller passes the clock's readings in (the operator ages its requests with
`aged_requests`; the simulator's migpart policy uses them all).

- `aged`: within one priority, a request ranks by how long it has waited, in `AGE_LEVELS`
  levels that double in length from `age_s` on (never above a higher priority), so the
  planner serves the oldest first and may repartition free instances for them.
- `aged_requests`: `aged` over the operator's claims, each as old as its oldest waiting pod
  (`AGE_S` by default).
- `withdraw_on_release`: an instance freed while a request that cannot use it has waited
  `age_s` longer than any it could serve is withdrawn (destroyed) instead of being handed to
  the younger one, and the next round repartitions the space for the older.
- `spares_from_mix`: free instances to keep ready, sized from the profiles the recent requests
  asked for.
- `held_node`, `kept_off`: while a multi-GPU request waits, the emptiest node is kept for it
  (the others are planned elsewhere), so that a whole node drains; only a node at most
  `max_used` in use behind pods that have run no longer than the request waited, nor than a
  patience, so that a held node does not idle behind pods that may run long.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from migpart.planning.model import Request, Snapshot, Spare

AGE_LEVELS = 8
AGE_STEPS = 1
# A request whose oldest waiting pod was created this long ago ranks above the younger
# requests of its priority (`aged_requests`); the simulator's default too.
AGE_S = 1200.0


@dataclass(frozen=True, slots=True)
class Hold:
    """A node kept free for a waiting multi-GPU request."""

    node: str
    request: Request


def age_level(waited_s: float, age_s: float) -> int:
    """0 below `age_s`, 1 below 3 x `age_s`, 2 below 7 x, ... up to `AGE_LEVELS` - 1."""
    if waited_s < age_s or age_s <= 0:
        return 0
    return min(AGE_LEVELS - 1, int(AGE_STEPS * math.log2(1 + waited_s / age_s)))


def aged(requests: Iterable[Request], waited_s: Mapping[str, float], age_s: float) -> list[Request]:
    """The requests with each priority spread into `AGE_LEVELS` levels by age: the order
    between priorities is kept, and within one the longer a request waited the higher."""
    return [
        replace(
            r,
            priority=AGE_LEVELS * r.priority + age_level(waited_s.get(r.name, 0.0), age_s),
        )
        for r in requests
    ]


def withdraw_on_release(
    profiles: Sequence[str], waiting: Iterable[tuple[Request, float]], age_s: float
) -> bool:
    """Whether instances of `profiles`, just freed together, should be withdrawn: a request
    that cannot use them has waited `age_s` or more, and `age_s` longer than every request
    they could serve (one that needs at most that many devices of those profiles)."""
    freed = set(profiles)
    served_wait = -math.inf
    overtaken_wait = -math.inf
    for r, waited in waiting:
        if freed.intersection(r.profiles):
            if r.count <= len(profiles):
                served_wait = max(served_wait, waited)
        else:
            overtaken_wait = max(overtaken_wait, waited)
    if served_wait == -math.inf:
        return False  # nobody takes them now; the next round repartitions them if need be
    return overtaken_wait >= age_s and overtaken_wait - served_wait >= age_s


def spares_from_mix(recent: Sequence[Request], total: int) -> tuple[Spare, ...]:
    """`total` spares split over the first profiles of the `recent` requests in proportion to
    the devices asked (largest remainders), single-device requests only: a multi-device pod
    needs more than a spare or two."""
    asked: Counter[str] = Counter()
    for r in recent:
        if r.count == 1 and r.profiles:
            asked[r.profiles[0]] += 1
    seen = sum(asked.values())
    if total <= 0 or not seen:
        return ()
    shares = {p: total * n / seen for p, n in asked.items()}
    counts = {p: int(s) for p, s in shares.items()}
    rest = total - sum(counts.values())
    for p in sorted(shares, key=lambda p: (counts[p] - shares[p], p))[:rest]:
        counts[p] += 1
    return tuple(Spare(p, n) for p, n in sorted(counts.items()) if n)


def held_node(
    snapshot: Snapshot,
    requests: Sequence[Request],
    max_used: float,
    running_s: Mapping[str, float] | None = None,
    waited_s: Mapping[str, float] | None = None,
    patience_s: float = math.inf,
) -> Hold | None:
    """The node kept free for the first waiting multi-GPU request, if any is worth holding.

    The request is the multi-GPU one (`count` > 1) of highest priority, the first on ties (with
    `aged` priorities, the oldest). Its node is the one of its nodes with enough GPUs where the
    fewest compute slices are in use, the last such node on ties (new instances go to the
    first nodes, so the last ones drain). No node is held when even that one has more than
    `max_used` of its compute slices in use: holding it would idle the rest behind pods that
    may run long. With `running_s` (node -> how long its longest-running pod has run), a node
    is held only if that pod has run no longer than the request has waited (`waited_s`) and
    no longer than `patience_s`: a pod that has run long is likely to run long yet, and a hold
    behind it would idle the rest of the node for as long.
    """
    multi = [r for r in requests if r.count > 1]
    if not multi:
        return None
    first = max(multi, key=lambda r: r.priority)
    patience = patience_s if waited_s is None else min(patience_s, waited_s.get(first.name, 0.0))
    best: tuple[float, int, str] | None = None
    for position, node in enumerate(snapshot.nodes):
        if len(node.gpus) < first.count or (
            first.nodes is not None and node.name not in first.nodes
        ):
            continue
        used = total = 0
        for gpu in node.gpus:
            table = snapshot.table(gpu.model)
            total += table.compute_slices
            used += sum(
                table.profile(i.profile).compute_slices
                for i in gpu.instances
                if i.used and table.has(i.profile)
            )
        share = used / max(1, total)
        if running_s is not None and running_s.get(node.name, 0.0) > patience:
            continue
        if best is None or (share, -position) <= (best[0], -best[1]):
            best = (share, position, node.name)
    if best is None or best[0] > max_used:
        return None
    return Hold(best[2], first)


def kept_off(requests: Iterable[Request], hold: Hold, names: Iterable[str]) -> list[Request]:
    """The requests with the held node taken out of the node sets of every one that does not
    outrank the held request (other than the held request itself), so that they are planned
    elsewhere; one that could go nowhere else keeps its nodes."""
    everywhere = frozenset(names)
    out = []
    for r in requests:
        if r.name != hold.request.name and r.priority <= hold.request.priority:
            nodes = (r.nodes if r.nodes is not None else everywhere) - {hold.node}
            if nodes:
                r = replace(r, nodes=nodes)
        out.append(r)
    return out


def aged_requests(
    requests: Iterable[Request],
    waiting: Mapping[str, Iterable[Mapping[str, Any]]],
    now: datetime,
    age_s: float = AGE_S,
) -> list[Request]:
    """The requests with their priorities spread by age (`aged`), so that within one
    priority the planner serves the claims that waited longest first.

    A request's age is that of the oldest waiting pod using its claim (`waiting`: claim key ->
    the pods' placements (`kube.placement`), whose `created` is the pod's creationTimestamp,
    RFC 3339); a pod without a readable timestamp counts as just created.
    """
    requests = list(requests)
    waited: dict[str, float] = {}
    for r in requests:
        created = [_timestamp(p.get("created")) for p in waiting.get(r.name, ())]
        known = [c for c in created if c is not None]
        if known:
            waited[r.name] = max(0.0, (now - min(known)).total_seconds())
    return aged(requests, waited, age_s)


def _timestamp(raw: object) -> datetime | None:
    if not isinstance(raw, str) or not raw:
        return None
    try:
        parsed = datetime.fromisoformat(raw)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None

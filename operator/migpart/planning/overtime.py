"""The planning objective over time: what one round cannot see, decided from the requests'
ages and the demand mix seen so far.

`plan()` maximises what it can satisfy now. Replayed over a day of the Alibaba trace
(`migpart simulate`), that alone loses to first-fit dynamic MIG: an instance freed by a
departing whole-GPU pod is handed at once to the next whole-GPU pod, so a small request that
has waited longer is overtaken again and again. These pure functions carry the round-to-round
part; the caller (the simulator's migpart policy) passes the clock's readings in.

- `aged`: within one priority, a request ranks by how long it has waited, in `AGE_LEVELS`
  levels that double in length from `age_s` on (never above a higher priority), so the
  planner serves the oldest first and may repartition free instances for them.
- `withdraw_on_release`: an instance freed while a request that cannot use it has waited
  `age_s` longer than any it could serve is withdrawn (destroyed) instead of being handed to
  the younger one, and the next round repartitions the space for the older.
- `spares_from_mix`: free instances to keep ready, sized from the profiles the recent requests
  asked for.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from migpart.planning.model import Request, Spare

AGE_LEVELS = 8


def age_level(waited_s: float, age_s: float) -> int:
    """0 below `age_s`, 1 below 3 x `age_s`, 2 below 7 x, ... up to `AGE_LEVELS` - 1."""
    if waited_s < age_s or age_s <= 0:
        return 0
    return min(AGE_LEVELS - 1, int(math.log2(1 + waited_s / age_s)))


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

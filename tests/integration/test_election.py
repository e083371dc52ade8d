"""Leader election on the real API server: `KubeLeaseStore` and `LeaderElector` with the
API server's optimistic concurrency (resourceVersion), the Lease as `kubectl` shows it, and a
release that lets the next candidate in at once. Time comes from an injected clock."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass

import pytest
from kubernetes_asyncio.client import ApiClient

from migpart.kube.election import LeaderElector
from migpart.kube.election_lease import Conflict, KubeLeaseStore, LeaseRecord
from migpart.testbed import Testbed
from tests.integration.conftest import get

pytestmark = pytest.mark.integration
NAMESPACE = "default"
_names = itertools.count(1)


@dataclass
class Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


def store(api: ApiClient, name: str) -> KubeLeaseStore:
    return KubeLeaseStore(api, NAMESPACE, name, timeout_s=5.0)


async def test_two_candidates_one_leader_then_a_release_hands_over(
    api: ApiClient, cluster: Testbed
) -> None:
    name = f"election-{next(_names)}"
    clock = Clock()
    a = LeaderElector(store(api, name), "a", clock=clock)
    b = LeaderElector(store(api, name), "b", clock=clock)
    won = await asyncio.gather(a.try_acquire_or_renew(), b.try_acquire_or_renew())
    assert sorted(won) == [False, True]  # both tried to create it: one got 409
    leader, standby = (a, b) if won[0] else (b, a)
    lease = get(cluster, "lease", name, "-n", NAMESPACE)["spec"]
    assert lease["holderIdentity"] == leader.identity
    assert lease["leaseDurationSeconds"] == 15
    assert lease["leaseTransitions"] == 0
    assert lease["acquireTime"]
    assert lease["renewTime"]
    assert leader.identity in cluster.kubectl("get", "lease", name, "-n", NAMESPACE)
    clock.now += 2
    assert await leader.try_acquire_or_renew()  # a renewal, at the resourceVersion it read
    assert not await standby.try_acquire_or_renew()
    await leader.release()
    assert leader.current() is None
    assert not get(cluster, "lease", name, "-n", NAMESPACE)["spec"].get("holderIdentity")
    assert await standby.try_acquire_or_renew()  # no lease duration to wait
    lease = get(cluster, "lease", name, "-n", NAMESPACE)["spec"]
    assert (lease["holderIdentity"], lease["leaseTransitions"]) == (standby.identity, 1)
    term = standby.current()
    assert term is not None
    assert term.token == 1


async def test_an_update_at_an_old_resource_version_conflicts(api: ApiClient) -> None:
    leases = store(api, f"election-{next(_names)}")
    created = await leases.create(LeaseRecord(holder="a"))
    with pytest.raises(Conflict):
        await leases.create(LeaseRecord(holder="b"))
    renewal = LeaseRecord(
        holder="a",
        renew_time="2026-01-01T00:00:01.000000Z",
        resource_version=created.resource_version,
    )
    renewed = await leases.update(renewal)  # (an update that changes nothing keeps the version)
    assert renewed.resource_version != created.resource_version
    with pytest.raises(Conflict):
        await leases.update(LeaseRecord(holder="b", resource_version=created.resource_version))
    current = await leases.get()
    assert current is not None
    assert current.holder == "a"

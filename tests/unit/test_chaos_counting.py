"""The chaos harness's pod counts (bench/chaos_harness.py): a pod the claim-delete fault deletes
counts in neither the served nor the total, even when the stand-in kubelet was starting it
when the fault chose it (the run on a fresh clone that counted 9 pods served of 8)."""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace
from typing import Any

from bench.chaos_counters import Counters, Pod
from bench.chaos_harness import Chaos
from migpart.demo.trace import TracePod


class _Kubelet:
    """Starts a pod only once the test lets it (`go`), as an agent's slow prepare would."""

    def __init__(self) -> None:
        self.starting = asyncio.Event()
        self.go = asyncio.Event()
        self.prepared: dict[str, Any] = {}

    async def start_pod(self, pod: Any) -> None:
        self.starting.set()
        await self.go.wait()

    async def forget_pod(self, namespace: str, name: str) -> None:
        return None


class _Core:
    def __init__(self, pod: Any) -> None:
        self.pods = [pod]

    async def list_namespaced_pod(self, namespace: str) -> Any:
        return SimpleNamespace(items=list(self.pods))

    async def delete_namespaced_pod(self, name: str, namespace: str, **_: Any) -> None:
        self.pods = [p for p in self.pods if p.metadata.name != name]


def _harness(name: str) -> tuple[Chaos, _Kubelet]:
    pod = SimpleNamespace(metadata=SimpleNamespace(name=name), spec=SimpleNamespace(node_name="n1"))
    chaos = Chaos.__new__(Chaos)  # no cluster: only the counting parts
    kubelet = _Kubelet()
    chaos.core, chaos.kubelet = _Core(pod), kubelet  # type: ignore[assignment]
    chaos.rng, chaos.c, chaos.deleted = random.Random(7), Counters(), set()
    chaos.pods = {name: Pod(TracePod(name, "1g.10gb", 1, 0.0, 60.0), created=0.0)}
    chaos.c.total.add(name)
    return chaos, kubelet


async def test_a_pod_deleted_while_its_start_is_under_way_is_not_counted_served() -> None:
    chaos, kubelet = _harness("pod-a")
    driving = asyncio.create_task(chaos.drive())
    await kubelet.starting.wait()
    await chaos.inject("claim-delete")  # the pod has not started yet: the fault may choose it
    kubelet.go.set()
    await driving
    assert chaos.deleted == {"pod-a"}
    assert chaos.c.served == chaos.c.total == set()
    assert chaos.c.ok()


async def test_a_pod_started_and_then_deleted_leaves_both_counts() -> None:
    chaos, kubelet = _harness("pod-b")
    kubelet.go.set()
    await chaos.drive()
    assert chaos.c.served == chaos.c.total == {"pod-b"}
    await chaos.inject("claim-delete")  # a started pod is never chosen
    assert chaos.deleted == set()
    assert chaos.c.ok()

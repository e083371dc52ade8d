"""What the e2e tests share: a node's instances and its ResourceSlice as they read them, and a
node holding one free 7g.80gb to race against."""

from __future__ import annotations

from typing import Any

from migpart.slices.dra import DRIVER
from migpart.testing.builders import profile_is
from tests.e2e.conftest import H100, Scenario


def instances(sc: Scenario, node: str, state: str | None = None) -> list[tuple[int, str, str]]:
    """The node's instances as its agent reports them: (GPU, profile, state), of one `state`
    or all."""
    return [
        (g["index"], i["profile"], i["state"])
        for g in sc.gpus(node)
        for i in g.get("instances", [])
        if state is None or i["state"] == state
    ]


def mig_slice(scenario: Scenario, node: str) -> dict[str, Any] | None:
    """The node's ResourceSlice of our driver, if any."""
    items = scenario.get("resourceslices", f"--field-selector=spec.nodeName={node}")["items"]
    ours = [s for s in items if s["spec"]["driver"] == DRIVER]
    assert len(ours) <= 1, ours
    return ours[0] if ours else None


def one_free_whole_gpu(sc: Scenario) -> str:
    """A node of one H100 with slow NVML (100 ms a call) under the default policy, its GPU
    holding one free 7g.80gb: made for the pod `warmup`, which has finished. Returns the
    node's name."""
    node = sc.add_node(f"{H100}:1", sim_latency_ms=100)
    sc.policy()
    sc.pod("warmup", profile_is("7g.80gb"))
    sc.wait_served("warmup")
    sc.finish("warmup")
    sc.eventually("the 7g.80gb is free", lambda: instances(sc, node) == [(0, "7g.80gb", "Free")])
    return node

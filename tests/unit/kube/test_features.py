"""What the API server's answers to the dry-run probes say it serves (kube/features.py), and how
discovery retries; the probes against real API servers: tests/integration/test_allocation_mode.py.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from migpart.clock import ManualClock
from migpart.kube.features import (
    counters_probe,
    devices_probe,
    discover_dra_features,
    features_of,
)
from migpart.slices.dra import DRIVER


def answered(body: dict[str, Any], *dropped: str) -> dict[str, Any]:
    """`body` as a server answers it after dropping the fields of disabled gates."""
    out = copy.deepcopy(body)
    if "sharedCounters" in dropped:
        out["spec"].pop("sharedCounters")
    for device in out["spec"].get("devices", []):
        for name in dropped:
            device.pop(name, None)
    return out


def test_the_probes_use_the_fields_offer_mode_needs_in_two_slices_of_one_pool() -> None:
    counters, devices = counters_probe(), devices_probe()
    assert "devices" not in counters["spec"]  # a slice has counters or devices, not both
    assert "sharedCounters" not in devices["spec"]
    [device] = devices["spec"]["devices"]
    [consumed] = device["consumesCounters"]
    assert consumed["counterSet"] == counters["spec"]["sharedCounters"][0]["name"]
    assert device["taints"][0]["effect"] == "NoExecute"
    for probe in (counters, devices):
        assert probe["spec"]["driver"] == DRIVER
        assert probe["spec"]["pool"]["resourceSliceCount"] == 2


def test_every_field_kept_means_offer_is_served() -> None:
    features = features_of(counters_probe(), devices_probe())
    assert features.offer_served
    assert features.detail == "served: partitionable devices, device taints"


def test_dropped_counters_mean_no_partitionable_devices() -> None:
    features = features_of(
        answered(counters_probe(), "sharedCounters"), answered(devices_probe(), "consumesCounters")
    )
    assert not features.partitionable_devices
    assert features.device_taints
    assert not features.offer_served
    assert "not served: partitionable devices" in features.detail


def test_dropped_taints_mean_no_device_taints_and_offer_still_served() -> None:
    features = features_of(counters_probe(), answered(devices_probe(), "taints"))
    assert features.partitionable_devices
    assert not features.device_taints
    assert features.offer_served  # an unusable placement then cannot evict its pod
    assert features.detail.endswith("not served: device taints")


def test_an_answer_without_devices_serves_nothing() -> None:
    features = features_of({}, {"spec": {}})
    assert not features.offer_served


class Server:
    """A dry-run create that fails with `failures` first, then answers with the body as is
    (an API server that serves every field)."""

    def __init__(self, *failures: Exception) -> None:
        self.failures = list(failures)
        self.asked: list[str] = []

    async def __call__(self, body: dict[str, Any]) -> Mapping[str, Any]:
        self.asked.append(body["metadata"]["name"])
        if self.failures:
            raise self.failures.pop(0)
        return body


async def test_discovery_asks_with_both_probes() -> None:
    server = Server()
    features = await discover_dra_features(server, ManualClock())
    assert features.offer_served
    assert server.asked == [
        counters_probe()["metadata"]["name"],
        devices_probe()["metadata"]["name"],
    ]


async def test_a_failure_to_ask_is_retried_with_a_growing_pause() -> None:
    server = Server(ApiException(status=503, reason="Service Unavailable"), aiohttp.ClientError())
    clock = ManualClock()
    features = await discover_dra_features(server, clock)
    assert features.offer_served
    assert clock.slept_s == 2.0 + 4.0


async def test_a_server_that_never_answers_serves_nothing_and_says_why() -> None:
    server = Server(*(ApiException(status=403, reason="Forbidden") for _ in range(3)))
    clock = ManualClock()
    features = await discover_dra_features(server, clock)
    assert not features.offer_served
    assert features.detail == "could not ask the API server: HTTP 403 Forbidden"
    assert clock.slept_s == 2.0 + 4.0


async def test_a_refused_probe_means_not_served_at_once() -> None:
    server = Server(ApiException(status=422, reason="Unprocessable Entity"))
    features = await discover_dra_features(server, ManualClock())
    assert not features.offer_served
    assert "refused the probe" in features.detail
    assert len(server.asked) == 1

"""What the API server's answers to the dry-run probes say it serves (kube/features.py); the
probes against real API servers are tests/integration/test_allocation_mode.py."""

from __future__ import annotations

import copy
from typing import Any

from migpart.dra import DRIVER
from migpart.kube.features import counters_probe, devices_probe, features_of


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
    assert device["bindingConditions"]
    assert device["bindingFailureConditions"]
    for probe in (counters, devices):
        assert probe["spec"]["driver"] == DRIVER
        assert probe["spec"]["pool"]["resourceSliceCount"] == 2


def test_every_field_kept_means_offer_is_served() -> None:
    features = features_of(counters_probe(), devices_probe())
    assert features.offer_served
    assert features.detail == "served: partitionable devices, binding conditions"


def test_dropped_counters_mean_no_partitionable_devices() -> None:
    features = features_of(
        answered(counters_probe(), "sharedCounters"), answered(devices_probe(), "consumesCounters")
    )
    assert not features.partitionable_devices
    assert features.binding_conditions
    assert not features.offer_served
    assert "not served: partitionable devices" in features.detail


def test_dropped_binding_conditions_mean_no_binding_conditions() -> None:
    devices = answered(devices_probe(), "bindingConditions", "bindingFailureConditions")
    features = features_of(counters_probe(), devices)
    assert features.partitionable_devices
    assert not features.binding_conditions
    assert features.detail.endswith("not served: binding conditions")


def test_an_answer_without_devices_serves_nothing() -> None:
    features = features_of({}, {"spec": {}})
    assert not features.offer_served

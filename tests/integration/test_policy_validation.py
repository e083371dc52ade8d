"""Bad GpuPartitionPolicies are refused by the real API server, naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from migpart.api.models import GROUP, VERSION
from migpart.testbed import Testbed, TestbedError

pytestmark = pytest.mark.integration


def _policy(spec: dict[str, Any]) -> str:
    return json.dumps(
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "GpuPartitionPolicy",
            "metadata": {"name": "bad-policy"},
            "spec": spec,
        }
    )


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        pytest.param(
            {"profiles": {"allow": ["1g.10gb", "3g.40gb"], "deny": ["3g.40gb"]}},
            "spec.profiles",
            "allow and deny",
            id="allow-and-deny-overlap",
        ),
        pytest.param(
            {"spares": [{"profile": "1g.10gb", "count": -1}]},
            "spec.spares[0].count",
            "greater than or equal to 0",
            id="negative-spare-count",
        ),
        pytest.param(
            {"profiles": {"allow": ["3g40gb"]}},
            "spec.profiles.allow[0]",
            "should match",
            id="bad-profile-syntax",
        ),
        pytest.param({"mode": "Sometimes"}, "spec.mode", "Unsupported value", id="bad-mode"),
        pytest.param(
            {"reconfiguration": {"maxConcurrentNodes": 0}},
            "spec.reconfiguration.maxConcurrentNodes",
            "greater than or equal to 1",
            id="zero-concurrent-nodes",
        ),
    ],
)
def test_bad_policy_is_rejected_naming_the_field(
    cluster: Testbed, spec: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(TestbedError) as refused:
        cluster.kubectl("create", "--dry-run=server", "-f", "-", input=_policy(spec))
    message = str(refused.value)
    assert field in message
    assert words in message


def test_good_policy_is_accepted(cluster: Testbed) -> None:
    spec = {
        "mode": "DryRun",
        "profiles": {"allow": ["1g.10gb", "3g.40gb"]},
        "spares": [{"profile": "1g.10gb", "count": 2}],
        "reconfiguration": {"batchWindowSeconds": 2, "maxConcurrentNodes": 1},
    }
    out = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=_policy(spec))
    assert "created (server dry run)" in out

"""GpuPartitionPolicy specs from a hypothesis strategy, valid and broken, on the real API
server with the operator running.

The oracle is the pydantic model (`GpuPartitionPolicySpec`), from which the CRD is generated:
a spec it refuses must be refused by the API server with a message naming a field it names;
a spec it accepts must be accepted, and then handled by the operator (the policy status shows
the spec's generation) without the operator failing; the next example is handled too, so no
spec leaves it stuck. Example counts are small: every example is a few API calls.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from migpart.api.models import GROUP, VERSION, GpuPartitionPolicySpec
from migpart.testbed import Testbed, TestbedError
from tests.integration.conftest import RunningOperator, eventually, get, gpu_status, put_mignode

pytestmark = pytest.mark.integration

NAME = "fuzzed-policy"
LABELS = {"migpart-test": "fuzz"}

GOOD_PROFILES = ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "1g.10gb+me"]
BAD_PROFILES = ["3g40gb", "", "G.10gb", "1g.10gb+", "x" * 40, "7g.80GB"]


def _specs(broken: bool) -> st.SearchStrategy[dict[str, Any]]:
    """Policy specs; with `broken`, every field may also take values just outside its range,
    of the wrong type, or unknown fields (half the examples are drawn each way)."""

    def pick(good: list[Any], bad: list[Any]) -> st.SearchStrategy[Any]:
        return st.sampled_from(good) | st.sampled_from(bad) if broken else st.sampled_from(good)

    def ints(low: int, high: int) -> st.SearchStrategy[Any]:
        valid = st.integers(low, high)
        return valid | pick([low], [low - 1, high + 1, -(2**31), "high", [], {}])

    profile = pick(GOOD_PROFILES, BAD_PROFILES)
    unknown = {"size": st.just(1)} if broken else {}
    requirement = st.fixed_dictionaries(
        {
            "key": pick(["migpart-test", "zone"], [""]),
            "operator": pick(["In", "NotIn", "Exists", "DoesNotExist"], ["Has", "in"]),
        },
        optional={"values": st.lists(st.sampled_from(["fuzz", "a", "b"]), max_size=2)},
    )
    selector = st.fixed_dictionaries(
        {},
        optional={
            "matchLabels": st.sampled_from([LABELS, {}, {"migpart-test": "nothing"}]),
            "matchExpressions": st.lists(requirement, max_size=2),
        },
    )
    spare = st.fixed_dictionaries({"profile": profile, "count": ints(0, 1024)}, optional=unknown)
    return st.fixed_dictionaries(
        {},
        optional={
            "mode": pick(["Active", "DryRun"], ["Sometimes", "active"]),
            "priority": ints(0, 1_000_000),
            "nodeSelector": selector,
            "profiles": st.fixed_dictionaries(
                {},
                optional={
                    "allow": st.lists(profile, max_size=3),
                    "deny": st.lists(profile, max_size=2),
                },
            ),
            "spares": st.lists(spare, max_size=3),
            "reconfiguration": st.fixed_dictionaries(
                {},
                optional={
                    "batchWindowSeconds": ints(0, 3600),
                    "maxConcurrentNodes": ints(1, 1024),
                },
            ),
            **({"frobnicate": st.just(1)} if broken else {}),
        },
    )


specs = _specs(broken=False) | _specs(broken=True)


def _path(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as the API server writes field paths."""
    out = "spec"
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part != "[key]":
            out += f".{part}"
    # The spec-level validator is about spares (the CRD's rule reports spec.spares).
    return "spec.spares" if out == "spec" else out


def _policy(spec: dict[str, Any]) -> str:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GpuPartitionPolicy",
        "metadata": {"name": NAME},
        "spec": spec,
    }
    return json.dumps(body)


@pytest.fixture
def fuzz_node(cluster: Testbed) -> Iterator[None]:
    cluster.add_node("fuzz-node", LABELS)
    put_mignode(cluster, "fuzz-node", [gpu_status(0, [("1g.10gb", 0)]), gpu_status(1, [])])
    yield
    cluster.kubectl("delete", "gpupartitionpolicy", NAME, "--ignore-not-found")


def test_fuzzed_policy_is_refused_naming_the_field_or_handled(
    cluster: Testbed, operator: RunningOperator, fuzz_node: None
) -> None:
    seen: Counter[str] = Counter()

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(spec=specs)
    def check(spec: dict[str, Any]) -> None:
        try:
            GpuPartitionPolicySpec.model_validate(spec)
            errors: list[str] = []
        except ValidationError as invalid:
            errors = [_path(tuple(e["loc"])) for e in invalid.errors()]
        if errors:
            refused(cluster, spec, errors)
            seen["refused"] += 1
        else:
            handled(cluster, operator, spec)
            seen["accepted"] += 1

    check()
    # Both halves of the oracle were exercised (hypothesis' own examples included).
    assert seen["refused"] >= 5, seen
    assert seen["accepted"] >= 5, seen


def refused(cluster: Testbed, spec: dict[str, Any], errors: list[str]) -> None:
    # A create (dry run) reports field paths as written; server-side apply would write them
    # as its typed-patch paths (.spec.spares[profile="x"]) instead.
    with pytest.raises(TestbedError) as refusal:
        cluster.kubectl("create", "--dry-run=server", "-f", "-", input=_policy(spec))
    message = str(refusal.value)
    assert any(path in message for path in errors), (errors, message)


def handled(cluster: Testbed, operator: RunningOperator, spec: dict[str, Any]) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=_policy(spec))
    generation = get(cluster, "gpupartitionpolicy", NAME)["metadata"]["generation"]

    def observed() -> dict[str, Any]:
        assert operator.error is None, operator.error
        status = get(cluster, "gpupartitionpolicy", NAME).get("status") or {}
        assert status.get("observedGeneration") == generation, status
        return status

    status = eventually(observed)
    (ready,) = [c for c in status["conditions"] if c["type"] == "Ready"]
    assert ready["reason"] in ("Reconciled", "NoNodes", "Unsatisfiable"), ready
    assert NAME in operator.policy_loops()

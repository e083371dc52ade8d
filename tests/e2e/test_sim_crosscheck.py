"""The simulator's model of migpart agrees with the real thing on a short stretch of the trace.

One demo run (`migpart.demo.run`: the demo's own nodes, policy and replay, on this suite's
cluster and operator) and the simulator (`migpart.demo.compare.simulated`) on the same pods,
the same cluster shape and the same policy settings, both counted by the end of the replay
(docs/simulate.md, "Beside the demo").
"""

from __future__ import annotations

import io

import pytest

from migpart.demo.compare import comparison_line, measured, simulated
from migpart.demo.run import apply_policy, replay, start_nodes
from migpart.testing.builders import POOL_LABEL
from tests.crosscheck import PODS, TOLERANCE, crosscheck_run
from tests.e2e.conftest import Scenario

pytestmark = pytest.mark.e2e


def test_simulator_agrees_with_the_testbed(scenario: Scenario) -> None:
    run = crosscheck_run(scenario.pool, {POOL_LABEL: scenario.pool}, namespace=scenario.namespace)
    scenario.nodes += run.node_names  # removed after the test, started or not
    start_nodes(scenario.cluster, run)
    apply_policy(scenario.cluster, run)
    out = io.StringIO()
    real = measured(replay(scenario.cluster, run, out))
    sim = simulated(run)["migpart"]
    line = (
        f"{comparison_line({'migpart': sim}, real)} (creates, destroys: simulator "
        f"{sim.creates}, {sim.destroys}; this run {real.creates}, {real.destroys})"
    )
    print(line)  # in the log of a passing run too (pytest -rA)
    report = f"{line}\nreplay:\n{out.getvalue()}"

    # Both serve every pod: the last two arrive at 36 s and need a 3g each, which a free
    # instance or one repartition gives them within seconds, well before the end at 60 s.
    assert real.served == real.pods == PODS, report
    assert sim.served == sim.pods == PODS, report
    # Not the same plans, the same policy: see TOLERANCE for what differs and why.
    assert abs(real.changes - sim.changes) <= TOLERANCE, report

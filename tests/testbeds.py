"""The real control plane of hack/testbed for the suites that need one.

`running_testbed` builds the Go testbed on first use (cached outside the repo) and runs etcd,
kube-apiserver, kube-scheduler and kube-controller-manager on free loopback ports. Each suite
(integration, e2e) starts its own from a package-scoped fixture, so nothing one suite leaves
behind (an operator, agents, nodes) can act on the other's. Where the testbed cannot be built,
tests that use it FAIL with instructions; they never skip.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from migpart.testbed import Testbed, TestbedBuildError, build


@contextmanager
def running_testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    try:
        binary = build(quiet=True)
    except TestbedBuildError as exc:
        pytest.fail(
            f"the Kubernetes testbed is required and could not be built: {exc}", pytrace=False
        )
    bed = Testbed(tmp_path_factory.mktemp("testbed"), binary=binary)
    with bed.running():
        yield bed

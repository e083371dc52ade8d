"""The real control plane of hack/testbed for the suites that need one.

`running_testbed` builds the Go testbed of the Kubernetes version $MIGPART_K8S_VERSION names
(default the newest; `make test` runs the suites once per version) on first use, cached
outside the repo, and runs etcd, kube-apiserver, kube-scheduler and kube-controller-manager
on free loopback ports; e2e nodes add a real kubelet each (migpart.testbed.kubelet). Each suite
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

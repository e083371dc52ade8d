"""Shared test fixtures: fixture data and the real control plane of hack/testbed.

The `testbed` fixture builds the Go testbed on first use (cached outside the repo) and runs
etcd, kube-apiserver, kube-scheduler and kube-controller-manager on free loopback ports for
the whole session. Where it cannot be built, tests that use it FAIL with instructions; they
never skip.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from migpart.testbed import Testbed, TestbedBuildError, build

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    try:
        binary = build(quiet=True)
    except TestbedBuildError as exc:
        pytest.fail(
            f"the Kubernetes testbed is required and could not be built: {exc}", pytrace=False
        )
    bed = Testbed(tmp_path_factory.mktemp("testbed"), binary=binary)
    with bed.running():
        yield bed

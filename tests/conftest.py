"""Shared test data. The control plane fixture lives with the suites that use it
(tests/integration, tests/e2e: see tests/testbeds.py), one per suite."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from migpart.testbed.build import VERSION_ENV, TestbedBuildError, kube_version
from tests.rest import close_readers

FIXTURES = Path(__file__).parent / "fixtures"

# No wall-clock limits in tests: hypothesis's default 200 ms deadline per example fails a
# correct test on a loaded machine (CI shares its cores). A test's own settings still apply.
settings.register_profile("migpart", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("migpart")


def pytest_report_header(config: pytest.Config) -> str:
    """Which Kubernetes the integration and e2e suites of this run use."""
    try:
        return f"testbed: Kubernetes v{kube_version()} (${VERSION_ENV} picks one)"
    except TestbedBuildError as exc:
        return f"testbed: {exc}"


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The suites' API connections closed (tests/rest.py): a socket left to the garbage
    collector is a ResourceWarning, an error here."""
    close_readers()

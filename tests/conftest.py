"""Shared test data. The control plane fixture lives with the suites that use it
(tests/integration, tests/e2e: see tests/testbeds.py), one per suite."""

from __future__ import annotations

from pathlib import Path

import pytest

from migpart.testbed.build import VERSION_ENV, TestbedBuildError, kube_version

FIXTURES = Path(__file__).parent / "fixtures"


def pytest_report_header(config: pytest.Config) -> str:
    """Which Kubernetes the integration and e2e suites of this run use."""
    try:
        return f"testbed: Kubernetes v{kube_version()} (${VERSION_ENV} picks one)"
    except TestbedBuildError as exc:
        return f"testbed: {exc}"

"""Shared test data. The control plane fixture lives with the suites that use it
(tests/integration, tests/e2e: see tests/testbeds.py), one per suite."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, settings

FIXTURES = Path(__file__).parent / "fixtures"

# No wall-clock limits in tests: hypothesis's default 200 ms deadline per example fails a
# correct test on a loaded machine (CI shares its cores). A test's own settings still apply.
settings.register_profile("migpart", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("migpart")

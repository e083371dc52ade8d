"""Shared test data. The control plane fixture lives with the suites that use it
(tests/integration, tests/e2e: see tests/testbeds.py), one per suite."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"

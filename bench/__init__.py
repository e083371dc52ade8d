"""Benchmarks: programs that print ratios measured side by side, run from the repository root
as modules (`python -m bench.planner`, `python -m bench.scale`, `python -m bench.chaos`)."""

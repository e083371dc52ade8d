"""What the operator's process runs on, around its watches and rounds.

- `handlers.py`: kopf wiring and the lifecycle (startup, take-over, cleanup).
- `workers.py`: one long-running loop per policy, started and stopped by the operator.
- `state.py`: the in-memory state the handlers share, in the parts functions take.
- `effects.py`: the port every write goes through, and its leadership fence.
- `errors.py`: what an error means for a retry.
- `metrics.py`: the operator's Prometheus metrics.
"""

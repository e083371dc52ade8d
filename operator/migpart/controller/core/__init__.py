"""What every other part of the controller stands on; it imports none of them.

- `state.py`: the in-memory state the handlers share, in the parts functions take.
- `effects.py`: the port every write goes through, and its leadership fence.
- `decisions.py`: the MigNode specs a round writes and the one that repairs a refused spec.
- `health.py`: the nodes' health (Lease, plugin registration, opt-in) and the operator's own
  endpoints.
- `bodies.py`: the few readings every part of the controller makes of a plain body.
- `workers.py`: one long-running loop per policy, started and stopped by the operator.
- `errors.py`: what an error means for a retry.
- `metrics.py`: the operator's Prometheus metrics.
"""

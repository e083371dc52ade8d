"""The operator's process: kopf's handlers and the lifecycle (start-up, take-over, cleanup).

- `handlers.py`: kopf wiring; it makes the state (`core.state`), starts the watches
  (`watching/`) and the planning loops (`rounds/`), and stops them.
"""

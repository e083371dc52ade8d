"""What a node's ResourceSlices hold, and the DRA words both sides write them in.

One topic, two modules, both pure:

- `dra.py`: the DRA vocabulary the agent and the operator share (driver name, `DeviceId`, a
  claim's allocation results, `micro_time`); the agent imports it, so this package's
  `__init__` imports nothing.
- `content.py`: what a node's slices list in reactive mode, a function of its MigNode (offer
  mode's stable pool, `migpart.offer.pool`, builds on it).
"""

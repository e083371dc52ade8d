"""One policy's planning loop and its rounds: scope, plan, destroy protocol, spec, status.

A round decides from what `watching/` holds and writes only through the effects port
(`core/effects.py`); everything here but the loop and the round itself is pure.

- `loop.py`: when a policy's round runs, and what a failed one does.
- `reconcile.py`: one round, from the policy's scope to its specs and status.
- `scope.py`, `screening.py`: a policy's nodes and claims, and what it will not plan.
- `destroy.py`: the destroy protocol (no instance leaves a spec while a claim may hold it).
- `status.py`: the policy status a round writes.
"""

"""`migpart simulate`: what repartitioning buys on a workload, policy against policy.

A discrete-event replay of a pod trace on a simulated cluster, one run per policy on the same
arrivals: static mig-parted layouts, first-fit dynamic MIG, MIG off, and migpart with the real
planner called through the plan contract, reactive or in offer mode (`offer`). Pure apart
from reading the trace file (`workload`), measuring the planner's CPU time (`policies`) and
writing plots (`plot`, matplotlib, lazily).
"""

"""`make demo` and the e2e harness: a local cluster of simulated GPU nodes served by migpart.

Nothing here is used in production: it wires the testbed control plane, one `migpart agent
--simulate` process per node, the `migpart operator` process, a simulated kubelet that calls
the agents' real DRA gRPC plugin, and a replay of the Alibaba GPU trace.
"""

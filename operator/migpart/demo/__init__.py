"""`make demo` and the e2e harness: a local cluster of simulated GPU nodes served by migpart.

Nothing here is used in production: it wires the testbed control plane, per node a real
kubelet (fake container runtime, `migpart.testbed.kubelet`) and a `migpart agent --simulate`
process whose DRA plugin registers with it, the `migpart operator` process, and a replay of
the Alibaba GPU trace.
"""

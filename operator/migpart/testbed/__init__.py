"""The local Kubernetes control plane of `hack/testbed`, built from the Go module proxy.

`build()` compiles the Go binary once per Kubernetes version ($MIGPART_K8S_VERSION: 1.34.4 or
1.37.2) into a cache outside the repo; `Testbed` runs etcd, kube-apiserver, kube-scheduler and
kube-controller-manager as separate processes on loopback and writes a kubeconfig once the API
server answers `/readyz`; `kubelet.NodeKubelet` adds a real kubelet (fake container runtime)
for one node. Integration and e2e tests, `migpart testbed run` and `make demo` all use it.
"""

from migpart.testbed.build import TestbedBuildError, binary_path, build
from migpart.testbed.run import Testbed, TestbedError

__all__ = ["Testbed", "TestbedBuildError", "TestbedError", "binary_path", "build"]

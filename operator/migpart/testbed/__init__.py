"""The local Kubernetes control plane of `hack/testbed`, built from the Go module proxy.

`build()` compiles the Go binary once per go.sum into a cache outside the repo;
`Testbed` runs etcd, kube-apiserver, kube-scheduler and kube-controller-manager as separate
processes on loopback and writes a kubeconfig once the API server answers `/readyz`.
Integration and e2e tests, `migpart testbed run` and `make demo` all use it.
"""

from migpart.testbed.build import TestbedBuildError, binary_path, build
from migpart.testbed.run import Testbed, TestbedError

__all__ = ["Testbed", "TestbedBuildError", "TestbedError", "binary_path", "build"]

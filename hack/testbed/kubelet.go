package main

// The real kubelet (k8s.io/kubernetes/cmd/kubelet/app), as `testbed kubelet [flags]`.
//
// One change from the stock binary: the kubelet hard-codes /var/log/containers for its
// container log symlinks; MIGPART_CONTAINER_LOGS_DIR, when set, moves it so that several
// kubelets on one host keep to their own directories.

import (
	"context"
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format, as cmd/kubelet
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client metrics, as cmd/kubelet
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric, as cmd/kubelet
	kubeletapp "k8s.io/kubernetes/cmd/kubelet/app"
	"k8s.io/kubernetes/pkg/kubelet"
)

// ContainerLogsDirEnv overrides pkg/kubelet.ContainerLogsDir.
const ContainerLogsDirEnv = "MIGPART_CONTAINER_LOGS_DIR"

func kubeletMain() int {
	if dir := os.Getenv(ContainerLogsDirEnv); dir != "" {
		kubelet.ContainerLogsDir = dir
	}
	return cli.Run(kubeletapp.NewKubeletCommand(context.Background()))
}

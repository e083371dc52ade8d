// Command testbed is one binary holding a real Kubernetes cluster for migpart's
// integration and end-to-end tests: etcd, kube-apiserver, kube-scheduler,
// kube-controller-manager, kubelet, a fake CRI runtime for the kubelet and
// kubectl, all built from the Go module proxy. The first argument picks the
// component; each component runs as its own process (the Python side,
// `migpart testbed run`, starts them).
//
// The source is shared by every Kubernetes version; each version's go.mod and
// go.sum live in hack/testbed/v1.MINOR (see operator/migpart/testbed/build.py).
package main

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/version"
	kubectl "k8s.io/kubectl/pkg/cmd"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

const usage = "usage: testbed etcd|kube-apiserver|kube-scheduler|kube-controller-manager|kubelet|fake-cri|kubectl|keygen|version [args...]"

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	component, args := os.Args[1], os.Args[2:]
	// cobra reads os.Args[1:], so drop the component name.
	os.Args = append([]string{component}, args...)
	switch component {
	case "etcd":
		etcdmain.Main(os.Args)
	case "kube-apiserver":
		os.Exit(cli.Run(apiserver.NewAPIServerCommand()))
	case "kube-scheduler":
		os.Exit(cli.Run(scheduler.NewSchedulerCommand()))
	case "kube-controller-manager":
		os.Exit(cli.Run(controllermanager.NewControllerManagerCommand()))
	case "kubelet":
		os.Exit(kubeletMain())
	case "fake-cri":
		os.Exit(fakeCRIMain(args))
	case "kubectl":
		os.Exit(cli.Run(kubectl.NewDefaultKubectlCommand()))
	case "keygen":
		os.Exit(keygen(args))
	case "version":
		fmt.Println("testbed kubernetes " + version.Get().GitVersion)
	default:
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
}

// keygen writes an RSA private key in PEM form: the service-account signing key
// that kube-apiserver and kube-controller-manager share.
func keygen(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: testbed keygen PATH")
		return 2
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	block := &pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}
	if err := os.WriteFile(args[0], pem.EncodeToMemory(block), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

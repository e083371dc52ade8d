package main

// The fake container runtime that each testbed kubelet talks to: k8s.io/cri-client's fake
// CRI server on a unix socket, with three additions the tests need.
//   - Images have a size (the kubelet rejects a pulled image without one).
//   - A container whose config has the env var MIGPART_FAKE_RUN_SECONDS=N exits with code 0
//     N seconds after it started, so a pod with restartPolicy Never reaches Succeeded as a
//     batch pod does. Without it a container runs until the kubelet stops it.
//   - Every CreateContainer call is appended as one JSON line to --record, with the CDI
//     device ids the kubelet passes to the runtime, so tests can read what a container got.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	kubeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
	"k8s.io/cri-client/pkg/util"
)

// RunSecondsEnv is the container env var that makes a fake container exit after N seconds.
const RunSecondsEnv = "MIGPART_FAKE_RUN_SECONDS"

// createRecord is one line of the --record file.
type createRecord struct {
	Time         string            `json:"time"`
	ContainerID  string            `json:"containerId"`
	PodNamespace string            `json:"podNamespace"`
	PodName      string            `json:"podName"`
	PodUID       string            `json:"podUid"`
	Container    string            `json:"container"`
	Attempt      uint32            `json:"attempt"`
	CDIDevices   []string          `json:"cdiDevices"`
	Envs         map[string]string `json:"envs"`
}

type fakeCRI struct {
	*fake.RemoteRuntime
	mu     sync.Mutex
	runFor map[string]time.Duration // container id -> how long it runs once started
	record *os.File
}

func (f *fakeCRI) CreateContainer(ctx context.Context, req *kubeapi.CreateContainerRequest) (*kubeapi.CreateContainerResponse, error) {
	resp, err := f.RemoteRuntime.CreateContainer(ctx, req)
	if err != nil {
		return nil, err
	}
	cfg, sandbox := req.GetConfig(), req.GetSandboxConfig()
	rec := createRecord{
		Time:         time.Now().UTC().Format(time.RFC3339Nano),
		ContainerID:  resp.ContainerId,
		PodNamespace: sandbox.GetMetadata().GetNamespace(),
		PodName:      sandbox.GetMetadata().GetName(),
		PodUID:       sandbox.GetMetadata().GetUid(),
		Container:    cfg.GetMetadata().GetName(),
		Attempt:      cfg.GetMetadata().GetAttempt(),
		CDIDevices:   []string{},
		Envs:         map[string]string{},
	}
	for _, d := range cfg.GetCDIDevices() {
		rec.CDIDevices = append(rec.CDIDevices, d.GetName())
	}
	for _, kv := range cfg.GetEnvs() {
		rec.Envs[kv.GetKey()] = string(kv.GetValue()) // a string up to 1.36, bytes from 1.37
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if text, ok := rec.Envs[RunSecondsEnv]; ok {
		seconds, perr := strconv.ParseFloat(text, 64)
		if perr != nil || seconds < 0 {
			return nil, fmt.Errorf("%s=%q: want a number of seconds >= 0", RunSecondsEnv, text)
		}
		f.runFor[resp.ContainerId] = time.Duration(seconds * float64(time.Second))
	}
	if f.record != nil {
		line, _ := json.Marshal(rec)
		if _, werr := f.record.Write(append(line, '\n')); werr != nil {
			return nil, fmt.Errorf("recording CreateContainer: %w", werr)
		}
	}
	return resp, nil
}

func (f *fakeCRI) StartContainer(ctx context.Context, req *kubeapi.StartContainerRequest) (*kubeapi.StartContainerResponse, error) {
	resp, err := f.RemoteRuntime.StartContainer(ctx, req)
	if err != nil {
		return nil, err
	}
	id := req.GetContainerId()
	f.mu.Lock()
	d, ok := f.runFor[id]
	delete(f.runFor, id)
	f.mu.Unlock()
	if ok {
		time.AfterFunc(d, func() { f.exit(id) })
	}
	return resp, nil
}

// exit ends a running container as if its process returned 0.
func (f *fakeCRI) exit(id string) {
	rs := f.RuntimeService
	rs.Lock()
	defer rs.Unlock()
	c, ok := rs.Containers[id]
	if !ok || c.State != kubeapi.ContainerState_CONTAINER_RUNNING {
		return
	}
	c.State = kubeapi.ContainerState_CONTAINER_EXITED
	c.FinishedAt = time.Now().UnixNano()
	c.ExitCode = 0
	c.Reason = "Completed"
}

// trimCalls drops the fakes' call logs now and then: they grow with every call, forever.
func (f *fakeCRI) trimCalls() {
	for range time.Tick(time.Minute) {
		f.RuntimeService.Lock()
		f.RuntimeService.Called = nil
		f.RuntimeService.Unlock()
		f.ImageService.Lock()
		f.ImageService.Called = nil
		f.ImageService.Unlock()
	}
}

func fakeCRIMain(args []string) int {
	fs := flag.NewFlagSet("fake-cri", flag.ContinueOnError)
	listen := fs.String("listen", "", "unix socket path to serve the CRI on (required)")
	record := fs.String("record", "", "append one JSON line per CreateContainer call to this file")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *listen == "" || fs.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: testbed fake-cri --listen SOCKET [--record FILE]")
		return 2
	}
	f := &fakeCRI{RemoteRuntime: fake.NewFakeRemoteRuntime(), runFor: map[string]time.Duration{}}
	f.ImageService.SetFakeImageSize(1 << 20)
	f.RuntimeService.FakeStatus = &kubeapi.RuntimeStatus{
		Conditions: []*kubeapi.RuntimeCondition{
			{Type: kubeapi.RuntimeReady, Status: true},
			{Type: kubeapi.NetworkReady, Status: true},
		},
	}
	if *record != "" {
		file, err := os.OpenFile(*record, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer file.Close()
		f.record = file
	}
	listener, err := util.CreateListener("unix://" + *listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "listen on %s: %v\n", *listen, err)
		return 1
	}
	server := grpc.NewServer()
	kubeapi.RegisterRuntimeServiceServer(server, f)
	kubeapi.RegisterImageServiceServer(server, f)
	go f.trimCalls()
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-signals
		server.Stop()
	}()
	fmt.Fprintf(os.Stderr, "fake CRI serving on %s\n", *listen)
	if err := server.Serve(listener); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

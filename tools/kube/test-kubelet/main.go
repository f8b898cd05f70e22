// Command test-kubelet plays the kubelet for the Kubernetes test tier (test/k8s/), where a real
// kube-apiserver runs but no real kubelet can (no container runtime, no images on this machine).
//
// What it does, against the API server in --kubeconfig:
//   - registers a Node (InternalIP 127.0.0.1, its HTTPS port in status.daemonEndpoints), Ready;
//   - binds every unscheduled Pod to itself (the scheduler's part) and reports each of its Pods
//     Running and Ready with a pod IP from --pod-cidr (127.x addresses: the host's loopback);
//   - serves /exec/{namespace}/{pod}/{container}, the endpoint the API server proxies pods/exec to,
//     with the kubelet's own stream server code (k8s.io/cri-streaming: SPDY and WebSocket, v1-v4
//     channel protocols, exit codes in the error stream, terminal resize);
//   - finalizes deleted Pods (kills what it ran for them, then deletes them with grace 0).
//
// What it does not do, honestly: it isolates nothing. A pod is a working directory under --root,
// not a container; its main container command is not run (a pod is Running as soon as it is
// bound); an exec is a host process (as this program's user) whose working directory is the pod
// directory. Volume mounts are symlinks inside the pod directory: `<pod dir>/<mountPath>` points
// at `<root>/volumes/<namespace>/<claimName>` for a persistentVolumeClaim volume (so a claim's
// data outlives its Pod, as a bound PersistentVolume's would), or at a directory of the pod's for
// anything else. runtimeClassName, images, probes, resources and security contexts are ignored.
//
// Output: one JSON line on stdout once the node is registered and the exec server listens,
// {"node":"<name>","port":<port>}; logs go to stderr.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func main() {
	if err := run(); err != nil {
		slog.Error("test-kubelet failed", "err", err)
		os.Exit(1)
	}
}

func run() error {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the API server (required)")
	nodeName := flag.String("node-name", "asb-test-node", "name of the Node to register")
	listen := flag.String("listen", "127.0.0.1:0", "address of the exec server (HTTPS); port 0 picks a free one")
	root := flag.String("root", "", "directory for pod working directories and claim volumes (required)")
	podCIDR := flag.String("pod-cidr", "127.77.0.0/16", "pod IPs are taken from this range (loopback: the host reaches them)")
	flag.Parse()
	if *kubeconfig == "" || *root == "" {
		return fmt.Errorf("--kubeconfig and --root are required")
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, nil)))

	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig %s: %w", *kubeconfig, err)
	}
	// client-go's default of 5 requests/s (burst 10) made a pool of 40 take 14 s to run (a bind and
	// a status write per Pod); the real kubelet's defaults are 50/s, burst 100.
	cfg.QPS, cfg.Burst = 50, 100
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ips, err := newIPPool(*podCIDR)
	if err != nil {
		return err
	}
	cert, err := selfSignedCert()
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", *listen, err)
	}
	port := ln.Addr().(*net.TCPAddr).Port

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	if err := registerNode(ctx, client, *nodeName, port); err != nil {
		return err
	}
	pods := newPodTable(*root, ips)
	defer pods.killAll()

	mux := http.NewServeMux()
	mux.HandleFunc("/exec/{namespace}/{pod}/{container}", pods.serveExec)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	server := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	server.TLSConfig = tlsConfig(cert)
	serveErr := make(chan error, 1)
	go func() { serveErr <- server.ServeTLS(ln, "", "") }()

	kubelet := newKubelet(client, *nodeName, pods)
	go kubelet.run(ctx)

	ready, _ := json.Marshal(map[string]any{"node": *nodeName, "port": port})
	fmt.Println(string(ready))

	select {
	case <-ctx.Done():
	case err := <-serveErr:
		return fmt.Errorf("exec server: %w", err)
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = server.Shutdown(shutdown)
	return nil
}

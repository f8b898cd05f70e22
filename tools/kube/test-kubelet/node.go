package main

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// registerNode creates (or takes over) the Node and reports it Ready. Its only address is the
// InternalIP 127.0.0.1, so whatever --kubelet-preferred-address-types the API server has, it
// dials 127.0.0.1:<port> for pods/exec. No heartbeats: no node lifecycle controller runs here.
func registerNode(ctx context.Context, client kubernetes.Interface, name string, port int) error {
	nodes := client.CoreV1().Nodes()
	node, err := nodes.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		node, err = nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name:   name,
			Labels: map[string]string{"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
		}}, metav1.CreateOptions{})
	}
	if err != nil {
		return fmt.Errorf("register node %s: %w", name, err)
	}
	now := metav1.Now()
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("8"),
		corev1.ResourceMemory: resource.MustParse("16Gi"),
		corev1.ResourcePods:   resource.MustParse("1000"),
	}
	node.Status = corev1.NodeStatus{
		Capacity:        capacity,
		Allocatable:     capacity,
		Addresses:       []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}},
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(port)}},
		Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			Message: "asb test kubelet: pods are host processes", LastHeartbeatTime: now, LastTransitionTime: now,
		}},
		NodeInfo: corev1.NodeSystemInfo{
			OperatingSystem: "linux", Architecture: "amd64",
			KubeletVersion: "v0.0.0-asb-test", ContainerRuntimeVersion: "asb-test://0",
		},
	}
	if _, err := nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("node %s status: %w", name, err)
	}
	return nil
}

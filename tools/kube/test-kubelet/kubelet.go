package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// kubelet reconciles Pods one key at a time from a work queue fed by a Pod informer: level-based,
// so a missed event or a failed write is made good by the next pass (failures are retried with
// the queue's backoff).
type kubelet struct {
	client kubernetes.Interface
	node   string
	pods   *podTable
	queue  workqueue.TypedRateLimitingInterface[string]
	lister listersv1.PodLister
}

func newKubelet(client kubernetes.Interface, node string, pods *podTable) *kubelet {
	return &kubelet{
		client: client, node: node, pods: pods,
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
	}
}

func (k *kubelet) run(ctx context.Context) {
	factory := informers.NewSharedInformerFactory(k.client, 0)
	podInformer := factory.Core().V1().Pods()
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			k.queue.Add(key)
		}
	}
	_, _ = podInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: enqueue,
	})
	k.lister = podInformer.Lister()
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	go func() {
		<-ctx.Done()
		k.queue.ShutDown()
	}()
	for k.next(ctx) {
	}
}

func (k *kubelet) next(ctx context.Context) bool {
	key, quit := k.queue.Get()
	if quit {
		return false
	}
	defer k.queue.Done(key)
	if err := k.reconcile(ctx, key); err != nil {
		slog.Warn("pod reconcile failed; retrying", "pod", key, "err", err)
		k.queue.AddRateLimited(key)
		return true
	}
	k.queue.Forget(key)
	return true
}

func (k *kubelet) reconcile(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	pod, err := k.lister.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		k.pods.forget(key) // deleted (with grace 0 by someone else, or by us below)
		return nil
	}
	if err != nil {
		return err
	}
	if pod.Spec.NodeName == "" {
		if pod.DeletionTimestamp != nil {
			return nil
		}
		return k.bind(ctx, pod)
	}
	if pod.Spec.NodeName != k.node {
		return nil
	}
	if pod.DeletionTimestamp != nil {
		// The kubelet's half of graceful deletion: stop what runs, then remove the object.
		k.pods.forget(key)
		grace := int64(0)
		err := k.client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{
			GracePeriodSeconds: &grace,
			Preconditions:      &metav1.Preconditions{UID: &pod.UID},
		})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("finalize pod: %w", err)
		}
		return nil
	}
	entry, err := k.pods.ensure(pod)
	if err != nil {
		return err
	}
	if pod.Status.Phase == corev1.PodRunning && pod.Status.PodIP == entry.ip {
		return nil
	}
	return k.reportRunning(ctx, pod, entry)
}

func (k *kubelet) bind(ctx context.Context, pod *corev1.Pod) error {
	err := k.client.CoreV1().Pods(pod.Namespace).Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: k.node},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
		return fmt.Errorf("bind: %w", err)
	}
	return nil
}

func (k *kubelet) reportRunning(ctx context.Context, pod *corev1.Pod, entry *podEntry) error {
	now := metav1.NewTime(time.Now())
	started := true
	pod = pod.DeepCopy()
	conditions := []corev1.PodCondition{}
	for _, t := range []corev1.PodConditionType{corev1.PodScheduled, "PodReadyToStartContainers", corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		conditions = append(conditions, corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: now})
	}
	statuses := make([]corev1.ContainerStatus, 0, len(pod.Spec.Containers))
	for _, c := range pod.Spec.Containers {
		statuses = append(statuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: "", Ready: true, Started: &started,
			ContainerID: fmt.Sprintf("asb-test://%s-%s", pod.UID, c.Name),
			State:       corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		})
	}
	pod.Status = corev1.PodStatus{
		Phase:             corev1.PodRunning,
		Conditions:        conditions,
		HostIP:            "127.0.0.1",
		HostIPs:           []corev1.HostIP{{IP: "127.0.0.1"}},
		PodIP:             entry.ip,
		PodIPs:            []corev1.PodIP{{IP: entry.ip}},
		StartTime:         &now,
		ContainerStatuses: statuses,
		QOSClass:          corev1.PodQOSBestEffort,
	}
	if _, err := k.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("report running: %w", err)
	}
	return nil
}

package main

import (
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	corev1 "k8s.io/api/core/v1"
)

// podEntry is what this kubelet holds for one Pod it runs: a working directory, an IP, and the
// process groups of the execs running in it.
type podEntry struct {
	uid  string
	dir  string
	ip   string
	env  []string
	pgid map[int]struct{}
}

type podTable struct {
	root string
	ips  *ipPool
	mu   sync.Mutex
	pods map[string]*podEntry // namespace/name
}

func newPodTable(root string, ips *ipPool) *podTable {
	return &podTable{root: root, ips: ips, pods: map[string]*podEntry{}}
}

// ensure sets up the pod's directory (with its volume links) and IP once per pod uid.
func (t *podTable) ensure(pod *corev1.Pod) (*podEntry, error) {
	key := pod.Namespace + "/" + pod.Name
	t.mu.Lock()
	entry := t.pods[key]
	t.mu.Unlock()
	if entry != nil && entry.uid == string(pod.UID) {
		return entry, nil
	}
	if entry != nil {
		t.forget(key) // same name, new pod
	}
	dir := filepath.Join(t.root, "pods", pod.Namespace, pod.Name+"-"+string(pod.UID))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := t.linkVolumes(pod, dir); err != nil {
		return nil, err
	}
	ip, err := t.ips.allocate()
	if err != nil {
		return nil, err
	}
	entry = &podEntry{uid: string(pod.UID), dir: dir, ip: ip, env: podEnv(pod, dir), pgid: map[int]struct{}{}}
	t.mu.Lock()
	t.pods[key] = entry
	t.mu.Unlock()
	slog.Info("pod running", "pod", key, "ip", ip, "dir", dir)
	return entry, nil
}

// linkVolumes makes `<dir>/<mountPath>` a symlink to the volume's directory: a claim's directory
// is shared by every Pod that mounts the claim, in any pod generation; other volumes live in the
// pod directory and go with it.
func (t *podTable) linkVolumes(pod *corev1.Pod, dir string) error {
	if len(pod.Spec.Containers) == 0 {
		return nil
	}
	sources := map[string]string{}
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			sources[v.Name] = filepath.Join(t.root, "volumes", pod.Namespace, v.PersistentVolumeClaim.ClaimName)
		} else {
			sources[v.Name] = filepath.Join(dir, ".volumes", v.Name)
		}
	}
	for _, m := range pod.Spec.Containers[0].VolumeMounts {
		src, ok := sources[m.Name]
		if !ok {
			continue
		}
		if m.SubPath != "" {
			src = filepath.Join(src, filepath.Clean("/"+m.SubPath))
		}
		if err := os.MkdirAll(src, 0o777); err != nil {
			return err
		}
		link := filepath.Join(dir, filepath.Clean("/"+m.MountPath))
		if link == dir {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
			return err
		}
		if err := os.Symlink(src, link); err != nil && !os.IsExist(err) {
			return err
		}
	}
	return nil
}

func podEnv(pod *corev1.Pod, dir string) []string {
	env := []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=" + dir,
		"HOSTNAME=" + hostnameOf(pod),
		"LANG=C.UTF-8",
	}
	if len(pod.Spec.Containers) > 0 {
		for _, e := range pod.Spec.Containers[0].Env {
			if e.ValueFrom == nil {
				env = append(env, e.Name+"="+e.Value)
			}
		}
	}
	return env
}

func hostnameOf(pod *corev1.Pod) string {
	if pod.Spec.Hostname != "" {
		return pod.Spec.Hostname
	}
	return pod.Name
}

func (t *podTable) get(key string) *podEntry {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pods[key]
}

// track records an exec's process group so that deleting the pod ends it; the returned func
// forgets it again.
func (t *podTable) track(entry *podEntry, pgid int) func() {
	t.mu.Lock()
	entry.pgid[pgid] = struct{}{}
	t.mu.Unlock()
	return func() {
		t.mu.Lock()
		delete(entry.pgid, pgid)
		t.mu.Unlock()
	}
}

// forget ends every process of the pod, deletes its directory and frees its IP.
func (t *podTable) forget(key string) {
	t.mu.Lock()
	entry := t.pods[key]
	delete(t.pods, key)
	var groups []int
	if entry != nil {
		for pgid := range entry.pgid {
			groups = append(groups, pgid)
		}
	}
	t.mu.Unlock()
	if entry == nil {
		return
	}
	for _, pgid := range groups {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}
	if err := os.RemoveAll(entry.dir); err != nil {
		slog.Warn("cannot remove pod dir", "pod", key, "err", err)
	}
	t.ips.release(entry.ip)
	slog.Info("pod gone", "pod", key)
}

func (t *podTable) killAll() {
	t.mu.Lock()
	keys := make([]string, 0, len(t.pods))
	for key := range t.pods {
		keys = append(keys, key)
	}
	t.mu.Unlock()
	for _, key := range keys {
		t.forget(key)
	}
}

// ipPool hands out pod IPs from a range, lowest free first, skipping the network address and
// the first host (127.x.y.1 style addresses are often taken by other loopback users).
type ipPool struct {
	mu     sync.Mutex
	prefix netip.Prefix
	used   map[netip.Addr]bool
}

func newIPPool(cidr string) (*ipPool, error) {
	prefix, err := netip.ParsePrefix(cidr)
	if err != nil || !prefix.Addr().Is4() {
		return nil, fmt.Errorf("--pod-cidr %q: an IPv4 CIDR is required", cidr)
	}
	return &ipPool{prefix: prefix.Masked(), used: map[netip.Addr]bool{}}, nil
}

func (p *ipPool) allocate() (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for a := p.prefix.Addr().Next().Next(); p.prefix.Contains(a); a = a.Next() {
		if !p.used[a] && !strings.HasSuffix(a.String(), ".255") {
			p.used[a] = true
			return a.String(), nil
		}
	}
	return "", fmt.Errorf("pod CIDR %s is exhausted", p.prefix)
}

func (p *ipPool) release(ip string) {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return
	}
	p.mu.Lock()
	delete(p.used, a)
	p.mu.Unlock()
}

#!/usr/bin/env bash
# Builds the real Kubernetes node of the test tier (test/support/kube-node.ts runs it)
# with Go from the module proxy and gcc, into .tools/kube-node:
#   bin/  kubelet, kube-scheduler, kube-controller-manager, kube-proxy (k8s.io/kubernetes,
#         tools/kube/go.mod, the same module and version ldflags as scripts/kube-tools.sh's
#         kube-apiserver);
#         coredns, the cluster DNS (tools/coredns: CoreDNS's server with only the plugins the
#         node's Corefile uses; ~45 s);
#         containerd, containerd-shim-runc-v2, ctr v2.4.2 (tools/containerd/go.mod; tags
#         no_btrfs no_devmapper no_zfs: no cgo storage drivers, overlayfs only);
#         containerd-shim-runsc-v1, gVisor's shim for the gvisor RuntimeClass (tools/runsc-shim,
#         the same gvisor.dev/gvisor version as tools/runsc/go.mod's runsc);
#   cni/  the CNI plugins bridge, host-local, loopback v1.9.1 (tools/cni/go.mod; Debian's package
#         depends on iptables, which the kubelet would then fill with KUBE-* chains);
#   pause.tar  the pod sandbox image localhost/asb-pause:1, a static C program (tools/pause) in a
#         one-layer OCI archive that the node imports with ctr and pins.
# runc and runsc come from scripts/runc-build.sh and scripts/runsc-build.sh (make runc, make runsc).
# A stamp holds the hash of every input: a second run costs a few ms, a change rebuilds.
#
# Measured on this 2-core VM with another helper's builds and tests running (load 10-50), Go module
# cache and build cache warm from kube-tools: see BUILD_TIMES in the Makefile's kube-node comment.
# Usage: scripts/kube-node-build.sh   (make kube-node; make test runs it)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
# ASB_KUBE_NODE_DIR moves the output (a worktree whose .tools is shared with another checkout).
OUT="${ASB_KUBE_NODE_DIR:-$ROOT/.tools/kube-node}"
STAMP="$OUT/.stamp"

# shellcheck source=scripts/kube-go-env.sh
source scripts/kube-go-env.sh
CONTAINERD_VERSION="$(mod_version github.com/containerd/containerd/v2 tools/containerd/go.mod)"
CNI_VERSION="$(mod_version github.com/containernetworking/plugins tools/cni/go.mod)"
COREDNS_VERSION="$(mod_version github.com/coredns/coredns tools/coredns/go.mod)"
GVISOR_VERSION="$(mod_version gvisor.dev/gvisor tools/runsc/go.mod)"
if [[ "$(mod_version gvisor.dev/gvisor tools/runsc-shim/go.mod)" != "$GVISOR_VERSION" ]]; then
  echo "kube-node-build: tools/runsc-shim/go.mod and tools/runsc/go.mod pin different gvisor.dev/gvisor versions; the shim must match runsc" >&2
  exit 1
fi
CONTAINERD_TAGS="no_btrfs no_devmapper no_zfs"
# containerd's own Makefile stamps the version the same way.
containerd_ldflags="-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION -X github.com/containerd/containerd/v2/version.Package=github.com/containerd/containerd/v2"
inputs_hash() {
  { cat tools/kube/go.mod tools/kube/go.sum tools/containerd/go.mod tools/containerd/go.sum tools/cni/go.mod tools/cni/go.sum \
      tools/runsc-shim/go.mod tools/runsc-shim/go.sum tools/pause/pause.c tools/pause/oci-image.py \
      tools/coredns/go.mod tools/coredns/go.sum tools/coredns/main.go
    echo "$GOFLAGS $CGO_ENABLED $kube_ldflags $CONTAINERD_TAGS $containerd_ldflags shim-patch:oom-eperm"; } | sha256sum | cut -c1-16
}
want="kubernetes $KUBE_VERSION containerd $CONTAINERD_VERSION cni $CNI_VERSION coredns $COREDNS_VERSION gvisor $GVISOR_VERSION inputs $(inputs_hash)"
BINS=(kubelet kube-scheduler kube-controller-manager kube-proxy coredns containerd containerd-shim-runc-v2 ctr containerd-shim-runsc-v1)
all_present() {
  for b in "${BINS[@]}"; do [[ -x "$OUT/bin/$b" ]] || return 1; done
  for p in bridge host-local loopback; do [[ -x "$OUT/cni/$p" ]] || return 1; done
  [[ -f "$OUT/pause.tar" ]]
}
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]] && all_present; then exit 0; fi
mkdir -p "$OUT"
# Concurrent `make test` runs wait for one build instead of racing on the same files.
exec 9>"$OUT/.lock"
flock 9
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]] && all_present; then exit 0; fi

scripts/bootstrap.sh apt gcc:cc python3:python3
# The pause binary is static: glibc's libc.a (libc6-dev) has no command to prove it, gcc finds it.
[[ "$(gcc -print-file-name=libc.a)" == /* ]] || scripts/bootstrap.sh apt libc6-dev:no-such-command
GO="$(scripts/go-toolchain.sh)"
echo "kube-node-build: building kubelet, kube-scheduler, kube-controller-manager, kube-proxy $KUBE_VERSION, CoreDNS $COREDNS_VERSION, containerd $CONTAINERD_VERSION, CNI plugins $CNI_VERSION, gVisor's shim and the pause image with $("$GO" env GOVERSION) into ${OUT#"$ROOT"/} (first time: see the Makefile)" >&2
started=$SECONDS
TMP="$OUT/build.tmp"
rm -rf "$TMP"
mkdir -p "$TMP/bin" "$TMP/cni"
(cd tools/kube && "$GO" build -trimpath -ldflags="$kube_ldflags" -o "$TMP/bin/" \
  k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-proxy)
echo "kube-node-build: kubelet, kube-scheduler, kube-controller-manager, kube-proxy in $((SECONDS - started)) s" >&2
step=$SECONDS
(cd tools/coredns && "$GO" build -trimpath -ldflags="-s -w" -o "$TMP/bin/coredns" .)
echo "kube-node-build: CoreDNS in $((SECONDS - step)) s" >&2
step=$SECONDS
(cd tools/containerd && "$GO" build -trimpath -tags "$CONTAINERD_TAGS" -ldflags="$containerd_ldflags" -o "$TMP/bin/" \
  github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
  github.com/containerd/containerd/v2/cmd/ctr)
(cd tools/cni && "$GO" build -trimpath -ldflags="-s -w" -o "$TMP/cni/" github.com/containernetworking/plugins/plugins/main/bridge \
  github.com/containernetworking/plugins/plugins/ipam/host-local github.com/containernetworking/plugins/plugins/main/loopback)
# Static for the same reason as runsc (scripts/runsc-build.sh): the shim starts runsc, which
# re-executes itself inside an empty root.
# One line of gVisor's shim is changed, in a vendored copy made for the build (the go.mod pin
# stays; `go build -overlay` may not replace files of the module cache): at start the shim sets
# its own oom_score_adj to -999, and lowering oom_score_adj needs CAP_SYS_RESOURCE, which root on
# this VM lacks (real-node.md §3; containerd's restrict_oom_score_adj is the same fix for runc).
# Unpatched, the write fails and the shim refuses to start ("failed to set OOM Score on shim:
# write /proc/<pid>/oom_score_adj: permission denied"); patched, a permission error is ignored and
# the shim keeps the score it inherited. The line must match exactly once, or the build stops.
mkdir -p "$TMP/runsc-shim"
cp tools/runsc-shim/go.mod tools/runsc-shim/go.sum "$TMP/runsc-shim/"
(cd "$TMP/runsc-shim" && "$GO" mod vendor)
manager="$TMP/runsc-shim/vendor/gvisor.dev/gvisor/pkg/shim/v1/manager.go"
oom_line='if err := sys.SetOOMScore(cmd.Process.Pid, oomScoreMax); err != nil {'
if [[ "$(grep -cF "$oom_line" "$manager")" != 1 ]]; then
  echo "kube-node-build: gVisor's pkg/shim/v1/manager.go no longer has the oom_score_adj line the build patches; review tools/runsc-shim" >&2
  exit 1
fi
sed -i "s|$oom_line|if err := sys.SetOOMScore(cmd.Process.Pid, oomScoreMax); err != nil \&\& !os.IsPermission(err) {|" "$manager"
(cd "$TMP/runsc-shim" && "$GO" build -mod=vendor -trimpath -ldflags="-s -w" -o "$TMP/bin/containerd-shim-runsc-v1" gvisor.dev/gvisor/shim)
echo "kube-node-build: containerd, CNI plugins, gVisor's shim in $((SECONDS - step)) s" >&2
gcc -static -Os -s -o "$TMP/pause" tools/pause/pause.c
python3 tools/pause/oci-image.py "$TMP/pause" localhost/asb-pause:1 "$TMP/pause.tar"
rm -rf "$OUT/bin" "$OUT/cni"
mv "$TMP/bin" "$OUT/bin"
mv "$TMP/cni" "$OUT/cni"
mv "$TMP/pause.tar" "$OUT/pause.tar"
rm -rf "$TMP"
echo "$want" >"$STAMP"
echo "kube-node-build: built in $((SECONDS - started)) s" >&2

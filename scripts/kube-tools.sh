#!/usr/bin/env bash
# Builds the Kubernetes test tier's binaries with Go, from the Go module proxy and nothing else:
# kube-apiserver and kubectl from k8s.io/kubernetes (tools/kube/go.mod pins the release and its
# staging modules), etcd from go.etcd.io/etcd/server/v3 (tools/kube/etcd/go.mod). They land in
# .tools/kube/bin/. A stamp names the versions and the hash of the go.mod/go.sum files, so a
# second run costs a few milliseconds; changing either go.mod rebuilds.
#
# Measured on 2 busy cores: 4 min 44 s cold (empty ~/go/pkg/mod and ~/.cache/go-build: 740 MB of
# modules fetched, 3.1 GB of build cache written), 7 s with .tools/kube removed but the Go caches
# warm (links only), 13 ms when the stamp matches.
#
# Go 1.26 or newer comes from scripts/go-toolchain.sh: PATH, else fetched from the module proxy
# as the module golang.org/toolchain (what `GOTOOLCHAIN` does) into .tools/go.
# Usage: scripts/kube-tools.sh   (make kube-tools)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
OUT="$ROOT/.tools/kube"
STAMP="$OUT/.stamp"

# shellcheck source=scripts/kube-go-env.sh
source scripts/kube-go-env.sh
ETCD_VERSION="$(mod_version go.etcd.io/etcd/server/v3 tools/kube/etcd/go.mod)"
# The stamp covers what decides the binaries (go.mod, go.sum, flags), not this file's comments.
inputs_hash() { { cat tools/kube/go.mod tools/kube/go.sum tools/kube/etcd/go.mod tools/kube/etcd/go.sum; echo "$GOFLAGS $CGO_ENABLED $kube_ldflags"; } | sha256sum | cut -c1-16; }
want="kubernetes $KUBE_VERSION etcd $ETCD_VERSION inputs $(inputs_hash)"
bins_present() { [[ -x "$OUT/bin/kube-apiserver" && -x "$OUT/bin/kubectl" && -x "$OUT/bin/etcd" ]]; }
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]] && bins_present; then exit 0; fi

mkdir -p "$OUT"
# Concurrent `make test` runs wait for one build instead of racing on the same files.
exec 9>"$OUT/.lock"
flock 9
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]] && bins_present; then exit 0; fi

GO="$(scripts/go-toolchain.sh)"

echo "kube-tools: building kube-apiserver and kubectl $KUBE_VERSION, etcd $ETCD_VERSION with $("$GO" env GOVERSION) into .tools/kube/bin (first time ~5 min)" >&2
start=$SECONDS
rm -rf "$OUT/bin.tmp"
mkdir -p "$OUT/bin.tmp"
(cd tools/kube && "$GO" build -trimpath -ldflags="$kube_ldflags" -o "$OUT/bin.tmp/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl)
(cd tools/kube/etcd && "$GO" build -trimpath -ldflags="-s -w" -o "$OUT/bin.tmp/etcd" go.etcd.io/etcd/server/v3)
# Only these three are replaced: the test kubelet (scripts/go-build.sh) lives here too.
mkdir -p "$OUT/bin"
for bin in kube-apiserver kubectl etcd; do mv -f "$OUT/bin.tmp/$bin" "$OUT/bin/$bin"; done
rm -rf "$OUT/bin.tmp"
echo "$want" >"$STAMP"
echo "kube-tools: built in $((SECONDS - start)) s" >&2

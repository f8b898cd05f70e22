#!/usr/bin/env bash
# Builds the test kubelet (tools/kube/test-kubelet: a Go program that plays the kubelet for the
# Kubernetes test tier) into .tools/kube/bin/test-kubelet, with Go from the module proxy only.
# A stamp holds the hash of its sources, go.mod and go.sum: a second run costs a few ms, any
# change rebuilds: ~5-8 s after kube-tools (its client-go packages are in the shared Go build
# cache), 2 min with an empty build cache on 2 busy cores.
# Usage: scripts/kube-test-kubelet.sh   (make kube-tools runs it)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
SRC=tools/kube/test-kubelet
OUT="$ROOT/.tools/kube"
BIN="$OUT/bin/test-kubelet"
STAMP="$OUT/.test-kubelet.stamp"
export GOFLAGS="-mod=mod -buildvcs=false" GOTOOLCHAIN=local CGO_ENABLED=0

want="test-kubelet $(cat "$SRC"/go.mod "$SRC"/go.sum "$SRC"/*.go | sha256sum | cut -c1-16)"
if [[ -x "$BIN" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then exit 0; fi
mkdir -p "$OUT/bin"
exec 9>"$OUT/.test-kubelet.lock"
flock 9
if [[ -x "$BIN" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then exit 0; fi

GO="$(scripts/go-toolchain.sh)"
echo "kube-test-kubelet: building .tools/kube/bin/test-kubelet with $("$GO" env GOVERSION)" >&2
(cd "$SRC" && "$GO" build -trimpath -ldflags="-s -w" -o "$BIN.tmp" .)
mv "$BIN.tmp" "$BIN"
echo "$want" >"$STAMP"

#!/usr/bin/env bash
# Builds one of our Go programs (a directory under tools/ with its own go.mod) into a binary, with
# Go from the module proxy only (scripts/go-toolchain.sh). A stamp next to the binary holds the
# hash of the sources, go.mod and go.sum: a second run costs a few ms, any change rebuilds.
# The test kubelet takes ~5-8 s after kube-tools (its client-go packages are in the shared Go
# build cache), 2 min with an empty build cache on 2 busy cores; the bench's burst client
# (standard library only) takes about a second.
# Usage: scripts/go-build.sh <source dir> <binary>
#   make kube-tools: scripts/go-build.sh tools/kube/test-kubelet .tools/kube/bin/test-kubelet
#   make bench:      scripts/go-build.sh tools/bench/burst .tools/bench/bin/burst
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
SRC="${1:?usage: scripts/go-build.sh <source dir> <binary>}"
BIN="$ROOT/${2:?usage: scripts/go-build.sh <source dir> <binary>}"
NAME="$(basename "$BIN")"
STAMP="$(dirname "$BIN")/.$NAME.stamp"
export GOFLAGS="-mod=mod -buildvcs=false" GOTOOLCHAIN=local CGO_ENABLED=0

# go.sum only exists for a program with dependencies.
sources=("$SRC"/go.mod "$SRC"/*.go)
if [[ -f "$SRC/go.sum" ]]; then sources+=("$SRC/go.sum"); fi
want="$NAME $(cat "${sources[@]}" | sha256sum | cut -c1-16)"
if [[ -x "$BIN" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then exit 0; fi
mkdir -p "$(dirname "$BIN")"
exec 9>"$(dirname "$BIN")/.$NAME.lock"
flock 9
if [[ -x "$BIN" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then exit 0; fi

GO="$(scripts/go-toolchain.sh)"
echo "go-build: building ${BIN#"$ROOT"/} from $SRC with $("$GO" env GOVERSION)" >&2
(cd "$SRC" && "$GO" build -trimpath -ldflags="-s -w" -o "$BIN.tmp" .)
mv "$BIN.tmp" "$BIN"
echo "$want" >"$STAMP"

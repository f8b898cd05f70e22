#!/usr/bin/env bash
# Builds runc (the OCI runtime the local runtime drives) with Go from the module proxy:
# github.com/opencontainers/runc at the version tools/runc/go.mod pins, with cgo and the `seccomp`
# build tag against Debian's libseccomp-dev, into .tools/runc/bin/runc. A stamp holds the hash of
# go.mod, go.sum and the flags: a second run costs a few ms, a change rebuilds.
# Measured on 2 busy cores: see docs/images.md ("Images and the local registry").
# Usage: scripts/runc-build.sh   (make runc; make test runs it)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
# ASB_RUNC_DIR moves the output (a worktree whose .tools is shared with another checkout).
OUT="${ASB_RUNC_DIR:-$ROOT/.tools/runc}"
BIN="$OUT/bin/runc"
VERSION="$(awk '$1 == "github.com/opencontainers/runc" { print $2; exit }' tools/runc/go.mod)"
# -mod=mod: go.sum (committed) pins every module. GOTOOLCHAIN=local: never switch toolchains.
# cgo on: libseccomp is a C library. -X main.version: what `runc --version` prints (runc's
# Makefile sets it from its VERSION file, which a module build does not read).
export GOFLAGS="-mod=mod -buildvcs=false" GOTOOLCHAIN=local CGO_ENABLED=1
ldflags="-s -w -X main.version=${VERSION#v}"
want="runc $VERSION $({ cat tools/runc/go.mod tools/runc/go.sum; echo "$GOFLAGS $CGO_ENABLED seccomp $ldflags"; } | sha256sum | cut -c1-16)"
if [[ -x "$BIN" && -f "$OUT/.stamp" && "$(cat "$OUT/.stamp")" == "$want" ]]; then exit 0; fi
mkdir -p "$OUT/bin"
exec 9>"$OUT/.lock"
flock 9
if [[ -x "$BIN" && -f "$OUT/.stamp" && "$(cat "$OUT/.stamp")" == "$want" ]]; then exit 0; fi

# libseccomp-dev has no command to prove it: pkg-config is the proof.
scripts/bootstrap.sh apt pkg-config:pkg-config gcc:cc
pkg-config --exists libseccomp || scripts/bootstrap.sh apt libseccomp-dev:no-such-command
GO="$(scripts/go-toolchain.sh)"
echo "runc-build: building runc $VERSION (seccomp) with $("$GO" env GOVERSION) into ${OUT#"$ROOT"/}/bin (~30 s the first time)" >&2
started=$SECONDS
(cd tools/runc && "$GO" build -trimpath -tags seccomp -ldflags="$ldflags" -o "$BIN.tmp" github.com/opencontainers/runc)
mv "$BIN.tmp" "$BIN"
echo "$want" >"$OUT/.stamp"
echo "runc-build: built in $((SECONDS - started)) s" >&2

#!/usr/bin/env bash
# Builds gVisor's runsc (the OCI runtime for pods whose runtimeClassName is gvisor) with Go
# from the module proxy: gvisor.dev/gvisor at the version tools/runsc/go.mod pins, into
# .tools/runsc/bin/runsc. A stamp holds the hash of go.mod, go.sum and the flags: a second run
# costs a few ms, a change rebuilds. ~50 s the first time on 2 cores (~85 MB binary).
#
# CGO_ENABLED=0 is what makes it run at all: with gcc on the machine `go build` links cgo and the
# binary gets the ELF interpreter /lib64/ld-linux-x86-64.so.2. runsc's sandbox and gofer
# pivot_root into an empty tmpfs and then re-execute /proc/self/exe (the /proc umounter); the
# interpreter is not in that root, so execve fails with ENOENT and the sandbox dies with "error
# executing umounter: fork/exec /proc/self/exe: no such file or directory". gVisor's own release
# builds are static for the same reason.
# Usage: scripts/runsc-build.sh   (make runsc; make test runs it)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
# ASB_RUNSC_DIR moves the output (a worktree whose .tools is shared with another checkout).
OUT="${ASB_RUNSC_DIR:-$ROOT/.tools/runsc}"
BIN="$OUT/bin/runsc"
VERSION="$(awk '$1 == "gvisor.dev/gvisor" { print $2; exit }' tools/runsc/go.mod)"
# -mod=mod: go.sum (committed) pins every module. GOTOOLCHAIN=local: never switch toolchains.
# -X version.version: what `runsc --version` prints (Bazel stamps it; a module build does not).
export GOFLAGS="-mod=mod -buildvcs=false" GOTOOLCHAIN=local CGO_ENABLED=0
ldflags="-s -w -X gvisor.dev/gvisor/runsc/version.version=$VERSION"
want="runsc $VERSION $({ cat tools/runsc/go.mod tools/runsc/go.sum; echo "$GOFLAGS $CGO_ENABLED $ldflags"; } | sha256sum | cut -c1-16)"
if [[ -x "$BIN" && -f "$OUT/.stamp" && "$(cat "$OUT/.stamp")" == "$want" ]]; then exit 0; fi
mkdir -p "$OUT/bin"
exec 9>"$OUT/.lock"
flock 9
if [[ -x "$BIN" && -f "$OUT/.stamp" && "$(cat "$OUT/.stamp")" == "$want" ]]; then exit 0; fi

GO="$(scripts/go-toolchain.sh)"
echo "runsc-build: building runsc $VERSION (static) with $("$GO" env GOVERSION) into ${OUT#"$ROOT"/}/bin (~50 s the first time)" >&2
started=$SECONDS
(cd tools/runsc && "$GO" build -trimpath -ldflags="$ldflags" -o "$BIN.tmp" gvisor.dev/gvisor/runsc)
# A dynamic binary would build and then fail at the first sandbox (above): refuse it here instead.
if grep -qa '/lib64/ld-linux' <(head -c 4096 "$BIN.tmp"); then
  rm -f "$BIN.tmp"
  echo "runsc-build: the build is dynamically linked (it names an ELF interpreter); runsc needs CGO_ENABLED=0" >&2
  exit 1
fi
mv "$BIN.tmp" "$BIN"
echo "$want" >"$OUT/.stamp"
echo "runsc-build: built in $((SECONDS - started)) s" >&2

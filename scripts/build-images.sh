#!/usr/bin/env bash
# Builds the project's seed images from Debian packages into one OCI image layout, with the
# maintained tools Debian ships: mmdebstrap makes each root filesystem (packages from this
# machine's apt sources), umoci turns it into an OCI image. Nothing is downloaded but .debs.
# The local registry (src/images/registry-process.ts) is seeded from this layout by skopeo
# (src/images/seed.ts); a sandbox then pulls the images by their Docker names.
#
# Output under .tools/images/:
#   oci/        the OCI layout (index.json, blobs/sha256/...), one tag per image below
#   seed.json   which Docker references each tag is pushed as
#   .stamp      hash of this script (the recipe): a second run costs a few ms, any change rebuilds
#
# Images (Debian 12 "bookworm"; python:3.12 and alpine cannot be made from Debian packages):
#   busybox                       busybox-static and its applet links (~1 MB)
#   debian:12, debian:bookworm    mmdebstrap --variant=minbase, as Docker's debian image
#   python:3.11, agent-sandbox/base
#                                 one layer: minbase + bash, coreutils, python3, pip, venv, git,
#                                 curl, procps, ca-certificates, and user `user` (1000:1000,
#                                 /home/user). agent-sandbox/base runs as that user in /home/user
#                                 and idles (`sleep infinity`: a sandbox's main process must not exit);
#                                 python:3.11 runs as root like Docker's. Both share the layer.
# Cost measured on 2 busy cores: see docs/images.md ("Images and the local registry").
# Usage: scripts/build-images.sh   (make images; make test runs it)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
# ASB_IMAGES_DIR moves the output (a worktree whose .tools is shared with another checkout).
OUT="${ASB_IMAGES_DIR:-$ROOT/.tools/images}"
SUITE=bookworm
want="images $(sha256sum "$ROOT/scripts/build-images.sh" | cut -c1-16)"
if [[ -f "$OUT/.stamp" && "$(cat "$OUT/.stamp")" == "$want" && -f "$OUT/oci/index.json" ]]; then exit 0; fi
mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9
if [[ -f "$OUT/.stamp" && "$(cat "$OUT/.stamp")" == "$want" && -f "$OUT/oci/index.json" ]]; then exit 0; fi

started=$SECONDS
echo "build-images: building busybox, debian:12, python:3.11 and agent-sandbox/base from Debian packages into ${OUT#"$ROOT"/} (about a minute the first time)" >&2
WORK="$OUT/work"
rm -rf "$WORK" "$OUT/oci.new"
mkdir -p "$WORK/tmp"
export TMPDIR="$WORK/tmp"
# Fixed file times and image dates: the same packages give the same layer bytes.
export SOURCE_DATE_EPOCH=1700000000
CREATED="2023-11-14T22:13:20Z"
LAYOUT="$OUT/oci.new"
umoci init --layout "$LAYOUT"

# mmdebstrap runs apt in a chroot and writes a tar of the root filesystem.
# Docs and man pages are left out as Docker's slim images do (a third of the size).
# root mode as root (make test here); unshare mode (a user namespace) for anyone else.
MODE=root
[[ $(id -u) -eq 0 ]] || MODE=unshare
strap() { # variant tar extra-args...
  local variant="$1" tar="$2"; shift 2
  mmdebstrap --quiet --mode="$MODE" --variant="$variant" --format=tar \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    "$@" "$SUITE" "$tar"
}
image() { # tag tar cmd [config args...]
  local tag="$1" tar="$2" cmd="$3"; shift 3
  umoci new --image "$LAYOUT:$tag"
  umoci raw add-layer --image "$LAYOUT:$tag" --history.created "$CREATED" --history.created_by "scripts/build-images.sh $tag" "$tar"
  umoci config --image "$LAYOUT:$tag" --created "$CREATED" --author agent-sandbox --history.created "$CREATED" \
    --config.cmd "$cmd" --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"
}

# busybox: only unpack busybox-static (--variant=extract runs no maintainer scripts) and make
# the applet links, with the passwd and group files a shell expects. Extract hooks: the extract
# variant runs no customize hook.
strap extract "$WORK/busybox.tar" --include=busybox-static \
  --extract-hook='chroot "$1" /bin/busybox --install -s /bin' \
  --extract-hook='mkdir -p "$1/etc" "$1/tmp" "$1/root" "$1/home/user" && chmod 1777 "$1/tmp" && chown 1000:1000 "$1/home/user"' \
  --extract-hook='printf "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n" > "$1/etc/passwd"' \
  --extract-hook='printf "root:x:0:\nuser:x:1000:\nnogroup:x:65534:\n" > "$1/etc/group"' \
  --extract-hook='rm -rf "$1/usr/share/doc" "$1/var/lib/dpkg" "$1/var/cache" "$1/var/log"'
image busybox "$WORK/busybox.tar" /bin/sh

strap minbase "$WORK/debian.tar"
image debian "$WORK/debian.tar" bash

strap minbase "$WORK/base.tar" \
  --include=bash,coreutils,python3,python3-pip,python3-venv,git,curl,procps,ca-certificates \
  --customize-hook='chroot "$1" useradd --uid 1000 --user-group --create-home --shell /bin/bash user'
image python "$WORK/base.tar" python3
# The same layer again with its own configuration: a second manifest, no second layer blob.
umoci tag --image "$LAYOUT:python" base
umoci config --image "$LAYOUT:base" --created "$CREATED" --author agent-sandbox --history.created "$CREATED" \
  --config.cmd sleep --config.cmd infinity --config.user 1000:1000 --config.workingdir /home/user --config.env HOME=/home/user

cat >"$WORK/seed.json" <<'EOF'
{
  "busybox": ["docker.io/library/busybox:latest"],
  "debian": ["docker.io/library/debian:12", "docker.io/library/debian:bookworm"],
  "python": ["docker.io/library/python:3.11", "docker.io/library/python:3.11-bookworm"],
  "base": ["docker.io/agent-sandbox/base:latest"]
}
EOF
umoci gc --layout "$LAYOUT"
rm -rf "$OUT/oci"
mv "$LAYOUT" "$OUT/oci"
mv "$WORK/seed.json" "$OUT/seed.json"
rm -rf "$WORK"
echo "$want" >"$OUT/.stamp"
echo "build-images: done in $((SECONDS - started)) s; $(du -sh "$OUT/oci" | cut -f1) in ${OUT#"$ROOT"/}/oci" >&2

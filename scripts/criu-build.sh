#!/usr/bin/env bash
# Builds CRIU (what `runc checkpoint` and `runc restore` run to keep a runc pod's memory) from
# Debian trixie's source package into .tools/criu/bin/criu. Debian 12's own criu (3.17) cannot
# work on this kernel: kernel 6.13 split [vvar] into [vvar] and [vvar_vclock] and CRIU learnt that
# in 4.1 (docs/criu.md); trixie's 4.1.1 binary package needs libc6 >= 2.38 (bookworm has 2.36), so
# its source is built here against bookworm's libraries instead.
#
# The source comes from a private apt source list (a trixie deb-src line under .tools/criu/apt; the
# system's sources are not touched), pinned by the sha256 of Debian's orig tarball. Debian's .dsc and
# .debian.tar.xz answered 404 on 2026-11-28 and 2026-11-29 while the orig tarball downloaded, so the
# build uses the orig tarball alone, without Debian's patches (only packaging: CRIU's own sources are
# what runs). The build dependencies are the C libraries of Debian's Build-Depends, from bookworm by
# apt-get (its docs and python parts are not built).
#
# Our own patches (scripts/criu-patches/, applied in name order) fix what this CRIU gets wrong on the
# machine's kernel: sockets-passcred-eopnotsupp.patch, because Linux 6.16 answers EOPNOTSUPP to
# getsockopt(SO_PASSCRED / SO_PASSSEC) on TCP sockets and 4.1.1 then fails to dump any process with
# one ("sockets: Can't get 1:16 opt: Operation not supported"): every pod's init listens on TCP.
#
# A stamp holds the version, the tarball's sha256 and the hashes of this script and the patches: a
# second run costs a few ms, a change rebuilds. Cold on 2 cores: see the Makefile (`make criu`).
# Usage: scripts/criu-build.sh   (make criu)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
# ASB_CRIU_DIR moves the output (a worktree whose .tools is shared with another checkout).
OUT="${ASB_CRIU_DIR:-$ROOT/.tools/criu}"
BIN="$OUT/bin/criu"
VERSION=4.1.1
SUITE=trixie
ORIG="criu_$VERSION.orig.tar.xz"
ORIG_SHA256=f80a66cb3726bb2116266d4759ce3bcbfab7abdb6b6d430bf20dd41911717afe
# The C libraries of Debian's Build-Depends for criu 4.1.1-1 (asciidoc, xmlto and the python
# packages are for the man pages and pycriu, which are not built), plus make and gcc.
BUILD_DEPS=(libbsd-dev libcap-dev libgnutls28-dev libnet1-dev libnftables-dev libnl-3-dev
  libprotobuf-c-dev libprotobuf-dev pkg-config protobuf-c-compiler protobuf-compiler uuid-dev make gcc)
PATCHES=("$ROOT"/scripts/criu-patches/*.patch)
want="criu $VERSION $ORIG_SHA256 $(cat "$0" "${PATCHES[@]}" | sha256sum | cut -c1-16)"
if [[ -x "$BIN" && -f "$OUT/.stamp" && "$(cat "$OUT/.stamp")" == "$want" ]]; then exit 0; fi
mkdir -p "$OUT/bin"
exec 9>"$OUT/.lock"
flock 9
if [[ -x "$BIN" && -f "$OUT/.stamp" && "$(cat "$OUT/.stamp")" == "$want" ]]; then exit 0; fi
echo "criu-build: building CRIU $VERSION from Debian $SUITE's source into ${OUT#"$ROOT"/}/bin (~30 s the first time)" >&2
started=$SECONDS

# Libraries have no command to prove them: dpkg's status is the proof.
missing=()
for pkg in "${BUILD_DEPS[@]}"; do
  [[ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null)" == "install ok installed" ]] || missing+=("$pkg:no-such-command")
done
((${#missing[@]} == 0)) || scripts/bootstrap.sh apt "${missing[@]}"

src="$OUT/src"
mkdir -p "$src"
if [[ ! -f "$src/$ORIG" ]] || ! echo "$ORIG_SHA256  $src/$ORIG" | sha256sum --check --status; then
  apt="$OUT/apt"
  rm -rf "$apt"
  mkdir -p "$apt/lists/partial"
  # Signed by the trixie key that bookworm's debian-archive-keyring already ships.
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $SUITE main" >"$apt/sources.list"
  opts=(-o "Dir::Etc::sourcelist=$apt/sources.list" -o Dir::Etc::sourceparts=- -o "Dir::State::Lists=$apt/lists"
    -o APT::Sandbox::User=root -qq)
  apt-get "${opts[@]}" update
  # --download-only fails while the .dsc answers 404; the orig tarball's checksum decides.
  (cd "$src" && rm -f "$ORIG" && apt-get "${opts[@]}" source --download-only "criu=$VERSION-1" >"$apt/source.log" 2>&1) || true
  if [[ ! -f "$src/$ORIG" ]]; then
    echo "criu-build: apt-get source did not fetch $ORIG from Debian $SUITE:" >&2
    cat "$apt/source.log" >&2
    exit 1
  fi
  if ! echo "$ORIG_SHA256  $src/$ORIG" | sha256sum --check --status; then
    echo "criu-build: $ORIG has sha256 $(sha256sum "$src/$ORIG" | cut -d' ' -f1), not the pinned $ORIG_SHA256" >&2
    exit 1
  fi
fi

tree="$src/criu-$VERSION"
rm -rf "$tree"
tar -xJf "$src/$ORIG" -C "$src"
for p in "${PATCHES[@]}"; do
  patch -d "$tree" -p1 --quiet --forward <"$p" || { echo "criu-build: $p does not apply" >&2; exit 1; }
done
# Only the criu binary (not libcriu, plugins, crit or docs). Output quiet unless it fails.
if ! make -C "$tree" -j"$(nproc)" criu >"$src/build.log" 2>&1; then
  tail -40 "$src/build.log" >&2
  echo "criu-build: make failed (full log: ${src#"$ROOT"/}/build.log)" >&2
  exit 1
fi
install -m 0755 "$tree/criu/criu" "$BIN.tmp"
mv "$BIN.tmp" "$BIN"
rm -rf "$tree"
got="$("$BIN" --version | awk '/^Version:/ { print $2 }')"
if [[ "$got" != "$VERSION" ]]; then
  echo "criu-build: the built criu says version '$got', not $VERSION" >&2
  exit 1
fi
echo "$want" >"$OUT/.stamp"
echo "criu-build: built in $((SECONDS - started)) s" >&2

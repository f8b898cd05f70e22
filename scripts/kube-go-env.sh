# Sourced by scripts/kube-tools.sh and scripts/kube-node-build.sh, which build binaries of the same
# k8s.io/kubernetes module (tools/kube/go.mod): one definition of how a pinned version is read and
# of the Go flags and version ldflags, so the API server and the node's kubelet report one version.
# Sets KUBE_VERSION, kube_ldflags and exports GOFLAGS, GOTOOLCHAIN and CGO_ENABLED.

mod_version() { # module go.mod → the version that go.mod requires
  awk -v m="$1" '($1 == "require" && $2 == m) || ($1 == m && NF >= 2) { print ($1 == "require" ? $3 : $2); exit }' "$2"
}
KUBE_VERSION="$(mod_version k8s.io/kubernetes tools/kube/go.mod)"
# -mod=mod: no vendor directory; go.sum (committed) pins every module's hash. GOTOOLCHAIN=local:
# never switch toolchains behind our back. CGO off: static binaries. -trimpath and -s -w:
# smaller, path-free binaries; -X: the versions `kubectl version` and /version report.
export GOFLAGS="-mod=mod -buildvcs=false" GOTOOLCHAIN=local CGO_ENABLED=0
minor="${KUBE_VERSION#v1.}"; minor="${minor%%.*}"
kube_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kube_ldflags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done

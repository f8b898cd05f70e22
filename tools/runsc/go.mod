// Builds gVisor's runsc from the gvisor.dev/gvisor module (scripts/runsc-build.sh), static
// (CGO_ENABLED=0): runsc re-executes itself through /proc/self/exe after pivot_root into an empty
// root, where a cgo build's ELF interpreter /lib64/ld-linux-x86-64.so.2 is missing, and execve
// fails with ENOENT ("error executing umounter: fork/exec /proc/self/exe"). The version is the
// module proxy's @latest of the Go-buildable `go` branch on 2026-11-24; the requirements below are
// gVisor's own, pinned by go.sum.
module asb.local/tools/runsc

go 1.26.3

tool gvisor.dev/gvisor/runsc

require (
	github.com/cenkalti/backoff v2.2.1+incompatible // indirect
	github.com/cilium/ebpf v0.16.0 // indirect
	github.com/coreos/go-systemd/v22 v22.6.0 // indirect
	github.com/creack/pty v1.1.24 // indirect
	github.com/godbus/dbus/v5 v5.1.0 // indirect
	github.com/gofrs/flock v0.8.0 // indirect
	github.com/google/btree v1.1.2 // indirect
	github.com/google/subcommands v1.0.2-0.20190508160503-636abe8753b8 // indirect
	github.com/moby/sys/capability v0.4.0 // indirect
	github.com/mohae/deepcopy v0.0.0-20170308212314-bb9b5e7adda9 // indirect
	github.com/opencontainers/runtime-spec v1.2.1 // indirect
	github.com/vishvananda/netlink v1.3.1-0.20250303224720-0e7078ed04c8 // indirect
	github.com/vishvananda/netns v0.0.5 // indirect
	golang.org/x/exp v0.0.0-20250711185948-6ae5c78190dc // indirect
	golang.org/x/mod v0.34.0 // indirect
	golang.org/x/sync v0.20.0 // indirect
	golang.org/x/sys v0.43.0 // indirect
	golang.org/x/time v0.15.0 // indirect
	google.golang.org/protobuf v1.36.11 // indirect
	gopkg.in/check.v1 v1.0.0-20201130134442-10cb98267c6c // indirect
	gvisor.dev/gvisor v0.0.0-20260905035102-160fafc42237 // indirect
)

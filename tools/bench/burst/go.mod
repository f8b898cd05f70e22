// The benchmarks' burst client (see main.go): standard library only, built by
// scripts/go-build.sh (make bench-tools) into .tools/bench/bin.
module asb.local/tools/bench/burst

go 1.26.0

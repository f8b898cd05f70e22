# Two commands do everything on a fresh machine: `make up` and `make test`.
# Each installs what it needs on first use (Node 24 from the npm registry, npm dependencies,
# Debian packages) and is quick the second time (stamps under .tools/ and node_modules/).
SHELL := /bin/bash
export PATH := $(CURDIR)/.tools/node/bin:$(PATH)
NODE := $(CURDIR)/.tools/node/bin/node
# Debian packages as package:command pairs; the command proves the package is installed.
APT_RUNTIME := iproute2:ip util-linux:unshare util-linux:nsenter procps:ps gcc:cc
APT_TEST := prometheus:promtool

.PHONY: up test test-unit lint typecheck bench deps clean

deps:
	@scripts/bootstrap.sh deps
	@scripts/bootstrap.sh apt $(APT_RUNTIME)

up: deps
	@$(NODE) src/system/up.ts

test: deps
	@scripts/bootstrap.sh apt $(APT_TEST)
	@$(MAKE) --no-print-directory typecheck lint
	@$(NODE) --test --test-concurrency=1 --test-timeout=300000 $(TEST_FILES)

TEST_FILES ?= 'test/**/*.test.ts'

typecheck: deps
	@$(NODE) node_modules/.bin/tsc --noEmit -p .

lint: deps
	@$(NODE) node_modules/.bin/eslint --max-warnings 0 .

bench: deps
	@$(NODE) bench/run.ts

clean:
	rm -rf .asb node_modules .tools

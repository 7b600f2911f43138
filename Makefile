# poolerd developer tasks. `make` (or `make help`) lists them.
#
# `make test` is THE test command: CI (.ci/run) and the README both run it,
# so what passes here passes in CI.

SHELL := /bin/bash

GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
# Extra arguments for `make run`, appended to poolerd's command line,
# e.g. make run ARGS="--log-level debug".
ARGS    ?=
# Extra flags for `make bench` (go run ./test/bench -h lists them),
# e.g. make bench BENCH_ARGS="-quick" or BENCH_ARGS="-T 30 -rounds 5".
BENCH_ARGS ?=
# How long `make fuzz` runs each fuzz target. Empty (the default): a count
# of executions per target (fuzzBudget below), about 3 s each on an idle
# 2-core machine. A duration (make fuzz FUZZTIME=1m) runs every target that
# long; Go 1.26's coordinator can then report "context deadline exceeded"
# at the end of a busy run without a finding (Go issue 75804), which an
# execution count (FUZZTIME=50000x) cannot.
FUZZTIME ?=
# How long `make soak` runs its load, in minutes, e.g. make soak SOAK_MINUTES=60;
# SOAK_SEED picks another fault schedule.
SOAK_MINUTES ?= 10
SOAK_SEED ?= 1
# How long `make soak-transfers` runs the transfer stress test, e.g. SOAK_DURATION=1h.
SOAK_DURATION ?= 10m
# How many seconds `make test` gives the differential state fuzzer after its fixed seeds.
STATEFUZZ_DURATION ?= 20
# How many programs `make fuzz-state` runs (STATEFUZZ_SEED, if set, is the first seed).
STATEFUZZ_PROGRAMS ?= 100000
STATEFUZZ_SEED ?=

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@echo "poolerd $(VERSION)"
	@echo
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  make %-8s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## build bin/poolerd (version from git describe)
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/poolerd ./cmd/poolerd

.PHONY: test
test: ## what CI runs: go vet, gofmt check, go test -race (needs PostgreSQL, see .ci/run)
	$(GO) vet ./...
	@unformatted="$$(find . \( -path './.*' -o -path ./bin -o -name testdata \) -prune \
		-o -name '*.go' -print0 | xargs -0 -r gofmt -l)"; \
	if [ -n "$$unformatted" ]; then \
		echo "gofmt: these files are not formatted (run gofmt -w on them):"; \
		echo "$$unformatted"; \
		exit 1; \
	fi
	@# ./... includes TestStateFuzz, the differential state fuzzer, on its short budget.
	STATEFUZZ_DURATION=$(STATEFUZZ_DURATION) $(GO) test -race -count=1 -timeout 15m ./...
	@# The relay's integration tests again with a goroutine per connection (event_loops is auto by default).
	POOLERD_TEST_EVENT_LOOPS=off $(GO) test -race -count=1 -timeout 10m \
		-run 'TestTx|TestRelay|TestKeep|TestShutdown|TestAtomicity|TestLarge|TestProtocol|TestRate|TestTimeout|TestHandOver' ./test/integration/
	$(MAKE) --no-print-directory fuzz

# fuzzBudget: executions per fuzz target, sized so that each takes about
# 3 s on an idle 2-core machine (a session against a fake PostgreSQL is
# slower than a parser).
define fuzzBudget
case "$$name" in \
	FuzzSessionFrames) budget=1000x ;; \
	FuzzNegotiation) budget=2000x ;; \
	FuzzParseStartup|FuzzReadStartup) budget=10000x ;; \
	FuzzRoleDetection|FuzzCursor|FuzzErrorFields) budget=20000x ;; \
	FuzzScan) budget=40000x ;; \
	*) budget=60000x ;; \
esac; \
budget=$${FUZZTIME:-$$budget}
endef

# -fuzzminimizetime 0x: no minimizing of new inputs (nor of a failing one,
# which is written as found): on a loaded machine a worker died while
# minimizing a new, passing input of FuzzSessionFrames, which Go reports as
# a failure ("hung or terminated unexpectedly while minimizing").
.PHONY: fuzz
fuzz: ## run every Fuzz* target in the repository (an execution count each, or FUZZTIME); `make test` runs it
	@set -e; log=$$(mktemp); trap 'rm -f "$$log"' EXIT; \
	FUZZTIME='$(FUZZTIME)'; \
	for f in $$(grep -rl --include='*_test.go' '^func Fuzz' . | sort); do \
		dir=$$(dirname "$$f"); \
		for name in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$$f"); do \
			$(fuzzBudget); \
			echo "fuzz $$dir $$name ($$budget)"; \
			$(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $$budget -fuzzminimizetime 0x "$$dir" >"$$log" 2>&1 || \
				{ cat "$$log"; echo "fuzz: $$name in $$dir failed; the failing input is in $$dir/testdata/fuzz/$$name"; exit 1; }; \
		done; \
	done

.PHONY: fuzz-state
fuzz-state: ## the differential state fuzzer for STATEFUZZ_PROGRAMS programs (default 100000, hours; not in CI)
	STATEFUZZ_PROGRAMS=$(STATEFUZZ_PROGRAMS) STATEFUZZ_SEED=$(STATEFUZZ_SEED) STATEFUZZ_KEEP_GOING=1 \
		$(GO) test -count=1 -timeout 0 -run '^TestStateFuzz$$' -v ./test/integration/

.PHONY: bench
bench: ## poolerd vs PgBouncer vs direct PostgreSQL (~25 min, not in CI); writes docs/benchmarks-latest.md
	$(GO) run ./test/bench -out docs/benchmarks-latest.md $(BENCH_ARGS)

.PHONY: soak
soak: ## mixed load and chaos for SOAK_MINUTES (default 10, not in CI); writes docs/soak.md and docs/soak.svg
	SOAK_MINUTES=$(SOAK_MINUTES) SOAK_SEED=$(SOAK_SEED) SOAK_REPORT=$(CURDIR)/docs/soak.md \
		$(GO) test -count=1 -timeout 0 -run '^TestSoak$$' -v ./test/soak/

.PHONY: soak-transfers
soak-transfers: ## bank transfers under backend kills and PostgreSQL restarts for SOAK_DURATION (default 10m, not in CI)
	POOLERD_STRESS_DURATION=$(SOAK_DURATION) $(GO) test -race -count=1 -timeout 0 -run '^TestAtomicityStress$$' -v ./test/integration/

.PHONY: run
run: build ## start a throwaway PostgreSQL in .run/ and poolerd in front of it (Ctrl-C stops both)
	./scripts/run.sh $(ARGS)

.PHONY: clean
clean: ## stop the PostgreSQL of `make run` if running; remove bin/ and .run/
	./scripts/run.sh clean
	rm -rf bin .run

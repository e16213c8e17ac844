# tunwall — see README.md. Two set-up commands: `make demo` and `make test`.
GO      ?= go
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)

.PHONY: build demo test unit integration fuzz bench vet clean

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/tunwall ./cmd/tunwall

# The main job end to end in a self-made test world (needs root, or
# unprivileged user namespaces: it re-runs itself inside one).
demo: build
	$(GO) run ./internal/demo bin/tunwall

# Every test: unit tests, then the integration tests in the test world
# (root; CI runs them as root), then a short run of every fuzz target.
test: build vet
	$(GO) test -count=1 $$($(GO) list ./... | grep -v /integration)
	$(GO) test -count=1 -timeout 40m ./integration/
	$(MAKE) fuzz FUZZTIME=200000x

unit:
	$(GO) test -count=1 $$($(GO) list ./... | grep -v /integration)

integration: build
	$(GO) test -count=1 -v -timeout 40m ./integration/

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }

# Each fuzz target for FUZZTIME: a number of runs ("500000x"), or a duration
# ("30s"). Counts are the default: Go 1.26's fuzz coordinator can fail a
# duration-bounded run with "context deadline exceeded" and no crasher
# (golang/go#75804, fixed in Go 1.27).
FUZZTIME ?= 500000x
fuzz:
	@for pkg in $$($(GO) list ./... | grep -v /integration); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz'); do \
	    echo "fuzz $$pkg $$f"; \
	    $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 5s $$pkg || exit 1; \
	  done; \
	done

# Throughput, connection rate, latency, RSS and CPU of tunwall against the
# kernel path, slirp4netns and pasta, in one run, as one table.
bench: build
	$(GO) test -count=1 -run '^$$' -bench . -benchtime 1x -timeout 30m ./integration/bench/

clean:
	rm -rf bin

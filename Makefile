# tunwall — see README.md. Two set-up commands: `make demo` and `make test`.
GO      ?= go
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)

.PHONY: build install docs demo demo-test test unit integration integration-race cover fuzz bench vet clean

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/tunwall ./cmd/tunwall
	$(GO) build -trimpath -ldflags '-X main.buildVersion=$(VERSION)' -o bin/tunwall-cni ./cmd/tunwall-cni

# Copies bin/tunwall and bin/tunwall-cni to $(PREFIX)/bin (PREFIX=~/.local for
# your own). A CNI runtime looks for plugins in its own folder (containerd's
# bin_dir, /opt/cni/bin by default): link or copy tunwall-cni there, as
# deploy/kubernetes's init container does.
PREFIX ?= /usr/local
install: build
	install -D -m 0755 bin/tunwall $(DESTDIR)$(PREFIX)/bin/tunwall
	install -D -m 0755 bin/tunwall-cni $(DESTDIR)$(PREFIX)/bin/tunwall-cni

# docs/flags.md from the binary's --help (a unit test fails when they differ).
docs:
	TUNWALL_UPDATE_DOCS=1 $(GO) test -count=1 -run '^TestFlagsDocIsTheHelp$$' ./cmd/tunwall/

# The main job end to end in a self-made test world (as root, or rootless with
# unprivileged user namespaces: it re-runs itself inside one); exits 1 if a
# step did not turn out as it says.
demo: build
	$(GO) run ./cmd/tunwall-demo bin/tunwall

# The demo as root and as an unprivileged user (uid 65534, rootless: it
# builds its test world in a user namespace of its own; /dev/net/tun must be
# 0666), from one build in a folder that user can read. Each run fails if a
# step of the demo did not turn out as it says; its output is shown then.
demo-test: build
	@d=$$(mktemp -d) && trap 'rm -rf "$$d"' EXIT && chmod 0755 "$$d" && \
	$(GO) build -o "$$d/demo" ./cmd/tunwall-demo && cp bin/tunwall "$$d/tunwall" && cd "$$d" && \
	for who in root unprivileged; do \
	  if [ $$who = root ]; then run=""; else run="setpriv --reuid=65534 --regid=65534 --clear-groups"; fi; \
	  if $$run ./demo ./tunwall >"$$d/$$who.log" 2>&1; then echo "demo as $$who: $$(tail -n1 "$$d/$$who.log")"; \
	  else cat "$$d/$$who.log"; echo "demo as $$who: FAILED"; exit 1; fi; \
	done

UNIT_PKGS = $$($(GO) list ./... | grep -v /integration)

# The integration tests that also run against a tunwall built with -race:
# the data path (TCP/UDP over v4 and v6, refusals, signals, malformed
# packets, rootless), the policy tests, forwarded DNS, SOCKS and the L7
# gate. Load tests (256 MiB, 300 and 5000 connections, hold under load)
# stay out: a race build is several times slower.
RACE_IT = ^(TestTCPAndUDPOverIPv4AndIPv6|TestRefusedUpstreamIsRefusedInTheSandbox|TestDeniedDestinationsFailFastAndNeverArrive|TestExitCodeIsTheCommands|TestSignalsAreForwardedToTheCommand|TestSIGKILLOfTunwallLeavesNoNetworkAndNoProcess|TestRootlessRunAsAnUnprivilegedUser|TestMalformedPacketsAreDroppedAndCounted|TestAllowedNamesWorkOverHTTPAndHTTPSOnIPv4AndIPv6|TestNodeFetchIgnoresProxyVariablesAndObeysThePolicy|TestDeniedNamesGetNXDOMAINForEveryTypeAndNeverReachTheResolver|TestRawAddressesNeedACIDRRuleUnlessTheySendAnAllowedName|TestDigToAnyServerAddressIsAnsweredByTunwall|TestUDPGoesOnlyWhereAUDPRuleAllows|TestPingIsRefusedWithAnICMPError|TestAPortNotInTheRuleIsRefused|TestAWildcardAllowsSubdomainsButNotTheApexOrALookAlike|TestDNSRebindingToForbiddenAddressesIsNeverDialled|TestANameThatDisagreesWithTheConnectedNameIsDenied|TestSetupAndExecPhasesAllowDifferentNames|TestEachDenialIsOneImmediateLineOnStderr|TestForwardedQueriesAreRebuiltAndCarryNoClientChosenBits|TestSocksAppliesThePolicyAndAuditsByName|TestCredsRealClientsGetTheTokenTheSandboxNeverHeld|TestCredsEveryRequestOnAConnectionIsCheckedByName)$$

# Every test: unit tests with the race detector (printing each package's
# coverage), the integration tests in the test world (root; CI runs them as
# root), the set above against a -race tunwall, the demo as root and as an
# unprivileged user, then a short run of every fuzz target.
test: build vet
	$(GO) test -count=1 -race -cover $(UNIT_PKGS)
	$(GO) test -count=1 -timeout 40m ./integration/
	$(MAKE) integration-race
	$(MAKE) demo-test
	$(MAKE) fuzz FUZZTIME=200000x

unit:
	$(GO) test -count=1 -race $(UNIT_PKGS)

integration: build
	$(GO) test -count=1 -v -timeout 40m ./integration/

# RACE_IT against a tunwall built with -race; any race report fails it.
integration-race:
	TUNWALL_TEST_RACE=1 $(GO) test -count=1 -timeout 30m -run '$(RACE_IT)' ./integration/

# Per-package statement coverage of the unit tests.
cover:
	$(GO) test -count=1 -cover $(UNIT_PKGS)

# go vet, gofmt, and staticcheck at the version pinned in go.mod (a tool
# dependency: it runs offline once `go mod download` has fetched it).
vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) tool staticcheck ./...

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

# Throughput, connection rate, latency, memory and CPU of tunwall against the
# kernel path, sing-box (built into the user cache dir on the first run),
# the tinyproxy recipe, slirp4netns and pasta, in one run, as one table
# (TUNWALL_BENCH_PATHS selects columns); then 10,000
# and 20,000 concurrent TCP connections (kernel, tunwall --audit off,
# tunwall audited) as another. BENCH=ConcurrentTCP runs only the second.
BENCH ?= .
bench: build
	$(GO) test -count=1 -run '^$$' -bench '$(BENCH)' -benchtime 1x -timeout 60m ./integration/bench/

clean:
	rm -rf bin

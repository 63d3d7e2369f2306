# meshid — see README.md. `make run` and `make test` are the two commands a
# fresh machine needs.
GO       ?= go
BIN      := bin/meshid
AGENTBIN := bin/meshid-agent
STATE    ?= ./.meshid-dev
PKGS     := ./...

.PHONY: all build run test test-unit test-kube kube-binaries bench fuzz soak lint fmt clean softhsm

all: build

## build: the full CLI (bin/meshid) and the lean sidecar agent (bin/meshid-agent),
## stamped from git with the version, commit and build date that
## `meshid version` and meshid_build_info show.
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null)
COMMIT   ?= $(shell git rev-parse HEAD 2>/dev/null)
DATE     ?= $(shell date -u +%Y-%m-%dT%H:%M:%SZ)
BUILDPKG := github.com/meshid/meshid/internal/buildinfo
LDFLAGS  := -X $(BUILDPKG).version=$(VERSION) -X $(BUILDPKG).commit=$(COMMIT) -X $(BUILDPKG).date=$(DATE)
build:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/meshid
	$(GO) build -ldflags '$(LDFLAGS)' -o $(AGENTBIN) ./cmd/meshid-agent

## run: the CA and the agent together on the embedded default (no cluster).
run: build
	$(BIN) dev --state-dir $(STATE)

## test: every suite, including the real kube-apiserver suite.
test: lint test-unit test-kube

## test-unit: the main module's unit, integration and end-to-end tests.
test-unit:
	$(GO) test -count=1 $(PKGS)

## softhsm: install SoftHSM2 (Debian package softhsm2), the PKCS#11 module
## the ca/keystore/pkcs11 tests run against. Needs root (or sudo) and apt.
## Without it those tests skip locally and fail under CI=true.
softhsm:
	@if command -v softhsm2-util >/dev/null 2>&1; then echo "softhsm2 already installed"; \
	else SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); $$SUDO apt-get update && $$SUDO apt-get install -y softhsm2; fi

## kube-binaries: build kube-apiserver (and etcd) once into ~/.cache/meshid/kube-bin (shared by every clone).
kube-binaries:
	bash test/kube/hack/build-binaries.sh

## test-kube: the suite against a real etcd + kube-apiserver.
test-kube: kube-binaries
	cd test/kube && GOFLAGS=-mod=mod $(GO) test -count=1 -timeout 30m ./...

## bench: Go benchmarks and a short load run against `meshid dev`, with the
## load tool bin/meshid-bench (not a production binary: it links the charts).
bench: build
	$(GO) build -o bin/meshid-bench ./cmd/meshid-bench
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)
	BIN=$(BIN) BENCHBIN=bin/meshid-bench bash scripts/bench.sh

## fuzz: every fuzz target below for FUZZTIME each (`make test` runs only
## their seed corpora). An input that fails is saved under the package's
## testdata/fuzz/<target>/: commit it as a regression test.
FUZZTIME  ?= 60s
FUZZFLAGS ?=
FUZZ_TARGETS := \
	./ca:FuzzParseAndCheckCSR \
	./ca/authn:FuzzJWTToken \
	./ca/authn:FuzzJWTClaims \
	./ca/authn:FuzzParseJWKS \
	./ca/keystore:FuzzLoadDir \
	./sds:FuzzDiscoveryRequest \
	./internal/inspect:FuzzParsePEM
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t##*:}; \
		echo "== $$fn ($$pkg) for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) $(FUZZFLAGS) $$pkg; \
	done

## soak: `meshid dev` under steady CSR and SDS load for SOAK_DURATION, its
## RSS and goroutines sampled every 10s; fails unless they stay flat (see
## scripts/soak.sh for the knobs). Not part of `make test`.
SOAK_DURATION ?= 10m
soak: build
	BIN=$(BIN) SOAK_DURATION=$(SOAK_DURATION) bash scripts/soak.sh

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	@if [ -f test/kube/go.mod ]; then cd test/kube && GOFLAGS=-mod=mod $(GO) vet ./...; fi

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf bin $(STATE)

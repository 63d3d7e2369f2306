# meshid — see README.md. `make run` and `make test` are the two commands a
# fresh machine needs.
GO       ?= go
BIN      := bin/meshid
AGENTBIN := bin/meshid-agent
STATE    ?= ./.meshid-dev
PKGS     := ./...

.PHONY: all build run test test-unit test-kube kube-binaries bench lint fmt clean

all: build

## build: the full CLI (bin/meshid) and the lean sidecar agent (bin/meshid-agent).
build:
	$(GO) build -o $(BIN) ./cmd/meshid
	$(GO) build -o $(AGENTBIN) ./cmd/meshid-agent

## run: the CA and the agent together on the embedded default (no cluster).
run: build
	$(BIN) dev --state-dir $(STATE)

## test: every suite, including the real kube-apiserver suite.
test: lint test-unit test-kube

## test-unit: the main module's unit, integration and end-to-end tests.
test-unit:
	$(GO) test -count=1 $(PKGS)

## kube-binaries: build kube-apiserver (and etcd) once into test/kube/.cache.
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

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	@if [ -f test/kube/go.mod ]; then cd test/kube && GOFLAGS=-mod=mod $(GO) vet ./...; fi

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf bin $(STATE)

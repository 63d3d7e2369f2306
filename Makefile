# meshid — see README.md. `make run` and `make test` are the two commands a
# fresh machine needs.
GO       ?= go
BIN      := bin/meshid
AGENTBIN := bin/meshid-agent
STATE    ?= ./.meshid-dev
PKGS     := ./...

.PHONY: all build bench-binary softhsm-check run test test-unit test-kube test-node test-image test-observability test-spire kube-binaries helm-binary cfssl-binary step-ca-binary spire-binary bench fuzz soak mutate lint fmt clean softhsm image image-context

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
	@echo "go build: bin/meshid and bin/meshid-agent (the first build on a machine downloads and compiles every dependency: several minutes; -v lists packages as they compile; later builds take seconds)"
	$(GO) build -v -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/meshid
	$(GO) build -ldflags '$(LDFLAGS)' -o $(AGENTBIN) ./cmd/meshid-agent

## run: the CA and the agent together on the embedded default (no cluster).
run: build
	$(BIN) dev --state-dir $(STATE)

## test: every suite, including the real kube-apiserver suite and the
## container images on a real Docker engine (.ci/run installs and starts one;
## without Docker, run `make test-unit`).
## test-spire comes after the node suite: on a cold machine SPIRE is the last
## binary .ci/run builds in the background, and the node suite's wait for
## the kubelet's certificate refresh (10 minutes and more, mostly idle)
## leaves it the CPU.
test: lint test-unit test-observability test-kube test-node test-spire test-image

## test-unit: the main module's unit, integration and end-to-end tests,
## and the version-skew suite (test/skew: the previous release's binaries,
## built from the commit CHANGELOG.md names and cached under
## ~/.cache/meshid/skew/, against the current ones; needs the git history)
## (the upstream-CA tests serve the real cfssl and step-ca: cfssl-binary,
## step-ca-binary; the PKCS#11
## tests need SoftHSM2: softhsm-check). SOFTHSM=skip runs without the
## PKCS#11 tests, and says so.
SOFTHSM ?= require
test-unit: softhsm-check cfssl-binary step-ca-binary
	MESHID_REQUIRE_SOFTHSM=$(if $(filter skip,$(SOFTHSM)),0,1) $(GO) test -count=1 $(PKGS)

## softhsm-check: fail, saying how to install it, when SoftHSM2 is missing;
## the PKCS#11 tests never silently skip under make.
softhsm-check:
	@if [ "$(SOFTHSM)" = skip ]; then echo "SOFTHSM=skip: the ca/keystore/pkcs11 tests (CA key in a PKCS#11 module) will SKIP"; \
	elif ! command -v softhsm2-util >/dev/null 2>&1; then \
		echo "SoftHSM2 is missing: the ca/keystore/pkcs11 tests need it. Install it with \`make softhsm\` (apt-get install softhsm2; root or sudo),"; \
		echo "or run without those tests: \`make test-unit SOFTHSM=skip\`."; exit 1; fi

## softhsm: install SoftHSM2 (Debian package softhsm2), the PKCS#11 module
## the ca/keystore/pkcs11 tests run against. Needs root (or sudo) and apt.
## Without it those tests skip locally and fail under CI=true.
softhsm:
	@if command -v softhsm2-util >/dev/null 2>&1; then echo "softhsm2 already installed"; \
	else SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); $$SUDO apt-get update && $$SUDO apt-get install -y softhsm2; fi

## image: the container images $(MESHID_IMAGE) (the CA and the tools) and
## $(AGENT_IMAGE) (the lean agent), FROM scratch (deploy/image/Dockerfile).
## The binaries are built here with the Go toolchain, static (CGO_ENABLED=0:
## no PKCS#11 signer, which needs cgo), so no base image is pulled. Push:
##   make image IMAGE_PREFIX=registry.example.com/mesh/ IMAGE_TAG=v1
##   docker push registry.example.com/mesh/meshid:v1 (and meshid-agent:v1)
IMAGE_PREFIX ?=
IMAGE_TAG    ?= latest
MESHID_IMAGE  = $(IMAGE_PREFIX)meshid:$(IMAGE_TAG)
AGENT_IMAGE   = $(IMAGE_PREFIX)meshid-agent:$(IMAGE_TAG)
DOCKER       ?= docker
# The CA certificates copied into the images (Debian/Ubuntu's bundle; on
# Fedora/RHEL: /etc/pki/tls/certs/ca-bundle.crt).
CA_BUNDLE    ?= /etc/ssl/certs/ca-certificates.crt
IMAGE_DIR    := bin/image
# OCI annotations from git (recursive: evaluated only by the image targets).
IMAGE_VERSION  = $(shell git describe --tags --always --dirty 2>/dev/null || echo unknown)
IMAGE_REVISION = $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
IMAGE_CREATED  = $(shell date -u +%Y-%m-%dT%H:%M:%SZ)
image: image-context
	$(DOCKER) build -f deploy/image/Dockerfile --target meshid -t $(MESHID_IMAGE) \
		--build-arg VERSION=$(IMAGE_VERSION) --build-arg REVISION=$(IMAGE_REVISION) --build-arg CREATED=$(IMAGE_CREATED) .
	$(DOCKER) build -f deploy/image/Dockerfile --target agent -t $(AGENT_IMAGE) \
		--build-arg VERSION=$(IMAGE_VERSION) --build-arg REVISION=$(IMAGE_REVISION) --build-arg CREATED=$(IMAGE_CREATED) .
	@$(DOCKER) image ls --filter reference=$(MESHID_IMAGE) --filter reference=$(AGENT_IMAGE) --format 'table {{.Repository}}:{{.Tag}}\t{{.ID}}\t{{.Size}}'

## image-context: the images' build context, $(IMAGE_DIR)/ (no Docker needed):
## the static binaries and the root filesystem (passwd, group, nsswitch.conf,
## CA certificates, /tmp 1777, the nonroot home).
image-context:
	@test -r $(CA_BUNDLE) || { echo "CA_BUNDLE=$(CA_BUNDLE) is not readable: set CA_BUNDLE to the host's PEM bundle"; exit 1; }
	rm -rf $(IMAGE_DIR)
	mkdir -p $(IMAGE_DIR)/rootfs/etc/ssl/certs $(IMAGE_DIR)/rootfs/tmp $(IMAGE_DIR)/rootfs/home $(IMAGE_DIR)/home/nonroot
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o $(IMAGE_DIR)/ ./cmd/meshid ./cmd/meshid-agent
	install -m 0644 deploy/image/passwd deploy/image/group deploy/image/nsswitch.conf $(IMAGE_DIR)/rootfs/etc/
	install -m 0644 $(CA_BUNDLE) $(IMAGE_DIR)/rootfs/etc/ssl/certs/ca-certificates.crt
	chmod 0755 $(IMAGE_DIR)/rootfs $(IMAGE_DIR)/rootfs/etc $(IMAGE_DIR)/rootfs/etc/ssl $(IMAGE_DIR)/rootfs/etc/ssl/certs $(IMAGE_DIR)/rootfs/home $(IMAGE_DIR)/home
	chmod 1777 $(IMAGE_DIR)/rootfs/tmp
	chmod 0700 $(IMAGE_DIR)/home/nonroot

## test-image: build the images under a tag of their own and test them on the
## real Docker engine (test/image): run as 65532 hardened, `meshid dev` in a
## container reached from the host, the agent image against it, the build
## context, the sizes. The test removes the images and its containers. Under
## CI=true it fails when Docker is missing (.ci/run installs and starts it).
TEST_IMAGE_TAG ?= test-$(shell date +%s)-$(shell od -An -N3 -tx1 /dev/urandom | tr -d ' ')
test-image:
	@if ! $(DOCKER) info >/dev/null 2>&1; then \
		if [ "$${CI:-}" = true ]; then echo "test-image: no Docker engine answers (docker info); .ci/run starts one"; exit 1; fi; \
		echo "test-image: skipped, no Docker engine answers (docker info)"; exit 0; fi; \
	tag=$(TEST_IMAGE_TAG); \
	$(MAKE) --no-print-directory image IMAGE_PREFIX=meshid-test/ IMAGE_TAG=$$tag && \
	cd test/image && MESHID_IMAGE=meshid-test/meshid:$$tag MESHID_AGENT_IMAGE=meshid-test/meshid-agent:$$tag \
		MESHID_IMAGE_BIN=$(CURDIR)/$(IMAGE_DIR) MESHID_IMAGE_REMOVE=1 \
		$(GO) test -tags image -count=1 -timeout 15m -v ./...

## test-observability: the alerts and the Grafana dashboard (deploy/observability)
## parsed and evaluated by Prometheus's own rulefmt and PromQL engine against
## /metrics of a real CA and agents. A module of its own (test/observability),
## so github.com/prometheus/prometheus stays out of meshid's go.mod and binaries.
test-observability:
	cd test/observability && $(GO) test -count=1 ./...

## spire-binary: build the real SPIRE server and agent (github.com/spiffe/spire
## v1.13.3, pinned with every dependency in test/spire/tools/go.mod and go.sum)
## once into ~/.cache/meshid/spire-bin, stamp-checked and flock-protected like
## kube-binaries. A cold build is about 1,000 CPU-seconds.
spire-binary:
	bash scripts/build-spire.sh >/dev/null

## test-spire: meshid federated with a real SPIRE (test/spire, a module of its
## own): spire-server and spire-agent on loopback, bundles exchanged both ways
## over https_spiffe, a SPIRE-issued and a meshid-issued SVID in mTLS.
test-spire: spire-binary
	cd test/spire && $(GO) test -count=1 -timeout 10m ./...

## kube-binaries: build kube-apiserver, etcd and the node's binaries (kubelet, kube-controller-manager, kube-scheduler, kube-proxy) once into ~/.cache/meshid/kube-bin (shared by every clone).
kube-binaries:
	bash test/kube/hack/build-binaries.sh

## cfssl-binary: build the real cfssl (github.com/cloudflare/cfssl/cmd/cfssl at
## the version go.mod pins) once into ~/.cache/meshid/cfssl-bin, stamp-checked
## and flock-protected like kube-binaries; the ca/upstream tests run it as
## `cfssl serve` (and build it themselves if it is missing).
cfssl-binary:
	bash scripts/build-cfssl.sh >/dev/null

## step-ca-binary: build the real step-ca (github.com/smallstep/certificates
## at the version scripts/step-ca/go.mod pins, with its own go.sum) once into
## ~/.cache/meshid/step-ca-bin, stamp-checked and flock-protected; the
## ca/upstream/step and ca/caserver tests run it (and build it themselves if it
## is missing). About 9 minutes cold on 2 cores.
step-ca-binary:
	bash scripts/build-step-ca.sh >/dev/null

## helm-binary: build the Helm CLI (helm.sh/helm/v4, pinned in
## test/kube/tools/helm/go.mod) once into the same cache, for the chart tests
## (deploy/charts/meshid: lint, template, install/upgrade/uninstall on the
## real API server). Stamp-checked like kube-binaries.
helm-binary:
	bash test/kube/hack/build-helm.sh

## test-kube: the suite against a real etcd + kube-apiserver (and the chart
## through the real helm).
test-kube: kube-binaries helm-binary
	cd test/kube && GOFLAGS=-mod=mod $(GO) test -count=1 -timeout 30m $$(GOFLAGS=-mod=mod $(GO) list ./... | grep -v -e '/test/kube/node$$' -e '/test/kube/node/')

## test-node: the node suite (test/kube/node): a real node (containerd,
## kubelet, kube-controller-manager, kube-scheduler, kube-proxy, CNI bridge)
## beside the real API server. Needs root and Debian's containerd, runc,
## containernetworking-plugins and iptables (.ci/run installs them); it
## fails, with the reason, where it cannot run. One node per machine: the
## suite waits for /run/lock/meshid-node.lock.
test-node: kube-binaries helm-binary
	cd test/kube && GOFLAGS=-mod=mod $(GO) test -count=1 -timeout 30m -v ./node/...

## bench-binary: only the load tool, bin/meshid-bench (`meshid-bench ca`,
## `meshid-bench sds`: docs/benchmarks.md). Not a production binary: it
## links the charts, so it is not a subcommand of meshid.
bench-binary:
	$(GO) build -o bin/meshid-bench ./cmd/meshid-bench

## bench: Go benchmarks and a short load run against `meshid dev`, with the
## load tool bin/meshid-bench.
bench: build bench-binary
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
	./sds/sdsserver:FuzzDiscoveryRequest \
	./inspect:FuzzParsePEM
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

## mutate: mutation testing with gremlins, one package at a time (not part
## of `make test`: hours of CPU). Each mutant of a package's own files (files
## in subdirectories are excluded: they are packages of their own) is tested
## with `go test` of that package, one at a time (--workers 1: the machine is
## shared), and counts as timed out after --timeout-coefficient times the
## package's plain coverage run. The score (killed / (killed + lived)) and the
## survivors judged are in docs/testing.md. gremlins is installed once into
## $(GOPATH)/bin/gremlins-$(GREMLINS_VERSION), outside the repo.
## Narrow it to a package, or to some of its files (excluded by regexp,
## relative to the package; $$ is make's $):
##   make mutate MUTATE_PKGS=ca MUTATE_FLAGS='-E "^(csr|policy)\.go$$"'
## gremlins first runs `go test -cover ./<pkg>/...`; scripts/gremlins/go,
## first in its PATH, makes that `./<pkg>`, the package alone (subpackages'
## tests cannot kill its mutants; for ca they cost minutes and SoftHSM2).
## That run's time, times 3, is each mutant's timeout (-count=1 in GOFLAGS:
## a cached coverage run would make that timeout shorter than a build;
## -vet=off: vet on every mutant costs time and kills none; -ldflags=-w: no
## DWARF, a shorter link per mutant; -trimpath: builds in gremlins' copy of the
## module are build-cache hits, not a rebuild of every package at a new path).
GREMLINS_VERSION ?= v0.6.0
GREMLINS_DIR     := $(shell $(GO) env GOPATH)/bin/gremlins-$(GREMLINS_VERSION)
GREMLINS         := $(GREMLINS_DIR)/gremlins
MUTATE_PKGS      ?= sds/caclient sds/agent ca/caserver ca ca/certservice ca/authn sds/secretcache
MUTATE_FLAGS     ?=
MUTATE_OUT       ?= $(or $(TMPDIR),/tmp)/meshid-mutate
mutate:
	@test -x $(GREMLINS) || GOBIN=$(GREMLINS_DIR) $(GO) install github.com/go-gremlins/gremlins/cmd/gremlins@$(GREMLINS_VERSION)
	@mkdir -p $(MUTATE_OUT)
	@set -e; for p in $(MUTATE_PKGS); do \
		echo "== gremlins $$p"; \
		GOFLAGS="$$GOFLAGS -count=1 -vet=off -ldflags=-w -trimpath" MESHID_REAL_GO="$$(command -v $(GO))" PATH="$(CURDIR)/scripts/gremlins:$$PATH" \
			nice -n 10 $(GREMLINS) unleash --workers 1 --timeout-coefficient 3 \
			--exclude-files / $(MUTATE_FLAGS) \
			--output $(MUTATE_OUT)/$$(echo $$p | tr / _).json ./$$p; \
	done

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) vet -tags image ./test/image/
	@if [ -f test/kube/go.mod ]; then cd test/kube && GOFLAGS=-mod=mod $(GO) vet ./...; fi
	cd test/observability && $(GO) vet ./...
	cd test/spire && $(GO) vet ./...

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf bin $(STATE)

#!/usr/bin/env bash
# Builds the real step-ca (github.com/smallstep/certificates/cmd/step-ca at the
# version scripts/step-ca/go.mod pins, with that module's go.sum: neither
# meshid's dependencies nor step-ca's change the other) that the upstream-CA
# tests run, into a per-user cache (~/.cache/meshid/step-ca-bin, or
# $STEP_CA_BIN_DIR) shared by every clone on the machine. A stamp of the inputs
# (go version, scripts/step-ca/go.mod and go.sum, this script) is kept next to
# the binary; when it matches, nothing is rebuilt. The first build is long
# (step-ca links every cloud KMS client: see docs/upstream.md for the time it
# took on 2 cores). Safe to run concurrently (flock). Prints the binary's path
# on its last line.
#
# Usage: bash scripts/build-step-ca.sh   (from anywhere)
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${STEP_CA_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/meshid/step-ca-bin}"
mkdir -p "$bin"

exec 9>"$bin/.lock"
if command -v flock >/dev/null; then flock 9; fi

cd scripts/step-ca
stamp="$( { go version; cat go.mod go.sum ../build-step-ca.sh; } | sha256sum | cut -d' ' -f1)"
if [[ -x "$bin/step-ca" && -f "$bin/.stamp" && "$(cat "$bin/.stamp")" == "$stamp" ]]; then
	echo "build-step-ca: up to date" >&2
	echo "$bin/step-ca"
	exit 0
fi
rm -f "$bin/.stamp"
start=$(date +%s)
version="$(go list -m -f '{{.Version}}' github.com/smallstep/certificates)"
echo "build-step-ca: building step-ca $version into $bin (the first build is long)" >&2
# Pure Go (no PC/SC for YubiKeys, which the tests do not use), stripped: the
# tests never debug it and the link is faster. The version is stamped as
# step-ca's release build does, so that `step-ca version` tells what runs.
CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" go build -trimpath \
	-ldflags="-s -w -X main.Version=$version" \
	-o "$bin/step-ca.new" github.com/smallstep/certificates/cmd/step-ca
mv -f "$bin/step-ca.new" "$bin/step-ca"
echo "$stamp" >"$bin/.stamp"
echo "build-step-ca: done in $(( $(date +%s) - start ))s" >&2
echo "$bin/step-ca"

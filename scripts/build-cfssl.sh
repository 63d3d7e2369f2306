#!/usr/bin/env bash
# Builds the real cfssl binary (github.com/cloudflare/cfssl/cmd/cfssl at the
# version go.mod pins) that the upstream-CA tests run as `cfssl serve`, into a
# per-user cache (~/.cache/meshid/cfssl-bin, or $CFSSL_BIN_DIR) shared by every
# clone on the machine. A stamp of the inputs (go version, the cfssl version,
# this script) is kept next to the binary; when it matches, nothing is rebuilt.
# The first build takes a few minutes on 2 cores. Safe to run concurrently
# (flock). Prints the binary's path on its last line.
#
# Usage: bash scripts/build-cfssl.sh   (from anywhere)
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${CFSSL_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/meshid/cfssl-bin}"
mkdir -p "$bin"

exec 9>"$bin/.lock"
if command -v flock >/dev/null; then flock 9; fi

version="$(go list -m -f '{{.Version}}' github.com/cloudflare/cfssl)"
stamp="$( { go version; echo "$version"; cat scripts/build-cfssl.sh; } | sha256sum | cut -d' ' -f1)"
if [[ -x "$bin/cfssl" && -f "$bin/.stamp" && "$(cat "$bin/.stamp")" == "$stamp" ]]; then
	echo "build-cfssl: up to date" >&2
	echo "$bin/cfssl"
	exit 0
fi
rm -f "$bin/.stamp"
start=$(date +%s)
echo "build-cfssl: building cfssl $version into $bin (the first build takes a few minutes)" >&2
# go install PKG@VERSION builds cfssl's own module with its own go.sum: meshid's
# dependencies do not change what is built.
GOBIN="$bin" GOFLAGS=-buildvcs=false go install "github.com/cloudflare/cfssl/cmd/cfssl@$version"
echo "$stamp" >"$bin/.stamp"
echo "build-cfssl: done in $(( $(date +%s) - start ))s" >&2
echo "$bin/cfssl"

#!/usr/bin/env bash
# Builds the real SPIRE server and agent (github.com/spiffe/spire v1.13.3,
# cmd/spire-server and cmd/spire-agent) that test/spire federates meshid
# with, into a per-user cache (~/.cache/meshid/spire-bin, or $SPIRE_BIN_DIR)
# shared by every clone on the machine. The build runs in the module
# test/spire/tools, whose go.mod and go.sum pin SPIRE and every dependency, so
# it is reproducible and keeps SPIRE's dependencies out of meshid's go.mod.
# (`go install github.com/spiffe/spire/cmd/...@v1.13.3` is refused here: the
# module proxy answers 403 to the version list that command asks for.)
# A stamp of the inputs (go version, the tools module's go.mod and go.sum,
# this script) is kept next to the binaries; when it matches, nothing is
# rebuilt. A cold build is about 1,000 CPU-seconds (8 to 10 minutes on 2
# free cores). Safe to run concurrently (flock). Prints the binaries'
# directory on its last line.
#
# Usage: bash scripts/build-spire.sh   (from anywhere)
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${SPIRE_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/meshid/spire-bin}"
mkdir -p "$bin"

exec 9>"$bin/.lock"
if command -v flock >/dev/null; then flock 9; fi

tools=test/spire/tools
stamp="$( { go version; cat "$tools/go.mod" "$tools/go.sum" scripts/build-spire.sh; } | sha256sum | cut -d' ' -f1)"
if [[ -x "$bin/spire-server" && -x "$bin/spire-agent" && -f "$bin/.stamp" && "$(cat "$bin/.stamp")" == "$stamp" ]]; then
	echo "build-spire: up to date" >&2
	echo "$bin"
	exit 0
fi
rm -f "$bin/.stamp"
start=$(date +%s)
echo "build-spire: building spire-server and spire-agent into $bin (a cold build takes about 1,000 CPU-seconds)" >&2
(cd "$tools" && GOFLAGS=-buildvcs=false go build -o "$bin/" \
	github.com/spiffe/spire/cmd/spire-server github.com/spiffe/spire/cmd/spire-agent)
echo "$stamp" >"$bin/.stamp"
echo "build-spire: done in $(( $(date +%s) - start ))s" >&2
echo "$bin"

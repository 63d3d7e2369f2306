#!/usr/bin/env bash
# Builds the Helm CLI the chart tests run (test/kube/e2e/helm*_test.go:
# helm lint, template, install, upgrade, uninstall against the harness's real
# API server), from the module proxy via test/kube/tools/helm/go.mod (its own
# module, pinned to helm.sh/helm/v4 v4.3.2, so neither meshid's nor the
# suite's dependencies change what is built), into the same per-user cache as
# kube-apiserver and etcd (~/.cache/meshid/kube-bin, or $KUBE_BIN_DIR),
# shared by every clone of the repository on the machine.
#
# A stamp of the inputs (go version, this script, go.mod, go.sum) is kept
# next to the binary (.helm-stamp); when it matches, nothing is rebuilt. The
# first build takes a few minutes on 2 cores. Safe to run concurrently (flock).
#
# Usage: bash test/kube/hack/build-helm.sh   (from anywhere)
set -euo pipefail
cd "$(dirname "$0")/.."
# The same default as harness.BinDir: a per-user cache shared by every clone.
bin="${KUBE_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/meshid/kube-bin}"
mkdir -p "$bin"

exec 9>"$bin/.helm-lock"
if command -v flock >/dev/null; then flock 9; fi

cd tools/helm
stamp="$( { go version; cat ../../hack/build-helm.sh go.mod go.sum tools.go; } | sha256sum | cut -d' ' -f1)"
if [[ -x "$bin/helm" && -f "$bin/.helm-stamp" && "$(cat "$bin/.helm-stamp")" == "$stamp" ]]; then
	echo "build-helm: up to date in $bin"
	exit 0
fi

rm -f "$bin/.helm-stamp"
start=$(date +%s)
hv="$(go list -m -f '{{.Version}}' helm.sh/helm/v4)"   # v4.3.2
echo "build-helm: building helm $hv into $bin (the first build takes a few minutes)"
# `helm version` reports the pinned release, as the upstream build stamps it.
vpkg=helm.sh/helm/v4/internal/version
go build -trimpath -ldflags="-s -w -X $vpkg.version=$hv -X $vpkg.gitTreeState=clean" -o "$bin/helm.tmp" helm.sh/helm/v4/cmd/helm
mv -f "$bin/helm.tmp" "$bin/helm"
echo "$stamp" >"$bin/.helm-stamp"
echo "build-helm: done in $(( $(date +%s) - start ))s"

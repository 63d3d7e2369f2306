#!/usr/bin/env bash
# Builds the binaries the real-Kubernetes suite runs: kube-apiserver and etcd,
# and for the node suite (test/kube/node) kubelet, kube-controller-manager,
# kube-scheduler and kube-proxy, from the module proxy via test/kube/tools/go.mod (its own module, pinned to
# exactly the versions k8s.io/kubernetes v1.37.2 was released with, so that
# neither meshid's nor the suite's dependencies change what is built), into
# a per-user cache (~/.cache/meshid/kube-bin, or $KUBE_BIN_DIR) shared by every
# clone of the repository on the machine.
#
# A stamp of the inputs (go version, tools/go.mod, go.sum, cmd/ sources) is kept next
# to the binaries; when it matches, nothing is rebuilt. The Go build cache makes
# a rebuild after a small change fast anyway; only the first build is slow
# (about 10 minutes on 2 cores for etcd and kube-apiserver, a few more for
# the node's binaries, which share most of their packages). Safe to run concurrently (flock).
#
# Usage: bash test/kube/hack/build-binaries.sh   (from anywhere)
set -euo pipefail
cd "$(dirname "$0")/.."
# The same default as harness.BinDir: a per-user cache shared by every clone.
bin="${KUBE_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/meshid/kube-bin}"
mkdir -p "$bin"

exec 9>"$bin/.lock"
if command -v flock >/dev/null; then flock 9; fi

cd tools
stamp="$( { go version; cat ../hack/build-binaries.sh go.mod go.sum; find cmd -type f -name '*.go' | sort | xargs cat; } | sha256sum | cut -d' ' -f1)"
bins=(etcd kube-apiserver kubelet kube-controller-manager kube-scheduler kube-proxy)
uptodate=1
for b in "${bins[@]}"; do [[ -x "$bin/$b" ]] || uptodate=0; done
if [[ $uptodate == 1 && -f "$bin/.stamp" && "$(cat "$bin/.stamp")" == "$stamp" ]]; then
	echo "build-binaries: up to date in $bin"
	exit 0
fi

rm -f "$bin/.stamp"
start=$(date +%s)
echo "build-binaries: building ${bins[*]} into $bin (the first build takes ~10 minutes)"
# The version the Kubernetes binaries report (discovery, /version, the
# Node's kubeletVersion) is stamped at link time, as the upstream release
# build does; etcd does not link the package, so the flags do nothing there.
kv="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"   # v1.37.2
major="${kv#v}"; major="${major%%.*}"
minor="${kv#v*.}"; minor="${minor%%.*}"
vpkg=k8s.io/component-base/version
# One go build for all of them: the packages they share compile once and
# the links run in parallel. Stripped (-s -w): the tests never debug them,
# and the links are faster.
rm -rf "$bin/.build"
mkdir -p "$bin/.build"
go build -ldflags="-s -w -X $vpkg.gitVersion=$kv -X $vpkg.gitMajor=$major -X $vpkg.gitMinor=$minor -X $vpkg.gitTreeState=clean" \
	-o "$bin/.build/" "${bins[@]/#/./cmd/}"
for b in "${bins[@]}"; do mv -f "$bin/.build/$b" "$bin/$b"; done
rmdir "$bin/.build"
echo "$stamp" >"$bin/.stamp"
echo "build-binaries: done in $(( $(date +%s) - start ))s"

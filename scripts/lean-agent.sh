#!/usr/bin/env bash
# Measures the lean agent against the full CLI's agent: binary size,
# packages linked, and idle RSS after the first certificate, each agent a
# real process against a real `meshid server` (docs/benchmarks.md, "Lean
# agent"), then the lean agent's RSS with STREAMS (1000) SDS streams open.
# Usage: make build && bash scripts/lean-agent.sh [idle seconds]
set -euo pipefail
IDLE=${1:-10}
BIN=${BIN:-bin/meshid}
AGENTBIN=${AGENTBIN:-bin/meshid-agent}
BENCHBIN=${BENCHBIN:-bin/meshid-bench}
DIR=$(mktemp -d /tmp/meshid-lean.XXXXXX)
PORT=${PORT:-15812}
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$DIR"; }
trap cleanup EXIT

echo "== binaries"
ls -l "$BIN" "$AGENTBIN" | awk '{printf "%-20s %6.1f MB\n", $NF, $5/1e6}'
echo "== packages linked (go list -deps | wc -l)"
printf "%-20s %s\n" ./cmd/meshid "$(go list -deps ./cmd/meshid | wc -l)" ./cmd/meshid-agent "$(go list -deps ./cmd/meshid-agent | wc -l)"

# The CA: a self-signed root and offline JWT of the dev issuer.
"$BIN" dev token --create-issuer --state-dir "$DIR" --ttl 24h >"$DIR/token"
"$BIN" server --state-dir "$DIR" --listen 127.0.0.1:$PORT --monitoring-listen '' \
	--jwt-issuer https://meshid.dev.local --jwks-file "$DIR/jwks.json" --log-level warn &
pids+=($!)
for _ in $(seq 100); do [ -s "$DIR/root-cert.pem" ] && break; sleep 0.1; done

# run_agent NAME CMD...: starts an agent, waits until /readyz (first
# certificate held), idles, and prints its VmRSS.
run_agent() {
	local name=$1 mon=127.0.0.1:$((PORT + ${#pids[@]} + 10)); shift
	"$@" --ca-addr 127.0.0.1:$PORT --ca-root "$DIR/root-cert.pem" --token-file "$DIR/token" \
		--sds-socket "$DIR/$name.sock" --monitoring-listen "$mon" --log-level warn &
	local pid=$!; pids+=($pid); last_pid=$pid
	for _ in $(seq 200); do curl -fs "http://$mon/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
	curl -fs "http://$mon/readyz" >/dev/null || { echo "$name: not ready"; return 1; }
	sleep "$IDLE"
	printf "%-20s %s\n" "$name" "$(grep -E 'VmRSS|RssAnon|RssFile' /proc/$pid/status | tr -s ' \t' ' ' | paste -sd' ')"
}
echo "== idle RSS after the first certificate (${IDLE}s idle)"
run_agent meshid-agent "$AGENTBIN"
lean=$last_pid
run_agent meshid-agent-full "$BIN" agent
echo "== meshid-agent with ${STREAMS:=1000} SDS streams open"
"$BENCHBIN" sds --sds-socket "$DIR/meshid-agent.sock" --streams "$STREAMS" --agent-pid "$lean" -q

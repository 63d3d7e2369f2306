#!/usr/bin/env bash
# A short `meshid-bench` run against a fresh `meshid dev`, for `make bench`.
#
# It starts `meshid dev` on its own ports and state directory, then runs
#   1. bench ca: a concurrency sweep with ec-p256 leaf keys (and a chart),
#   2. bench ca: the same sweep with rsa-2048 leaf keys,
#      both with the in-process crypto bound and the CA's CPU per certificate
#      (--ca-pid: the dev process),
#   3. bench sds: OPEN_STREAMS streams opened one at a time (a cached default
#      reaching each new stream),
#   4. bench sds: STREAMS SDS streams, the agent's RSS, and a forced
#      rotation's fan-out,
# printing each report, and stops `meshid dev` again. Each SDS run is against
# a fresh `meshid-agent` of its own (AGENTBIN) on dev's CA and token: the RSS
# is the agent's alone, not that of a process that also ran the CA sweeps. Every setting below can
# be overridden from the environment, e.g. DURATION=10s SWEEP=1,2,4,8,16,32,64.
set -euo pipefail

BIN=${BIN:-bin/meshid}
BENCHBIN=${BENCHBIN:-bin/meshid-bench}
AGENTBIN=${AGENTBIN:-bin/meshid-agent}
if [ -z "${STATE:-}" ]; then
	STATE=$(mktemp -d "${TMPDIR:-/tmp}/meshid-bench.XXXXXX")
	own_state=1
fi
CA_ADDR=${CA_ADDR:-127.0.0.1:25012}
CA_MONITORING=${CA_MONITORING:-127.0.0.1:25014}
AGENT_ADMIN=${AGENT_ADMIN:-127.0.0.1:25020}
BENCH_AGENT_ADMIN=${BENCH_AGENT_ADMIN:-127.0.0.1:25022}
DURATION=${DURATION:-5s}
SWEEP=${SWEEP:-1,8,64}
SERVICE_ACCOUNTS=${SERVICE_ACCOUNTS:-100}
STREAMS=${STREAMS:-1000}
OPEN_STREAMS=${OPEN_STREAMS:-1000}
CHART=${CHART:-docs/ca-throughput.svg}

"$BIN" dev --state-dir "$STATE" --listen "$CA_ADDR" --monitoring-listen "$CA_MONITORING" \
	--agent-monitoring-listen "$AGENT_ADMIN" --log-level warn >"$STATE/dev.log" 2>&1 &
dev=$!
agent=
stop_agent() {
	if [ -n "$agent" ]; then
		kill "$agent" 2>/dev/null || true
		wait "$agent" 2>/dev/null || true
		agent=
	fi
}
stop() {
	stop_agent
	kill "$dev" 2>/dev/null || true
	wait "$dev" 2>/dev/null || true
	if [ -n "${own_state:-}" ]; then rm -rf "$STATE"; fi
}
trap stop EXIT

# Wait (at most 30 s) for the CA root and the SDS socket.
for _ in $(seq 300); do
	if [ -S "$STATE/sds.sock" ] && [ -s "$STATE/root-cert.pem" ]; then break; fi
	if ! kill -0 "$dev" 2>/dev/null; then
		echo "bench.sh: meshid dev exited:" >&2
		cat "$STATE/dev.log" >&2
		exit 1
	fi
	sleep 0.1
done
if ! [ -S "$STATE/sds.sock" ]; then
	echo "bench.sh: meshid dev did not start within 30s:" >&2
	cat "$STATE/dev.log" >&2
	exit 1
fi

echo "== meshid-bench ca: ec-p256 leaf keys, sweep $SWEEP, $DURATION per level"
"$BENCHBIN" ca --addr "$CA_ADDR" --dev-state-dir "$STATE" --service-accounts "$SERVICE_ACCOUNTS" \
	--pregen-keys --crypto-bound --ca-pid "$dev" --duration "$DURATION" --sweep "$SWEEP" --chart "$CHART"

echo "== meshid-bench ca: rsa-2048 leaf keys, sweep $SWEEP, $DURATION per level"
"$BENCHBIN" ca --addr "$CA_ADDR" --dev-state-dir "$STATE" --service-accounts "$SERVICE_ACCOUNTS" \
	--pregen-keys --crypto-bound --ca-pid "$dev" --key-type rsa-2048 --duration "$DURATION" --sweep "$SWEEP"

# start_agent starts a fresh meshid-agent on dev's CA and default/default
# token, serving SDS on $STATE/agent.sock, and waits (at most 30 s) until it
# is ready (it holds its certificate).
start_agent() {
	rm -f "$STATE/agent.sock"
	"$AGENTBIN" --ca-addr "$CA_ADDR" --ca-root "$STATE/root-cert.pem" --token-file "$STATE/token" \
		--sds-socket "$STATE/agent.sock" --monitoring-listen "$BENCH_AGENT_ADMIN" --log-level warn \
		>"$STATE/agent.log" 2>&1 &
	agent=$!
	for _ in $(seq 300); do
		if curl -sf "http://$BENCH_AGENT_ADMIN/readyz" >/dev/null 2>&1; then return; fi
		if ! kill -0 "$agent" 2>/dev/null; then break; fi
		sleep 0.1
	done
	echo "bench.sh: meshid-agent did not become ready:" >&2
	cat "$STATE/agent.log" >&2
	exit 1
}

echo "== meshid-bench sds: $OPEN_STREAMS streams opened one at a time (fresh agent)"
start_agent
"$BENCHBIN" sds --sds-socket "$STATE/agent.sock" --streams "$OPEN_STREAMS" --open-concurrency 1
stop_agent

echo "== meshid-bench sds: $STREAMS streams, the agent's RSS, forced rotation (fresh agent)"
start_agent
"$BENCHBIN" sds --sds-socket "$STATE/agent.sock" --streams "$STREAMS" --agent-pid "$agent" \
	--rotate --agent-admin "$BENCH_AGENT_ADMIN"
stop_agent

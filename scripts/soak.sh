#!/usr/bin/env bash
# A bounded soak of `meshid dev` under steady CSR and SDS load, for
# `make soak` (not part of `make test`).
#
# It starts `meshid dev` on its own ports and state directory, then until
# SOAK_DURATION has passed repeats a load cycle:
#   - meshid-bench ca:  SOAK_CA_REQUESTS CreateCertificate calls over a new
#     TLS connection, SOAK_CA_CONCURRENCY in flight, tokens of
#     SOAK_SERVICE_ACCOUNTS service accounts minted by the dev issuer;
#   - meshid-bench sds: SOAK_SDS_STREAMS SDS streams (default + ROOTCA) on the
#     agent's socket, and with SOAK_SDS_ROTATE=1 a forced rotation fanned out
#     to all of them; the streams close when it ends;
# both at once, then a SOAK_PAUSE pause. Every SOAK_INTERVAL it samples the
# process's resident memory (process_resident_memory_bytes from its /metrics,
# else /proc/<pid>/status), its goroutines (go_goroutines from /metrics, else
# the goroutine profile's total from /debug/pprof, which `meshid dev --pprof`
# serves on the loopback monitoring listener) and its open file descriptors
# (the least of five reads over a second, so a load burst in flight does not
# count as growth).
#
# The report (a table, printed and written to $STATE/soak-report.txt) shows
# every sample after SOAK_WARMUP, and the script fails when the mean of the
# last third of those samples exceeds the mean of the first third by more
# than SOAK_MAX_RSS_GROWTH percent of RSS or SOAK_MAX_GOROUTINE_GROWTH
# goroutines, or when a load cycle failed.
#
#   make soak                       # 10 minutes
#   SOAK_DURATION=2m make soak
set -euo pipefail

BIN=${BIN:-bin/meshid}
SOAK_DURATION=${SOAK_DURATION:-10m}
SOAK_WARMUP=${SOAK_WARMUP:-30s}
SOAK_INTERVAL=${SOAK_INTERVAL:-10s}
SOAK_PAUSE=${SOAK_PAUSE:-1}
SOAK_CA_REQUESTS=${SOAK_CA_REQUESTS:-200}
SOAK_CA_CONCURRENCY=${SOAK_CA_CONCURRENCY:-2}
SOAK_SERVICE_ACCOUNTS=${SOAK_SERVICE_ACCOUNTS:-20}
SOAK_SDS_STREAMS=${SOAK_SDS_STREAMS:-100}
SOAK_SDS_ROTATE=${SOAK_SDS_ROTATE:-1}
SOAK_MAX_RSS_GROWTH=${SOAK_MAX_RSS_GROWTH:-20}
SOAK_MAX_GOROUTINE_GROWTH=${SOAK_MAX_GOROUTINE_GROWTH:-50}
CA_ADDR=${CA_ADDR:-127.0.0.1:25112}
CA_MONITORING=${CA_MONITORING:-127.0.0.1:25114}
AGENT_ADMIN=${AGENT_ADMIN:-127.0.0.1:25120}
# The state directory is kept after the run: it holds the report and the
# dev process's log.
STATE=${STATE:-$(mktemp -d "${TMPDIR:-/tmp}/meshid-soak.XXXXXX")}

# seconds converts a duration such as 90, 90s, 10m or 1h to seconds.
seconds() {
	case "$1" in
	*h) echo $((${1%h} * 3600)) ;;
	*m) echo $((${1%m} * 60)) ;;
	*s) echo "${1%s}" ;;
	*) echo "$1" ;;
	esac
}
duration=$(seconds "$SOAK_DURATION")
warmup=$(seconds "$SOAK_WARMUP")
interval=$(seconds "$SOAK_INTERVAL")
if [ "$duration" -le "$warmup" ]; then
	echo "soak.sh: SOAK_DURATION ($SOAK_DURATION) must be longer than SOAK_WARMUP ($SOAK_WARMUP)" >&2
	exit 2
fi

mkdir -p "$STATE"
report=$STATE/soak-report.txt
samples=$STATE/soak-samples.tsv
failures=$STATE/soak-load-failures
: >"$samples"
: >"$failures"

"$BIN" dev --state-dir "$STATE" --listen "$CA_ADDR" --monitoring-listen "$CA_MONITORING" \
	--agent-monitoring-listen "$AGENT_ADMIN" --log-level warn --pprof >"$STATE/dev.log" 2>&1 &
dev=$!
load=
stop() {
	if [ -n "$load" ]; then kill "$load" 2>/dev/null || true; wait "$load" 2>/dev/null || true; fi
	kill "$dev" 2>/dev/null || true
	wait "$dev" 2>/dev/null || true
}
trap stop EXIT

# Wait (at most 30 s) for the CA root, the SDS socket and the metrics.
for _ in $(seq 300); do
	if [ -S "$STATE/sds.sock" ] && [ -s "$STATE/root-cert.pem" ] &&
		curl -fs "http://$CA_MONITORING/metrics" >/dev/null 2>&1; then break; fi
	if ! kill -0 "$dev" 2>/dev/null; then
		echo "soak.sh: meshid dev exited:" >&2
		cat "$STATE/dev.log" >&2
		exit 1
	fi
	sleep 0.1
done
if ! [ -S "$STATE/sds.sock" ]; then
	echo "soak.sh: meshid dev did not start within 30s:" >&2
	cat "$STATE/dev.log" >&2
	exit 1
fi

# loadCycle runs one CA and one SDS load at once; a failure is recorded, not
# fatal, so that the run and its samples complete.
loadCycle() {
	local rotate=()
	if [ "$SOAK_SDS_ROTATE" = 1 ]; then rotate=(--rotate --agent-admin "$AGENT_ADMIN"); fi
	"$BIN" bench ca --addr "$CA_ADDR" --dev-state-dir "$STATE" --service-accounts "$SOAK_SERVICE_ACCOUNTS" \
		--pregen-keys --requests "$SOAK_CA_REQUESTS" --concurrency "$SOAK_CA_CONCURRENCY" -q -o json \
		>"$STATE/bench-ca.json" 2>"$STATE/bench-ca.err" &
	local ca=$!
	"$BIN" bench sds --sds-socket "$STATE/sds.sock" --streams "$SOAK_SDS_STREAMS" "${rotate[@]}" -q -o json \
		>"$STATE/bench-sds.json" 2>"$STATE/bench-sds.err" || echo "$(date -u +%T) bench sds: $(tail -1 "$STATE/bench-sds.err")" >>"$failures"
	wait "$ca" || echo "$(date -u +%T) bench ca: $(tail -1 "$STATE/bench-ca.err")" >>"$failures"
}

start=$(date +%s)
end=$((start + duration))
(
	while [ "$(date +%s)" -lt "$end" ]; do
		loadCycle
		echo x >>"$STATE/soak-cycles"
		sleep "$SOAK_PAUSE"
	done
) &
load=$!

# metric prints the sum of a metric's series from the /metrics text, or
# nothing when it has none.
metric() { awk -v m="$1" 'index($1, m) == 1 && (length($1) == length(m) || substr($1, length(m) + 1, 1) == "{") { s += $2; n++ } END { if (n) printf "%d\n", s }'; }

echo "soak.sh: meshid dev (pid $dev) under load for $SOAK_DURATION, sampling every ${interval}s (state: $STATE)" >&2
next=$((start + interval))
while :; do
	now=$(date +%s)
	if [ "$now" -ge "$end" ]; then break; fi
	if [ "$now" -lt "$next" ]; then sleep $((next - now)); fi
	next=$((next + interval))
	if ! kill -0 "$dev" 2>/dev/null; then
		echo "soak.sh: meshid dev died during the soak:" >&2
		tail -20 "$STATE/dev.log" >&2
		exit 1
	fi
	m=$(curl -fs "http://$CA_MONITORING/metrics" || true)
	rss=$(metric process_resident_memory_bytes <<<"$m")
	if [ -z "$rss" ]; then rss=$(($(awk '/^VmRSS:/ { print $2 }' "/proc/$dev/status") * 1024)); fi
	# Goroutines and fds: the least of five reads over a second. A load
	# cycle in flight adds a few hundred of each for a moment (streams,
	# connections); what leaks stays, so the minimum shows it without that
	# noise.
	gor= fds=
	for _ in 1 2 3 4 5; do
		g=$(curl -fs "http://$CA_MONITORING/metrics" | metric go_goroutines || true)
		if [ -z "$g" ]; then
			g=$(curl -fs "http://$CA_MONITORING/debug/pprof/goroutine?debug=1" | awk 'NR == 1 && /^goroutine profile: total/ { print $NF }' || true)
		fi
		fd=$(find "/proc/$dev/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
		if [ -n "$g" ] && { [ -z "$gor" ] || [ "$g" -lt "$gor" ]; }; then gor=$g; fi
		if [ -z "$fds" ] || [ "$fd" -lt "$fds" ]; then fds=$fd; fi
		sleep 0.2
	done
	cycles=$(wc -l <"$STATE/soak-cycles" 2>/dev/null || echo 0)
	issued=$(metric meshid_ca_certificates_issued_total <<<"$m")
	printf '%d\t%d\t%s\t%d\t%d\t%s\n' "$(($(date +%s) - start))" "$rss" "${gor:--1}" "$fds" "$cycles" "${issued:--1}" >>"$samples"
	printf 'soak.sh: t=%4ds rss=%6.1f MiB goroutines=%s fds=%d cycles=%d certificates=%s\n' "$(($(date +%s) - start))" \
		"$(awk -v r="$rss" 'BEGIN { print r / 1048576 }')" "${gor:-?}" "$fds" "$cycles" "${issued:-?}" >&2
done
wait "$load" || true
load=

# The report: every sample, then the first and last thirds of those after
# the warm-up, and the verdict.
awk -F'\t' -v warm="$warmup" -v maxrss="$SOAK_MAX_RSS_GROWTH" -v maxgor="$SOAK_MAX_GOROUTINE_GROWTH" \
	-v failures="$(wc -l <"$failures")" -v cfg="duration=$SOAK_DURATION warmup=$SOAK_WARMUP interval=$SOAK_INTERVAL ca_requests=$SOAK_CA_REQUESTS ca_concurrency=$SOAK_CA_CONCURRENCY sds_streams=$SOAK_SDS_STREAMS sds_rotate=$SOAK_SDS_ROTATE" '
{ t[NR] = $1; rss[NR] = $2; gor[NR] = $3; fds[NR] = $4; cyc[NR] = $5; crt[NR] = $6 }
END {
	printf "meshid soak: %s\n\n", cfg
	printf "%6s  %10s  %10s  %6s  %11s  %12s  %s\n", "t (s)", "RSS (MiB)", "goroutines", "fds", "load cycles", "certificates", ""
	n = 0
	for (i = 1; i <= NR; i++) {
		mark = t[i] < warm ? "warm-up" : ""
		if (t[i] >= warm) s[++n] = i
		printf "%6d  %10.1f  %10d  %6d  %11d  %12d  %s\n", t[i], rss[i] / 1048576, gor[i], fds[i], cyc[i], crt[i], mark
	}
	if (n < 3) { printf "\nFAIL: only %d samples after the warm-up; run longer\n", n; exit 1 }
	k = int(n / 3)
	for (i = 1; i <= k; i++) { r1 += rss[s[i]]; g1 += gor[s[i]]; f1 += fds[s[i]] }
	for (i = n - k + 1; i <= n; i++) { r3 += rss[s[i]]; g3 += gor[s[i]]; f3 += fds[s[i]] }
	r1 /= k; r3 /= k; g1 /= k; g3 /= k; f1 /= k; f3 /= k
	growth = (r3 - r1) * 100 / r1
	printf "\nfirst third (%d samples): RSS %.1f MiB, %.0f goroutines, %.0f fds\n", k, r1 / 1048576, g1, f1
	printf "last third  (%d samples): RSS %.1f MiB, %.0f goroutines, %.0f fds\n", k, r3 / 1048576, g3, f3
	printf "growth: RSS %+.1f%% (limit %d%%), goroutines %+.0f (limit %d), fds %+.0f; load cycles %d, failed %d\n", growth, maxrss, g3 - g1, maxgor, f3 - f1, cyc[NR], failures
	bad = 0
	if (growth > maxrss) { print "FAIL: RSS grew"; bad = 1 }
	if (g3 - g1 > maxgor) { print "FAIL: goroutines grew"; bad = 1 }
	if (failures > 0) { print "FAIL: load cycles failed (see soak-load-failures)"; bad = 1 }
	if (cyc[NR] == 0) { print "FAIL: no load cycle completed"; bad = 1 }
	for (i = 1; i <= NR; i++) if (gor[i] < 0) { print "FAIL: goroutines could not be read"; bad = 1; break }
	if (!bad) print "PASS: flat"
	exit bad
}' "$samples" >"$report" && verdict=0 || verdict=$?
cat "$report"
if [ -s "$failures" ]; then
	echo "load failures:"
	head -5 "$failures"
fi
echo "report: $report"
exit "$verdict"

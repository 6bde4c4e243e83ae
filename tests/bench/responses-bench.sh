#!/usr/bin/env bash
# responses-bench.sh — what a client API's front-end costs over /v1/chat/completions
# (issue 24: a /v1/responses or /v1/messages round trip at most 1 ms more than a chat
# completion's, for the same provider), measured side by side in one run.
#
# One lighttpd + olp-fcgi, one command provider that answers at once (printf ok,
# sandboxed). Each sample sends one non-streamed request per route, the routes in turn
# (their order rotating each sample), 20 ms apart, so that machine noise hits all alike;
# then each route's median curl time_total and its difference from the first route's.
#
# usage: tests/bench/responses-bench.sh [BUILD_DIR]   (default: build/bench; configured and built each run)
# env:   BENCH_N (samples, default 200), BENCH_ROUTES (default "chat responses"; known:
#        chat, responses, messages), BENCH_STREAM=1 (streamed requests instead)
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build/bench}
n=${BENCH_N:-200}
read -r -a routes <<<"${BENCH_ROUTES:-chat responses}"
stream=$([ "${BENCH_STREAM:-0}" = 1 ] && echo true || echo false)

command -v lighttpd >/dev/null || { echo "lighttpd missing: run deploy/olp-local test first" >&2; exit 1; }
# shellcheck source=tests/bench/lib.sh
. "$(dirname "$0")/lib.sh"
bench_build "$build" olp-fcgi
build=$(cd "$build" && pwd)
bench_workdir responses-bench

token=bench-owner-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
mkdir -m 0700 "$work/home" "$work/run"
cat >"$work/home/models-registry.json" <<'JSON'
{"providers":{"bench":{"type":"command","argv":["/usr/bin/printf","ok"],"timeout_s":30,
 "models":[{"id":"instant"}]}}}
JSON
port=$(free_port)
OLP_BIN=$build/fcgi/olp-fcgi OLP_HOME=$work/home OLP_RUN_DIR=$work/run OLP_PORT=$port \
OLP_MAX_PROCS=2 OLP_THREADS=16 OLP_OWNER_TOKEN=$token OLP_LOG_LEVEL=warn \
	lighttpd -D -f "$root/lighttpd/olp.conf" >"$work/run/stdout" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
	curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
	sleep 0.05
done

# path ROUTE, body ROUTE: the same one-word question in each API.
path() {
	case $1 in
	chat) echo /v1/chat/completions ;;
	responses) echo /v1/responses ;;
	messages) echo /v1/messages ;;
	*) echo "unknown route $1 (chat, responses, messages)" >&2; exit 2 ;;
	esac
}
body() {
	case $1 in
	chat) echo "{\"model\":\"instant\",\"stream\":$stream,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}" ;;
	responses) echo "{\"model\":\"instant\",\"stream\":$stream,\"store\":false,\"input\":\"hi\"}" ;;
	messages) echo "{\"model\":\"instant\",\"stream\":$stream,\"max_tokens\":16,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}" ;;
	esac
}
# one ROUTE: a request's time_total in ms; fails unless the answer is a 200.
one() {
	local out
	out=$(curl -s -o /dev/null -w '%{http_code} %{time_total}' -H "Authorization: Bearer $token" \
		-H 'Content-Type: application/json' -d "$(body "$1")" "http://127.0.0.1:$port$(path "$1")")
	[ "${out%% *}" = 200 ] || { echo "$1: HTTP ${out%% *}" >&2; exit 1; }
	awk '{printf "%.3f\n", $2 * 1000}' <<<"$out"
}

for r in "${routes[@]}"; do one "$r" >/dev/null; done # warm: every route answers
echo "== ${routes[*]}: $n samples of one request each (\"stream\": $stream), interleaved, 20 ms apart"
k=${#routes[@]}
for i in $(seq "$n"); do
	for j in $(seq 0 $((k - 1))); do
		r=${routes[$(((i + j) % k))]}
		one "$r" >>"$work/$r.ms"
		sleep 0.02
	done
done
median() { sort -n "$1" | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
quartiles() { sort -n "$1" | awk '{a[NR]=$1} END {printf "p25 %.3f  p75 %.3f", a[int(NR/4)+1], a[int(3*NR/4)+1]}'; }
base=$(median "$work/${routes[0]}.ms")
for r in "${routes[@]}"; do
	m=$(median "$work/$r.ms")
	awk -v r="$r" -v m="$m" -v b="$base" -v first="${routes[0]}" -v q="$(quartiles "$work/$r.ms")" 'BEGIN {
		d = m - b
		printf "%-10s median %.3f ms  (%+.3f ms vs %s; %s)%s\n", r, m, d, first, q,
			(r != first && d > 1.0) ? "  OVER the 1 ms budget" : ""
	}'
done

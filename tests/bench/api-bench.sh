#!/usr/bin/env bash
# api-bench.sh — what a client API's front-end costs on the request path (issue 24: a
# /v1/messages round trip at most 1 ms more than /v1/chat/completions for the same
# provider).
#
# One lighttpd + olp-fcgi, one command provider that answers at once (printf ok, sandboxed
# as deployed), and the same one-line question asked through each API in turn: rounds of
# one request per API (50 ms apart, one connection each), the order rotated each round, so
# that machine noise and any place in the round hit them alike. Reported: each API's
# median round trip (curl time_total), non-streamed and streamed, and the median of its
# difference to chat completions within a round (paired: a slow spell of the machine
# moves both). On a busy machine, raise BENCH_N. Then messages-bench: the CPU the front-end
# itself adds (parse and translate a request the size of Claude Code's, encode 100
# deltas), in-process, which machine noise does not blur.
#
# usage: tests/bench/api-bench.sh [BUILD_DIR]   (default: build/bench; configured and built each run)
# env:   BENCH_N (requests per API and mode, default 300)
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build/bench}
n=${BENCH_N:-300}

command -v lighttpd >/dev/null || { echo "lighttpd missing: run deploy/olp-local test first" >&2; exit 1; }
# shellcheck source=tests/bench/lib.sh
. "$(dirname "$0")/lib.sh"
bench_build "$build" olp-fcgi olp-sandbox-exec messages-bench
build=$(cd "$build" && pwd)
bench_workdir api

token=bench-owner-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
mkdir -m 0700 "$work/home"
cat > "$work/home/models-registry.json" <<'JSON'
{"providers":{"bench":{"type":"command","argv":["/usr/bin/printf","ok"],"timeout_s":30,
 "models":[{"id":"instant"}]}}}
JSON

port=$(free_port)
mkdir -p "$work/run"
OLP_BIN=$build/fcgi/olp-fcgi OLP_HOME=$work/home OLP_RUN_DIR=$work/run OLP_PORT=$port \
OLP_MAX_PROCS=2 OLP_THREADS=16 OLP_OWNER_TOKEN=$token OLP_LOG_LEVEL=warn \
	lighttpd -D -f "$root/lighttpd/olp.conf" >"$work/run/stdout" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
	curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
	sleep 0.05
done

# The APIs: name, path, the body (without "stream"), what a good answer holds.
apis=(chat messages)
declare -A path body want
path[chat]=/v1/chat/completions
body[chat]='"model":"instant","messages":[{"role":"user","content":"hi"}]'
want[chat]='"content":"ok"'
path[messages]=/v1/messages
body[messages]='"model":"instant","max_tokens":64,"messages":[{"role":"user","content":"hi"}]'
want[messages]='"text":"ok"'

one() { # API STREAM(true|false)
	curl -s -o /dev/null -w '%{time_total}\n' -H "Authorization: Bearer $token" \
		-H 'Content-Type: application/json' -d "{${body[$1]},\"stream\":$2}" \
		"http://127.0.0.1:$port${path[$1]}"
}
median() { sort -g "$1" | awk '{v[NR]=$1*1000} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }

for a in "${apis[@]}"; do
	curl -sf -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
		-d "{${body[$a]}}" "http://127.0.0.1:$port${path[$a]}" | grep -q "${want[$a]}" ||
		{ echo "$a: no good answer" >&2; exit 1; }
done

for stream in false true; do
	echo "== round trip, stream $stream: $n requests per API, alternating, 50 ms apart"
	for a in "${apis[@]}"; do : > "$work/$a-$stream.txt"; done
	for i in $(seq "$n"); do
		for k in "${!apis[@]}"; do
			a=${apis[$(((k + i) % ${#apis[@]}))]}
			one "$a" "$stream" >>"$work/$a-$stream.txt"
			sleep 0.05
		done
	done
	for a in "${apis[@]}"; do
		printf '%s_stream_%s_median_ms %.3f' "$a" "$stream" "$(median "$work/$a-$stream.txt")"
		if [ "$a" != chat ]; then
			paste "$work/chat-$stream.txt" "$work/$a-$stream.txt" | awk '{print $2 - $1}' \
				>"$work/$a-$stream-diff.txt"
			printf '  (paired difference to chat, median: %.3f ms; goal <= 1)' \
				"$(median "$work/$a-$stream-diff.txt")"
		fi
		echo
	done
done

echo "== the front-end's own CPU, in-process (messages-bench)"
"$build/tests/bench/messages-bench"

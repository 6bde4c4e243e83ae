#!/usr/bin/env bash
# stream-bench.sh — streaming through the whole stack, measured against the provider.
#
#  (a) Time to first byte and the gaps between chunks for a command provider that writes
#      a line every 50 ms (tick-emitter), through lighttpd → olp-fcgi → sandbox, compared
#      in the same run with that command spawned bare and its lines timestamped (runs
#      alternate bare, HTTP, bare, HTTP…). Goal: no added buffering — each gap within 2 ms
#      of the provider's, first byte within 5 ms of the provider's. The differences are
#      what counts, not the absolute times.
#  (b) Relay throughput: a provider writing 100 MB (yes | head -c), streamed through
#      lighttpd to a client discarding it (curl -o /dev/null), in MB/s of the provider's
#      bytes (goal >= 200), next to the same command piped bare into /dev/null.
#
# usage: tests/bench/stream-bench.sh [BUILD_DIR]   (default: build/bench; configured and built each run)
# env:   BENCH_RUNS (paired runs for (a), default 5), BENCH_TICKS (lines a run, 20),
#        BENCH_MB (size for (b), 100), BENCH_ROUNDS (rounds for (b), 3)
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build/bench}
runs=${BENCH_RUNS:-5}
ticks=${BENCH_TICKS:-20}
mb=${BENCH_MB:-100}
rounds=${BENCH_ROUNDS:-3}

command -v lighttpd >/dev/null || { echo "lighttpd missing: run deploy/olp-local test first" >&2; exit 1; }
command -v node >/dev/null || { echo "node missing" >&2; exit 1; }
# shellcheck source=tests/bench/lib.sh
. "$(dirname "$0")/lib.sh"
bench_build "$build" olp-fcgi tick-emitter
emitter=$(realpath "$build/tests/bench/tick-emitter")

bench_workdir stream-bench

token=bench-owner-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
bytes=$((mb * 1048576))
line=$(printf 'a%.0s' $(seq 63))
mkdir -m 0700 "$work/home"
cat > "$work/home/models-registry.json" <<JSON
{"providers":{
 "ticker":{"type":"command","argv":["$emitter","$ticks","50"],"timeout_s":60,
   "models":[{"id":"tick50"}]},
 "bulk":{"type":"command","argv":["/bin/sh","-c","cat >/dev/null; yes $line | head -c $bytes"],
   "timeout_s":120,"models":[{"id":"bulk"}]}}}
JSON
echo '{"auth":{"allow_anonymous":false},"sandbox":{"mode":"bwrap"}}' > "$work/home/config.json"

port=$(free_port)
mkdir -p "$work/lighttpd"
OLP_BIN=$(realpath "$build/fcgi/olp-fcgi") OLP_HOME=$work/home OLP_RUN_DIR=$work/lighttpd OLP_PORT=$port \
OLP_MAX_PROCS=2 OLP_THREADS=4 OLP_OWNER_TOKEN=$token OLP_LOG_LEVEL=warn \
	lighttpd -D -f "$root/lighttpd/olp.conf" >"$work/lighttpd/stdout" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
	curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
	sleep 0.05
done
curl -sf "http://127.0.0.1:$port/health" >/dev/null || { echo "lighttpd did not come up" >&2; cat "$work/lighttpd/stdout" >&2; exit 1; }

echo "== (a) a line every 50 ms, $ticks lines, $runs paired runs: bare command vs through lighttpd"
node "$root/tests/bench/stream-timing.mjs" "http://127.0.0.1:$port/v1/chat/completions" "$token" tick50 "$runs" \
	-- "$emitter" "$ticks" 50

echo "== (b) relay throughput: $mb MB from the provider, streamed to curl -o /dev/null, $rounds rounds"
body='{"model":"bulk","stream":true,"messages":[{"role":"user","content":"go"}]}'
rates=(); bares=()
for r in $(seq "$rounds"); do
	t0=$(date +%s.%N)
	sh -c "yes $line | head -c $bytes" >/dev/null
	t1=$(date +%s.%N)
	out=$(curl -sS -N --http1.1 -o /dev/null -w '%{http_code} %{size_download} %{time_total}' \
		-H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
		--data-binary "$body" "http://127.0.0.1:$port/v1/chat/completions")
	read -r code size secs <<<"$out"
	[ "$code" = 200 ] || { echo "HTTP $code" >&2; exit 1; }
	bare=$(awk -v b="$bytes" -v a="$t0" -v c="$t1" 'BEGIN {printf "%.0f", b / 1048576 / (c - a)}')
	rate=$(awk -v b="$bytes" -v s="$secs" 'BEGIN {printf "%.0f", b / 1048576 / s}')
	wire=$(awk -v b="$size" -v s="$secs" 'BEGIN {printf "%.0f", b / 1048576 / s}')
	printf 'round %d: via HTTP %s MB/s of provider output (%s MB/s on the wire, %.1f MB SSE in %.2f s); bare pipe %s MB/s\n' \
		"$r" "$rate" "$wire" "$(awk -v b="$size" 'BEGIN {print b / 1048576}')" "$secs" "$bare"
	rates+=("$rate"); bares+=("$bare")
done
med() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
echo "relay_mbps_median $(med "${rates[@]}") (goal >= 200)"
echo "bare_pipe_mbps_median $(med "${bares[@]}")"

#!/usr/bin/env bash
# usage-http-bench.sh — what the usage ledger and quotas (issue 14) cost on the request
# path: the same olp-fcgi behind two lighttpd instances, one with config.json usage on
# (a guest key with a quota: a quota check before the run, a ledger row after the
# answer), one with usage.enabled false; non-streaming completions of a command that
# answers at once (printf ok, sandboxed), requests alternating between the two, 50 ms
# apart, so that machine noise hits both alike. Goal: median difference <= 0.2 ms.
# A third instance, off as well, runs in the same rotation: "off2 minus off" is what two
# identical servers differ by on this machine, the noise floor of the figure.
#
# usage: tests/bench/usage-http-bench.sh [BUILD_DIR]   (default: build/bench; configured and built each run)
# env:   BENCH_N (requests to each, default 300); BENCH_QUOTA=0: the key has no quota
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build/bench}
n=${BENCH_N:-300}

command -v lighttpd >/dev/null || { echo "lighttpd missing: run deploy/olp-local test first" >&2; exit 1; }
# shellcheck source=tests/bench/lib.sh
. "$(dirname "$0")/lib.sh"
bench_build "$build" olp-fcgi olp-keys olp-sandbox-exec
build=$(cd "$build" && pwd)

bench_workdir usage-bench

# The guest key's quota flags: BENCH_QUOTA=0 makes a key without one (no quota check,
# the ledger row alone), to tell the two costs apart.
quota_flags() {
	[ "${BENCH_QUOTA:-1}" = 0 ] ||
		echo --quota-rpm=1000000000 --quota-rpd=1000000000 --quota-tpd=1000000000
}

# make_home NAME ENABLED: an OLP home with the instant command and a guest key whose
# quota never refuses here; prints the key's token.
make_home() {
	local h=$work/$1
	mkdir -m 0700 "$h"
	cat >"$h/models-registry.json" <<'JSON'
{"providers":{"bench":{"type":"command","argv":["/usr/bin/printf","ok"],"timeout_s":30,
 "models":[{"id":"instant"}]}}}
JSON
	printf '{"sandbox":{"warm":true},"usage":{"enabled":%s}}\n' "$2" >"$h/config.json"
	# shellcheck disable=SC2046 # the flags are words
	"$build/auth/olp-keys" --olp-home="$h" --json keygen --name=bench $(quota_flags) |
		python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])'
}

# start NAME PORT
start() {
	mkdir -p "$work/$1-run"
	OLP_BIN=$build/fcgi/olp-fcgi OLP_HOME=$work/$1 OLP_RUN_DIR=$work/$1-run OLP_PORT=$2 \
	OLP_MAX_PROCS=2 OLP_THREADS=16 OLP_LOG_LEVEL=warn \
		lighttpd -D -f "$root/lighttpd/olp.conf" >"$work/$1-run/stdout" 2>&1 &
	pids+=($!)
	for _ in $(seq 200); do
		curl -sf "http://127.0.0.1:$2/health" >/dev/null 2>&1 && return 0
		sleep 0.05
	done
	echo "lighttpd $1 did not come up" >&2
	cat "$work/$1-run/stdout" >&2
	exit 1
}

ton=$(make_home on true)
toff=$(make_home off false)
toff2=$(make_home off2 false)
pon=$(free_port); start on "$pon"
poff=$(free_port); start off "$poff"
poff2=$(free_port); start off2 "$poff2"

body='{"model":"instant","messages":[{"role":"user","content":"hi"}]}'
one() {
	curl -s -o /dev/null -w '%{time_total}\n' -H "Authorization: Bearer $2" \
		-H 'Content-Type: application/json' -d "$body" "http://127.0.0.1:$1/v1/chat/completions"
}
for p in "$pon:$ton" "$poff:$toff" "$poff2:$toff2"; do
	curl -sf -H "Authorization: Bearer ${p#*:}" -H 'Content-Type: application/json' -d "$body" \
		"http://127.0.0.1:${p%%:*}/v1/chat/completions" | grep -q '"content":"ok"'
done
echo "== non-streaming completion round trip, usage on vs off (and off2), $n requests each, in rotation, 50 ms apart"
: >"$work/on.txt"; : >"$work/off.txt"; : >"$work/off2.txt"
for _ in $(seq "$n"); do
	one "$pon" "$ton" >>"$work/on.txt"; sleep 0.05
	one "$poff" "$toff" >>"$work/off.txt"; sleep 0.05
	one "$poff2" "$toff2" >>"$work/off2.txt"; sleep 0.05
done
med() { sort -g "$1" | awk '{v[NR]=$1*1000} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
ron=$(med "$work/on.txt"); roff=$(med "$work/off.txt"); roff2=$(med "$work/off2.txt")
# The ledger really was written: every request of the "on" side has its row.
rows=$("$build/auth/olp-keys" --olp-home="$work/on" --json usage |
	python3 -c 'import json,sys; print(sum(d["requests"] for d in json.load(sys.stdin)))')
echo "ledger_rows_on $rows (of $((n + 1)) requests)"
echo "roundtrip_usage_on_median_ms $ron"
echo "roundtrip_usage_off_median_ms $roff"
echo "roundtrip_usage_off2_median_ms $roff2"
awk -v a="$ron" -v b="$roff" 'BEGIN {printf "usage_on_minus_off_ms %.2f (goal <= 0.2)\n", a - b}'
awk -v a="$roff2" -v b="$roff" 'BEGIN {printf "noise_off2_minus_off_ms %.2f\n", a - b}'
# The same, pair by pair (each "on" request and the "off" one 50 ms after it): less
# sensitive to the machine's load drifting during the run.
pairwise() {
	paste "$1" "$2" | awk '{print ($1 - $2) * 1000}' | sort -g |
		awk '{v[NR]=$1} END {printf "%.2f\n", (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'
}
echo "pairwise_median_on_minus_off_ms $(pairwise "$work/on.txt" "$work/off.txt")"
echo "pairwise_median_off2_minus_off_ms $(pairwise "$work/off2.txt" "$work/off.txt")"

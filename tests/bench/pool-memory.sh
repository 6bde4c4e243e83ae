#!/usr/bin/env bash
# pool-memory.sh — the memory of the whole pool (issue 27): lighttpd, the olp-fcgi workers,
# their warm sandboxes, the pre-started clients and the runs, as PSS (proportional set
# size: shared pages split between the processes sharing them, so the sum is what the
# pool costs the machine) read from /proc/PID/smaps_rollup and summed over every process
# below lighttpd (sandboxes included; the fake upstream is not the pool's). For two
# profiles, each on lighttpd/olp.conf with the real claude CLI (tests/provider-clis)
# against the fake Anthropic upstream (tests/upstream/fake-anthropic.mjs):
#   default  nothing set: the worker count, threads, warm sandboxes and pre-started clients
#            sized to this machine (fcgi/sizing.c; a host of 3 GiB or more gets 2 workers,
#            16 threads, 2 warm sandboxes per policy, 4 pre-started clients)
#   1gb      docs/deploy.md "Small hosts": 1 worker, server.threads 4,
#            sandbox.warm_per_policy 1, sandbox.prestart_max 0
# and three moments: "start" (ready, nothing asked yet), "idle" (after a few requests: warm
# sandboxes and pre-started clients waiting) and "4 streams" (the highest sum sampled while
# four streamed completions run at once, each about 6 s long: the fake upstream spaces its
# deltas by POOL_DELTA_MS). Listens on 127.0.0.1 only; every wait is bounded.
#
# usage: tests/bench/pool-memory.sh [BUILD_DIR]   (default: build/bench; configured and built each run)
# env:   POOL_PROFILES (default "default 1gb"), POOL_DELTA_MS (default 1000),
#        POOL_CLAUDE (the claude binary; default tests/provider-clis' x86-64 one),
#        POOL_BUILT=1 (BUILD_DIR is built already and not configured here: a cross build),
#        POOL_SETTLE_S (default 8: the wait for the refills before "idle"),
#        POOL_MAX_S (default 60: each request's bound),
#        POOL_STREAM_DELTA_MS (default POOL_DELTA_MS: the deltas' spacing for the 4 streams;
#        the fake upstream is restarted on its port with it, and back before the next profile).
# On arm64, in the arm64 VM (TCG): tests/vm/arm64.sh --pool-memory, which sets the last five
# (an emulated claude starts in tens of seconds, not one: the streams' deltas are spaced so
# that a stream outlasts the others' start-up, and the four are live at once, as here).
# "4 streams" samples until the four have ended either way.
# Needs root or the pool's own uid to read the sandboxed processes' smaps (the runs have
# uids of their own): an unreadable process is counted and said, never silently zero.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build/bench}
profiles=${POOL_PROFILES:-default 1gb}
delta=${POOL_DELTA_MS:-1000}
stream_delta=${POOL_STREAM_DELTA_MS:-$delta}
settle=${POOL_SETTLE_S:-8}
max_s=${POOL_MAX_S:-60}
claude=${POOL_CLAUDE:-$root/tests/provider-clis/node_modules/@anthropic-ai/claude-code/bin/claude.exe}
command -v lighttpd >/dev/null || { echo "lighttpd missing: run deploy/olp-local test first" >&2; exit 1; }
command -v node >/dev/null || { echo "node missing" >&2; exit 1; }
[ -x "$claude" ] || { echo "no claude at $claude: run npm ci in tests/provider-clis first" >&2; exit 1; }
# shellcheck source=tests/bench/lib.sh
. "$(dirname "$0")/lib.sh" # bench_build, bench_workdir, free_port
if [ "${POOL_BUILT:-0}" = 1 ]; then
	{ [ -x "$build/fcgi/olp-fcgi" ] && [ -x "$build/sandbox/olp-sandbox-exec" ]; } ||
		{ echo "POOL_BUILT=1 but $build holds no olp-fcgi and olp-sandbox-exec" >&2; exit 1; }
else
	bench_build "$build" olp-fcgi olp-sandbox-exec
fi
# The arm64 VM's root has no python3 (lib.sh's free_port): node asks the kernel instead.
command -v python3 >/dev/null ||
	free_port() { node -e 'const s = require("net").createServer().listen(0, "127.0.0.1",
		() => { console.log(s.address().port); s.close(); })'; }
build=$(realpath "$build")
bench_workdir pool-memory
chmod 0700 "$work"
token=bench-owner-$RANDOM$RANDOM

# fake_start DELTA_MS PORT: the fake upstream (replacing the one running), its deltas DELTA_MS
# apart, on PORT (0: any; up := the port it listens on, its first line).
fake=''
fake_start() {
	if [ -n "$fake" ]; then
		kill "$fake" 2>/dev/null || true
		wait "$fake" 2>/dev/null || true
	fi
	FAKE_DELTA_MS=$1 node "$root/tests/upstream/fake-anthropic.mjs" "$2" >"$work/upstream.out" 2>/dev/null &
	fake=$!
	pids+=("$fake")
	up=''
	for _ in $(seq 300); do
		up=$(head -n1 "$work/upstream.out" 2>/dev/null | tr -dc 0-9)
		[ -n "$up" ] && break
		sleep 0.1
	done
	[ -n "$up" ] || { echo "the fake upstream did not start" >&2; exit 1; }
}
fake_start "$delta" 0

# pool_pss PID: the pool below PID (itself included): "PROCS PSS_KB UNREADABLE", and the
# sum per program name in $work/by-comm.
pool_pss() {
	local pid comm pss n=0 total=0 bad=0
	: >"$work/by-comm"
	for pid in $(ps -e -o pid=,ppid= | awk -v r="$1" '{ p[$1] = $2 }
		END { for (x in p) { y = x; while (y in p && y != r && y > 1) y = p[y]; if (y == r) print x } }'); do
		comm=$(cat "/proc/$pid/comm" 2>/dev/null) || continue
		if pss=$(awk '/^Pss:/ { print $2 }' "/proc/$pid/smaps_rollup" 2>/dev/null) && [ -n "$pss" ]; then
			n=$((n + 1))
			total=$((total + pss))
			printf '%s %s\n' "$comm" "$pss" >>"$work/by-comm"
		else
			bad=$((bad + 1))
		fi
	done
	echo "$n $total $bad"
}

# report PROFILE MOMENT "PROCS PSS UNREADABLE": one line, then the programs' shares.
report() {
	local procs kb bad
	read -r procs kb bad <<<"$3"
	printf '%-8s %-10s %3d processes  PSS %6.1f MiB%s\n' "$1" "$2" "$procs" \
		"$(awk -v k="$kb" 'BEGIN { print k / 1024 }')" \
		"$([ "$bad" -eq 0 ] || echo "  ($bad unreadable, not counted)")"
	awk '{ s[$1] += $2; c[$1]++ } END { for (k in s) printf "           %-16s %2d x  %7.1f MiB\n", k, c[k], s[k] / 1024 }' \
		"$work/by-comm" | sort -k4 -rn
}

chat() { # chat PORT STREAM: one completion through the pool, bounded
	curl -sS --max-time "$max_s" -o /dev/null -w '%{http_code}\n' "http://127.0.0.1:$1/v1/chat/completions" \
		-H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
		-d "{\"model\":\"claude-fake\",\"stream\":$2,\"messages\":[{\"role\":\"user\",\"content\":\"Say hello\"}]}"
}

run_profile() {
	local name=$1 dir=$work/$1 procs config port lt i best=0 best_s="" s kb
	mkdir -m 0700 "$dir" "$dir/home" "$dir/run"
	case $name in
	default) procs=""; config='{"auth":{"allow_anonymous":false}}' ;;
	1gb) procs=1
	     config='{"auth":{"allow_anonymous":false},"server":{"threads":4},"sandbox":{"warm_per_policy":1,"prestart_max":0}}' ;;
	*) echo "unknown profile $name (default, 1gb)" >&2; return 1 ;;
	esac
	printf '%s\n' "$config" >"$dir/home/config.json"
	cat >"$dir/home/models-registry.json" <<JSON
{"providers":{"anthropic":{"type":"claude","bin":"$claude","timeout_s":$((max_s > 120 ? max_s : 120)),"credentials":[],
 "network":{"upstream":"http://127.0.0.1:$up"},"env":{"ANTHROPIC_API_KEY":"sk-ant-fake-key"},
 "models":[{"id":"claude-fake"}]}}}
JSON
	port=$(free_port)
	env OLP_BIN="$build/fcgi/olp-fcgi" OLP_HOME="$dir/home" OLP_RUN_DIR="$dir/run" \
		OLP_PORT="$port" OLP_OWNER_TOKEN="$token" OLP_LOG_LEVEL=info OLP_WORKER_LOG="$dir/olp.log" \
		${procs:+OLP_MAX_PROCS=$procs} lighttpd -D -f "$root/lighttpd/olp.conf" &
	lt=$!
	pids+=("$lt")
	for _ in $(seq $((max_s * 10))); do
		curl -sf --max-time 2 -o /dev/null "http://127.0.0.1:$port/health/live" && break
		sleep 0.1
	done
	sleep $((settle / 4 > 2 ? settle / 4 : 2)) # every worker up (a quarter of the settling time)
	grep -ho '"msg":"machine:[^"]*' "$dir/olp.log" | sort -u | sed 's/"msg":/         worker: /'
	report "$name" start "$(pool_pss "$lt")"
	# A few requests, one after the other: each leaves its policy's warm sandboxes and,
	# where they are on, a pre-started claude waiting (ADR 0008, 0022).
	for i in 1 2 3 4; do [ "$(chat "$port" false)" = 200 ] || echo "request $i failed" >&2; done
	sleep "$settle" # the refills (a claude's start-up) are done
	report "$name" idle "$(pool_pss "$lt")"
	[ "$stream_delta" = "$delta" ] || fake_start "$stream_delta" "$up"
	for i in 1 2 3 4; do chat "$port" true >"$dir/stream-$i.code" & done
	# Samples every 250 ms until the four have answered (each lasts about 6 delta
	# intervals after its claude starts; every curl is bounded by POOL_MAX_S).
	while ! streams_done "$dir"; do
		sleep 0.25
		s=$(pool_pss "$lt")
		read -r _ kb _ <<<"$s"
		if [ "$kb" -gt "$best" ]; then best=$kb; best_s=$s; cp "$work/by-comm" "$work/by-comm.best"; fi
	done
	wait_streams "$dir"
	cp "$work/by-comm.best" "$work/by-comm"
	report "$name" "4 streams" "$best_s"
	[ "$stream_delta" = "$delta" ] || fake_start "$delta" "$up"
	kill "$lt"
	wait "$lt" 2>/dev/null || true
}

streams_done() { # true when the 4 streams' curls have all written their status
	local i
	for i in 1 2 3 4; do [ -s "$1/stream-$i.code" ] || return 1; done
}

wait_streams() { # the 4 streams' answers (the curls are bounded by --max-time)
	local i
	for i in 1 2 3 4; do
		while [ ! -s "$1/stream-$i.code" ]; do sleep 0.2; done
		[ "$(cat "$1/stream-$i.code")" = 200 ] || echo "stream $i: HTTP $(cat "$1/stream-$i.code")" >&2
	done
}

echo "pool memory (PSS), $(nproc) CPUs, $(awk '/^MemTotal:/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo), $(uname -m)"
for p in $profiles; do run_profile "$p"; done

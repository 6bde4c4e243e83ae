#!/usr/bin/env bash
# load.sh — bounded load on loopback (issue 10, "Load"): the real stack (lighttpd with
# lighttpd/olp.conf, olp-fcgi workers, a streaming command provider in the sandbox) on
# 127.0.0.1 with a temporary OLP_HOME, then
#
#  1. wrk -t2 -c64 on GET /health for 60 s;
#  2. 64 clients each looping streaming chat completions (stream: true, read to
#     [DONE], every line checked) for 60 s; the provider's max_concurrent allows 64;
#
# with per worker fds and RSS, lighttpd's fds, zombies, scratch dirs and sandbox
# processes sampled after a warm-up and again after the load has settled. Prints a
# report; exits 1 if any request failed, or fds, zombies, scratch dirs or sandbox
# processes grew, or a worker's RSS grew by more than LOAD_RSS_SLACK_KB (16 MiB).
#
# The stack is started and sampled by tests/integration/harness.mjs, the integration
# tests' own; tests/bench/load.mjs drives the load (its header lists every knob).
#
# usage: tests/bench/load.sh [BUILD_DIR]   (default: build/bench; configured and built each run)
# env:   LOAD_HEALTH_SECONDS, LOAD_STREAM_SECONDS (default 60 each), LOAD_CONNS (64),
#        LOAD_WARMUP_SECONDS (5), LOAD_TICKS, LOAD_TICK_MS (20 lines 50 ms apart),
#        LOAD_PROCS, LOAD_THREADS (2 workers x 40), LOAD_WARM (1), LOAD_RSS_SLACK_KB,
#        LOAD_KEEPALIVE (0: a new connection per streaming request), LOAD_HEARTBEAT_MS
#        (streaming.heartbeat_interval_ms), LOAD_JSON (write the figures there too)
# The CTest entry load_short (label "load") runs it for 10 s each.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build/bench}

for tool in wrk node lighttpd; do
	PATH=$PATH:/usr/sbin:/sbin command -v "$tool" >/dev/null ||
		{ echo "load.sh: $tool missing (apt-get install $tool)" >&2; exit 2; }
done
# shellcheck source=tests/bench/lib.sh
. "$(dirname "$0")/lib.sh" # bench_build
bench_build "$build" olp-fcgi olp-sandbox-exec tick-emitter

export OLP_BIN
OLP_BIN=$(realpath "$build/fcgi/olp-fcgi")
export LOAD_EMITTER
LOAD_EMITTER=$(realpath "$build/tests/bench/tick-emitter")
export LIGHTTPD=${LIGHTTPD:-$(PATH=$PATH:/usr/sbin:/sbin command -v lighttpd)}
exec node "$root/tests/bench/load.mjs"

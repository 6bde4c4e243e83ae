#!/usr/bin/env bash
# egress-bench.sh — the egress forwarder (egress/) measured against going to the upstream
# directly, side by side in one run (egress-bench.c; issue 12).
#
#  (a) Overhead per request: keep-alive connections, one direct to a test upstream on
#      127.0.0.1 and one through the forwarder (upstream mode, a credential header set),
#      requests alternating between the two; medians and their difference. A small GET, a
#      32 KiB POST (a prompt), and a new connection per request. Goal: <= 1 ms median.
#  (b) Streaming: SSE events 20 ms apart, each stamped by the upstream with the time it
#      wrote it; the direct and the forwarded stream run at the same time, so that both
#      see the same machine. Gap distortion: how much each gap between two events changed
#      on the way. Goal: within 2 ms.
#  (c) Throughput: a large body read directly, through upstream mode (libcurl), and
#      through a CONNECT tunnel (the relay), in MB/s. Goal: relay >= 200 MB/s.
#
# Upstream, forwarder and client share this machine's cores: on a busy 2-core host the
# tails say more about the host than about the forwarder. Compare the two columns, and
# look at the load average printed first.
#
# usage: tests/bench/egress-bench.sh [BUILD_DIR]   (default: build/bench; configured and built each run)
# env:   BENCH_REQUESTS (each way, 2000), BENCH_EVENTS (a stream, 100), BENCH_GAP_MS (20),
#        BENCH_MB (size for (c), 512), BENCH_ROUNDS (3)
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build/bench}

# shellcheck source=tests/bench/lib.sh
. "$(dirname "$0")/lib.sh" # bench_build
bench_build "$build" egress-bench
type=$(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$build/CMakeCache.txt")
echo "egress-bench: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)," \
	"build ${type:-RelWithDebInfo}"
exec "$build/tests/bench/egress-bench" "${BENCH_REQUESTS:-2000}" "${BENCH_EVENTS:-100}" \
	"${BENCH_GAP_MS:-20}" "${BENCH_MB:-512}" "${BENCH_ROUNDS:-3}"

#!/usr/bin/env bash
# hosts-bench.sh — several hosts on one PostgreSQL against one host on its embedded store
# (issue 25, ADR 0034), interleaved in one run: GET /health requests/s and the latency a
# stored key's check adds, what a quota check costs, and 64 concurrent clients over two
# hosts behind HAProxy with a requests_per_day quota: the overshoot (must be 0). The work is
# tests/bench/hosts-bench.mjs, on the integration harness (tests/integration/hosts.mjs),
# under a throwaway PostgreSQL cluster (tests/pg/with-pg.sh). Exits 1 when the quota was
# not exact.
#
# usage: tests/bench/hosts-bench.sh [BUILD_DIR]   (default: build/bench; configured and built each run)
# env:   BENCH_SECONDS (per wrk round, 5), BENCH_ROUNDS (per side, 3), BENCH_CONNS (16),
#        BENCH_CHATS (chat completions per key and side, 100), BENCH_QUOTA (requests_per_day
#        of the overshoot run, 100; 6x as many requests are sent), BENCH_CLIENTS (64),
#        BENCH_THREADS (threads per worker, 8), BENCH_PG_FAST=1 (keep with-pg.sh's fsync=off;
#        by default the cluster is switched to fsync, synchronous_commit and full_page_writes
#        on, as a production server runs, like store-bench.sh)
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build/bench}
for t in wrk haproxy node; do
	PATH=$PATH:/usr/sbin command -v "$t" >/dev/null ||
		{ echo "$t missing: run deploy/olp-local test first (it installs it)" >&2; exit 1; }
done
# shellcheck source=tests/bench/lib.sh
. "$(dirname "$0")/lib.sh"
bench_build "$build" olp-fcgi olp-keys olp-sandbox-exec
build=$(cd "$build" && pwd)

cd "$root"
export OLP_BIN=$build/fcgi/olp-fcgi OLP_KEYS=$build/auth/olp-keys OLP_SOURCE_DIR=$root
export OLP_TEST_PG_REQUIRED=1 PATH=$PATH:/usr/sbin BENCH_PG_FAST=${BENCH_PG_FAST:-0}
# shellcheck disable=SC2016 # expanded by the inner shell, under with-pg.sh
"$root/tests/pg/with-pg.sh" bash -c '
	set -eu
	if [ "$BENCH_PG_FAST" != 1 ]; then
		"$OLP_TEST_PG_CTL" psql -c "ALTER SYSTEM SET fsync = on" \
			-c "ALTER SYSTEM SET synchronous_commit = on" \
			-c "ALTER SYSTEM SET full_page_writes = on" -c "SELECT pg_reload_conf()" >/dev/null
	fi
	echo "# PostgreSQL $("$OLP_TEST_PG_CTL" psql -tA -c "SHOW server_version") on 127.0.0.1 (TCP)," \
		"fsync=$("$OLP_TEST_PG_CTL" psql -tA -c "SHOW fsync")" \
		"synchronous_commit=$("$OLP_TEST_PG_CTL" psql -tA -c "SHOW synchronous_commit")"
	exec node "$OLP_SOURCE_DIR/tests/bench/hosts-bench.mjs"
'

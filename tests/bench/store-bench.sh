#!/usr/bin/env bash
# The shared PostgreSQL store against the embedded SQLite store on the request path
# (ADR 0034, issue 25: a quota check at most 1 ms median against a PostgreSQL on the same
# machine), the calls of both interleaved in one run: quota checks (allowed: counted, and
# refused), the ledger row (PostgreSQL: queued for the writer thread) and a key's
# concurrency lease (slot files vs olp_leases).
#
# usage: tests/bench/store-bench.sh [BUILD_DIR] [-- CALLS]
#   BUILD_DIR defaults to build/bench. PostgreSQL is a throwaway cluster of the
#   distribution's server (tests/pg/with-pg.sh), switched to fsync=on and
#   synchronous_commit=on for the run, as a production server runs (the test clusters run
#   without). The SQLite store is in a fresh directory under $TMPDIR (default /tmp).
set -eu
top=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$top/build/bench}
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
bin="$build/tests/bench/store-bench"
# shellcheck source=tests/bench/lib.sh
. "$(dirname "$0")/lib.sh" # bench_build
bench_build "$build" store-bench
home=$(mktemp -d "${TMPDIR:-/tmp}/olp-store-bench.XXXXXX")
trap 'rm -rf "$home"' EXIT
export STORE_BENCH_BIN=$bin STORE_BENCH_HOME=$home
# shellcheck disable=SC2016 # expanded by the inner shell, under with-pg.sh
"$top/tests/pg/with-pg.sh" bash -c '
	set -eu
	"$OLP_TEST_PG_CTL" psql -c "ALTER SYSTEM SET fsync = on" \
		-c "ALTER SYSTEM SET synchronous_commit = on" \
		-c "ALTER SYSTEM SET full_page_writes = on" -c "SELECT pg_reload_conf()" >/dev/null
	echo "# store-bench: $(git -C "'"$top"'" rev-parse --short HEAD 2>/dev/null || echo unknown)," \
		"$(uname -srm), $(nproc) CPUs, PostgreSQL $("$OLP_TEST_PG_CTL" psql -tA -c "SHOW server_version")" \
		"on 127.0.0.1 (TCP), fsync=on synchronous_commit=on; SQLite WAL synchronous=NORMAL"
	echo "# stores on: $(df -PT "$STORE_BENCH_HOME" | awk "NR==2 {print \$2}"), $(df -PT "$OLP_TEST_PG_DIR" | awk "NR==2 {print \$2}"); load $(cut -d" " -f1-3 /proc/loadavg)"
	"$STORE_BENCH_BIN" "$STORE_BENCH_HOME" "$OLP_TEST_PG_URL" "$@"
' store-bench "$@"

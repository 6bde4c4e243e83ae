#!/usr/bin/env bash
# Token-check time of auth/ with 10 and 1,000 keys in the store, side by side.
# Goal (issue 3): median <= 50 us at 1,000 keys, with revocation still immediate.
# With --pg, the same keys in the shared PostgreSQL store too (ADR 0034, issue 25): a
# throwaway cluster of the distribution's server (tests/pg/with-pg.sh), its schema made by
# olp-keys store init, and the two stores run interleaved, files then PostgreSQL, twice.
#
# usage: tests/bench/auth-bench.sh [BUILD_DIR] [--pg] [-- extra auth-bench arguments]
#   BUILD_DIR defaults to build/bench; the auth-bench target (and with --pg olp-keys) is
#   built there each run. The stores are created under $TMPDIR (default /tmp) and removed
#   afterwards.
set -eu
top=$(cd "$(dirname "$0")/../.." && pwd)
build=$top/build/bench
case ${1:-} in
"" | --pg | --) ;;
*)
	build=$1
	shift
	;;
esac
pg=0
if [ "${1:-}" = --pg ]; then
	pg=1
	shift
fi
[ "${1:-}" = "--" ] && shift
bin="$build/tests/auth/auth-bench"
# shellcheck source=tests/bench/lib.sh
. "$(dirname "$0")/lib.sh" # bench_build
header() {
	echo "# auth-bench: $(git -C "$top" rev-parse --short HEAD 2>/dev/null || echo unknown)," \
		"$(uname -srm), $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
	echo "# store on: $(df -PT "${TMPDIR:-/tmp}" | awk 'NR==2 {print $2}') (${TMPDIR:-/tmp}); load $(cut -d' ' -f1-3 /proc/loadavg)"
}
if [ $pg = 0 ]; then
	bench_build "$build" auth-bench
	header
	exec "$bin" "$@" 10 1000
fi

bench_build "$build" auth-bench olp-keys
header
export AUTH_BENCH_BIN=$bin AUTH_BENCH_KEYS=$build/auth/olp-keys
# shellcheck disable=SC2016 # expanded by the inner shell, under with-pg.sh
exec "$top/tests/pg/with-pg.sh" bash -c '
	set -eu
	OLP_STORE=$OLP_TEST_PG_ADMIN_URL "$AUTH_BENCH_KEYS" store init --worker-role=olp_worker >/dev/null
	echo "# PostgreSQL $("$OLP_TEST_PG_CTL" psql -tA -c "SHOW server_version") on 127.0.0.1 (TCP)"
	for round in 1 2; do
		echo "== round $round: files"
		"$AUTH_BENCH_BIN" "$@" 10 1000
		echo "== round $round: postgresql"
		"$AUTH_BENCH_BIN" "$@" -s "$OLP_TEST_PG_URL" 10 1000
	done
' auth-bench "$@"

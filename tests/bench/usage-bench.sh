#!/usr/bin/env bash
# The usage ledger and quota check (usage/, issue 14), one call at a time on a store on
# disk. Goals: usage_record_add median <= 0.2 ms, usage_quota_take <= 20 us.
#
# usage: tests/bench/usage-bench.sh [BUILD_DIR] [-- CALLS]
#   BUILD_DIR defaults to build/bench; the usage-bench target is built there each run.
#   The store is made in a fresh directory under $TMPDIR (default /tmp), which must be on
#   the disk the real OLP_HOME would be on (not a tmpfs), and removed afterwards.
set -eu
top=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$top/build/bench}
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
bin="$build/tests/bench/usage-bench"
# shellcheck source=tests/bench/lib.sh
. "$(dirname "$0")/lib.sh" # bench_build
bench_build "$build" usage-bench
home=$(mktemp -d "${TMPDIR:-/tmp}/olp-usage-bench.XXXXXX")
trap 'rm -rf "$home"' EXIT
echo "# usage-bench: $(git -C "$top" rev-parse --short HEAD 2>/dev/null || echo unknown)," \
	"$(uname -srm), $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')," \
	"SQLite $(pkg-config --modversion sqlite3 2>/dev/null || echo '?')"
echo "# store on: $(df -PT "$home" | awk 'NR==2 {print $2}') ($home), WAL, synchronous=NORMAL; load $(cut -d' ' -f1-3 /proc/loadavg)"
"$bin" "$home" "$@"
echo "# ledger after the run: $(du -sh "$home" | cut -f1)"

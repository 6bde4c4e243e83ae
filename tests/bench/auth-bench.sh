#!/usr/bin/env bash
# Token-check time of auth/ with 10 and 1,000 keys in the store, side by side.
# Goal (issue 3): median <= 50 us at 1,000 keys, with revocation still immediate.
#
# usage: tests/bench/auth-bench.sh [BUILD_DIR] [-- extra auth-bench arguments]
#   BUILD_DIR defaults to build/bench; the auth-bench target is built there each run.
#   The stores are created under $TMPDIR (default /tmp) and removed afterwards.
set -eu
top=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$top/build/bench}
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
bin="$build/tests/auth/auth-bench"
# shellcheck source=tests/bench/lib.sh
. "$(dirname "$0")/lib.sh" # bench_build
bench_build "$build" auth-bench
echo "# auth-bench: $(git -C "$top" rev-parse --short HEAD 2>/dev/null || echo unknown)," \
	"$(uname -srm), $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "# store on: $(df -PT "${TMPDIR:-/tmp}" | awk 'NR==2 {print $2}') (${TMPDIR:-/tmp})"
exec "$bin" "$@" 10 1000

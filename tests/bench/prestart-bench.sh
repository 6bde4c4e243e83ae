#!/usr/bin/env bash
# prestart-bench.sh — pre-started provider processes (issue 15, ADR 0022), measured with the
# real claude (and codex) from tests/provider-clis against the fake upstreams of
# tests/upstream, through lighttpd → olp-fcgi → sandbox, against the same CLI run directly,
# interleaved in one run, one request about every BENCH_PACE_MS (a person's pace):
#   - time to the first content byte of a streamed completion (prestart hit) vs the CLI's
#     first text delta run directly (goal <= 0.5x);
#   - the non-streaming round trip (hit) vs the CLI run directly to its exit (goal <=
#     direct + 10 ms);
#   - a miss (a key not seen before: another max_tokens) vs the cold path (a provider with
#     prestart 0);
#   - the memory of the idle pre-started processes (RSS and PSS of each process tree).
# The machine is shared and noisy: medians, and the comparison within one run, are what
# count.
#
# usage: tests/bench/prestart-bench.sh [BUILD_DIR]   (default: build/bench; configured and built each run)
# env:   BENCH_RUNS (default 7), BENCH_PACE_MS (1000), BENCH_CODEX=0 to skip codex
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build/bench}
command -v lighttpd >/dev/null || { echo "lighttpd missing: run deploy/olp-local test first" >&2; exit 1; }
command -v node >/dev/null || { echo "node missing" >&2; exit 1; }
[ -x "$root/tests/provider-clis/node_modules/@anthropic-ai/claude-code/bin/claude.exe" ] ||
	{ echo "run npm ci in tests/provider-clis first" >&2; exit 1; }
# shellcheck source=tests/bench/lib.sh
. "$(dirname "$0")/lib.sh" # bench_build
bench_build "$build" olp-fcgi olp-sandbox-exec
exec node "$root/tests/bench/prestart-bench.mjs" "$root" "$(realpath "$build")"

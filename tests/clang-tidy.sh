#!/usr/bin/env bash
# clang-tidy.sh — the style_clang_tidy CTest: the checked-in .clang-tidy over every C file of
# the build (compile_commands.json) but the fuzz targets, which must give no finding.
# Exits 77 (CTest skip) when run-clang-tidy is not installed (Debian: clang-tidy).
#
# usage: clang-tidy.sh BUILD_DIR [JOBS [HEADER_FILTER]]
#   HEADER_FILTER: the headers whose findings count (CMake passes every module's, from
#   OLP_MODULES); default .clang-tidy's HeaderFilterRegex.
set -uo pipefail

build=$1 jobs=${2:-2} hfilter=${3:-}

if ! command -v run-clang-tidy >/dev/null 2>&1; then
	echo "clang-tidy.sh: SKIP: run-clang-tidy not found (install the clang-tidy package)"
	exit 77
fi
[ -f "$build/compile_commands.json" ] || {
	echo "clang-tidy.sh: no $build/compile_commands.json (configure with CMake first)" >&2
	exit 1
}

esc=$(printf '\033')
# The file regex: C sources, not tests/fuzz (built only with ENABLE_FUZZ, and libFuzzer
# entry points follow libFuzzer's conventions, not ours).
filter=()
[ -z "$hfilter" ] || filter=(-header-filter="$hfilter")
out=$(run-clang-tidy -p "$build" -j "$jobs" -quiet "${filter[@]}" '^(?!.*/tests/fuzz/).*\.c$' 2>&1)
rc=$?
# Without the colours it forces, the command line it echoes for each file, and clang's
# "N warnings generated." (findings outside the checks and the headers we own).
out=$(printf '%s\n' "$out" | sed "s/$esc\[[0-9;]*m//g" |
	grep -v -E '^clang-tidy|^[0-9]+ warnings? generated\.$')
printf '%s\n' "$out"
findings=$(printf '%s\n' "$out" | grep -c -E '(warning|error): ')
if [ "$rc" -ne 0 ] || [ "$findings" -ne 0 ]; then
	echo "clang-tidy.sh: FAIL: $findings finding(s), run-clang-tidy exit $rc"
	exit 1
fi
echo "clang-tidy.sh: no findings"

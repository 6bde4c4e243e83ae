#!/usr/bin/env bash
# netns-bench.sh — what a run's own loopback-only network namespace costs (issue 12):
# spawn-bench with the default policy (network none: bwrap --unshare-net) against the same
# policy in SBX_NET_LOOPBACK (the namespace made in the run's user namespace with its
# listener, joined by the child before bwrap), cold and warm. Rounds alternate none,
# loopback, none, loopback… so that machine noise hits both alike; the figures are the
# medians of each round's median, and the difference is what a request in upstream or
# CONNECT mode pays for its namespace (the forwarder's own cost: egress-bench.sh).
#
# usage: tests/bench/netns-bench.sh [BUILD_DIR]   (default: build/bench; configured and built each run)
# env:   BENCH_N (runs per round, default 100), BENCH_ROUNDS (default 3)
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build/bench}
n=${BENCH_N:-100}
rounds=${BENCH_ROUNDS:-3}

# shellcheck source=tests/bench/lib.sh
. "$(dirname "$0")/lib.sh" # bench_build
bench_build "$build" spawn-bench olp-sandbox-exec
build=$(cd "$build" && pwd)
work=$(mktemp -d /tmp/olp-netns-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT

median() { sort -n | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }

echo "== spawn-bench, $rounds alternating rounds of $n runs each (/usr/bin/true)"
for r in $(seq "$rounds"); do
	for net in none loopback; do
		mkdir -p "$work/rt-$net-$r"
		"$build/tests/bench/spawn-bench" --net "$net" "$work/rt-$net-$r" "$n" \
			"$build/sandbox/olp-sandbox-exec" /usr/bin/true >"$work/$net-$r.txt"
		printf 'round %d %-8s cold %s ms, warm %s ms\n' "$r" "$net" \
			"$(awk '/^sandbox_cold_median_ms/ {print $2}' "$work/$net-$r.txt")" \
			"$(awk '/^sandbox_warm_median_ms/ {print $2}' "$work/$net-$r.txt")"
	done
done
declare -A med
for kind in cold warm; do
	for net in none loopback; do
		med[$kind-$net]=$(cat "$work"/"$net"-*.txt |
			awk -v k="sandbox_${kind}_median_ms" '$1 == k {print $2}' | median)
		printf '%s_%s_ms %.3f\n' "$kind" "$net" "${med[$kind-$net]}"
	done
	awk -v k="$kind" -v a="${med[$kind-none]}" -v b="${med[$kind-loopback]}" \
		'BEGIN {printf "%s_loopback_minus_none_ms %.3f (ratio %.2f)\n", k, b - a, b / a}'
done

#!/usr/bin/env bash
# sandbox-bench.sh — what one sandboxed spawn costs, side by side in one run (hyperfine,
# interleaving nothing but running every variant in the same invocation):
#   bare      /usr/bin/true
#   bwrap     plain bwrap --unshare-all with a minimal root (the floor any bwrap sandbox pays)
#   wrapped   the plain bwrap run, exec'd in place by bwrap-policy --plain
#   policy    bwrap with exactly olp-sandbox's argv and inputs, exec'd in place by
#             bwrap-policy in the run's own user namespace (no supervising process, no
#             scratch dir, no teardown); minus "wrapped", what the policy costs inside bwrap
#   olp       olp-sandbox -- /usr/bin/true: the full policy (seccomp, rlimits, scratch dir,
#             read-only root, the /etc files, the run's own uid and its user namespace,
#             olp-sandbox-exec taking it, cgroup when one is delegated)
#   srt       srt /usr/bin/true from @anthropic-ai/sandbox-runtime (the Node OLP's choice)
# Goals (issue 9): olp ≤ 1.7 × bwrap (medians), srt / olp ≥ 40.
#
# usage: tests/bench/sandbox-bench.sh [BUILD_DIR]  (default: build/bench; configured and built each run)
# env:   BENCH_RUNS (default 200), SRT_RUNS (default 20)
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build/bench}
runs=${BENCH_RUNS:-200}
srt_runs=${SRT_RUNS:-20}
here=$root/tests/bench

need=()
for t in hyperfine socat rg bwrap jq; do command -v "$t" >/dev/null || need+=("$t"); done
if [ ${#need[@]} -gt 0 ]; then
	mapfile -t pkgs < <(printf '%s\n' "${need[@]}" | sed 's/^rg$/ripgrep/; s/^bwrap$/bubblewrap/')
	echo "installing: ${pkgs[*]}"
	apt-get install -y -q "${pkgs[@]}" >/dev/null
fi
# shellcheck source=tests/bench/lib.sh
. "$(dirname "$0")/lib.sh" # bench_build
bench_build "$build" olp-sandbox bwrap-policy
if [ ! -x "$here/node_modules/.bin/srt" ]; then
	(cd "$here" && npm ci --no-audit --no-fund >/dev/null)
fi

work=$(mktemp -d /tmp/olp-sbx-bench.XXXXXX)
# olp-sandbox's scratch dirs go where a host keeps runtime state: a tmpfs, as
# $XDG_RUNTIME_DIR and /run are on a systemd host (mkdir/rmdir on a journaling disk cost
# ~0.5 ms more). /dev/shm is the tmpfs every host has.
rundir=$(mktemp -d /dev/shm/olp-sbx-bench.XXXXXX 2>/dev/null || mktemp -d /tmp/olp-sbx-run.XXXXXX)
trap 'rm -rf "$work" "$rundir"' EXIT
mkdir -p "$work/home"
cd "$work"

links=(--symlink usr/bin /bin --symlink usr/sbin /sbin --symlink usr/lib /lib --symlink usr/lib64 /lib64)
plain=(bwrap --unshare-all --ro-bind /usr /usr "${links[@]}" --proc /proc --dev /dev -- /usr/bin/true)
q() { printf '%q ' "$@"; }

# Rounds with the order rotated: run back to back, a variant pays for the asynchronous
# teardown (network namespaces, exits) of the runs before it, so a fixed order would
# favour whichever runs first. Each median is over all rounds' samples.
names=(bare bwrap wrapped policy olp)
cmds=("/usr/bin/true" "$(q "${plain[@]}")"
	"$(q "$build/tests/bench/bwrap-policy" --plain "$work/home" /usr/bin/true)"
	"$(q "$build/tests/bench/bwrap-policy" "$work/home" /usr/bin/true)"
	"$(q "$build/sandbox/olp-sandbox" --runtime-dir "$rundir" -- /usr/bin/true)")
rounds=${BENCH_ROUNDS:-5}
per=$(((runs + rounds - 1) / rounds))
echo "== $((per * rounds)) runs each in $rounds rounds (srt: $srt_runs), hyperfine -N"
for ((r = 0; r < rounds; r++)); do
	args=()
	for ((i = 0; i < ${#names[@]}; i++)); do
		k=$(((i + r) % ${#names[@]}))
		args+=(-n "${names[k]}" "${cmds[k]}")
	done
	hyperfine -N --warmup 3 --runs "$per" --export-json "$work/a$r.json" "${args[@]}" >/dev/null
done
hyperfine -N --warmup 2 --runs "$srt_runs" --export-json "$work/b.json" \
	-n srt "$(q "$here/node_modules/.bin/srt" /usr/bin/true)" \
	-n olp "${cmds[4]}" >/dev/null

# Median in ms of every sample of variant $1 over all rounds.
medall() {
	jq -s -r --arg n "$1" '[.[].results[] | select(.command == $n) | .times[]] | sort |
		(if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end) * 1000' \
		"$work"/a*.json
}
med() { jq -r --arg n "$2" '.results[] | select(.command == $n) | .median * 1000' "$1"; }
bare=$(medall bare); plainm=$(medall bwrap); wrapped=$(medall wrapped)
pol=$(medall policy); olp=$(medall olp)
srt=$(med b.json srt); olp2=$(med b.json olp)
printf 'bare_true_median_ms %.2f\n' "$bare"
printf 'bwrap_unshare_all_median_ms %.2f\n' "$plainm"
printf 'bwrap_unshare_all_wrapped_median_ms %.2f\n' "$wrapped"
printf 'bwrap_olp_policy_median_ms %.2f\n' "$pol"
printf 'olp_sandbox_median_ms %.2f\n' "$olp"
printf 'srt_median_ms %.2f (olp in the same invocation: %.2f)\n' "$srt" "$olp2"
awk -v o="$olp" -v p="$plainm" -v s="$srt" -v o2="$olp2" -v pol="$pol" -v w="$wrapped" 'BEGIN {
	printf "olp_over_bwrap %.2fx (goal <= 1.7)\n", o / p
	printf "olp_minus_bwrap_ms %.2f\n", o - p
	printf "  the policy inside bwrap %.2f (policy - wrapped)\n", pol - w
	printf "  olp-sandbox as a process %.2f (olp - policy)\n", o - pol
	printf "  one more static exec %.2f (wrapped - bwrap)\n", w - p
	printf "srt_over_olp %.1fx (goal >= 40)\n", s / o2
}'

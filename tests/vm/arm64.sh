#!/usr/bin/env bash
# arm64.sh -- OLP built for arm64 on this x86-64 host and tested (docs/adr/0031-arm64.md):
#
#   1. the cross build (deploy/cross/aarch64-linux-gnu.cmake: Debian's cross gcc and the
#      :arm64 libraries) in BUILD_DIR, with -Werror; incremental when BUILD_DIR exists;
#   2. the CUnit suites that need no kernel feature, under qemu user emulation (CTest's
#      emulator): USER_SUITES below;
#   3. unless --no-vm: an arm64 Debian VM (tests/vm/olp-vm --arch arm64, TCG) runs
#      tests/vm/arm64-vm.sh on the build: the guest's uname -m, unit_sandbox,
#      unit_metrics, the escape suite as root and as www-data, requests through lighttpd
#      to a command provider and to the real claude (its arm64 build) against the fake
#      Anthropic upstream.
#
# The arm64 claude is the version tests/provider-clis/package-lock.json pins
# (@anthropic-ai/claude-code-linux-arm64, a native binary), fetched once with npm pack,
# checked against the lock file's integrity and kept unpacked in
# ${OLP_VM_CACHE:-/var/cache/olp-vm}/arm64/claude/VERSION (385 MB; the guest reads it
# over a read-only share). When it cannot be fetched (no npm, no registry) the claude
# step is skipped and says why; everything else still runs.
#
# --pool-memory: instead of the tests, tests/bench/pool-memory.sh in the VM (4 GiB, so
# that the default profile is sized as on a large host, as the x86-64 figures were) on
# the build, with the arm64 claude: memory, which emulation does not change, never time.
#
# Exit 77 (a skip, with the reason) only for a host that cannot do it: no cross
# toolchain or qemu (deploy/olp-local installs them), or a VM that cannot boot for a
# reason of the host (olp-vm --unavailable-status 77).  Everything else passes or fails.
#
# usage: tests/vm/arm64.sh [--no-vm | --pool-memory] BUILD_DIR
set -euo pipefail

SRC=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)
# Those of unit_* that qemu-user runs as the kernel would: the others need namespaces,
# cgroups or seccomp(2), which qemu-user does not emulate (they run in the VM, or on the
# host in the x86 build), and unit_metrics reads /proc/self/stat, which qemu-user fakes.
USER_SUITES='^unit_(common|providers|providers_command_output|providers_logins|fcgi|auth|egress|egress_connect_addrs|usage)$'

vm=1
case ${1:-} in
--no-vm) vm=0; shift ;;
--pool-memory) vm=pool; shift ;;
esac
[ $# -eq 1 ] || {
	echo "usage: $0 [--no-vm | --pool-memory] BUILD_DIR" >&2
	exit 2
}
bdir=$1
t0=$SECONDS
say() { printf 'arm64: [%4ds] %s\n' "$((SECONDS - t0))" "$*" >&2; }
skip() {
	say "SKIP: $*"
	exit 77
}

for t in aarch64-linux-gnu-gcc qemu-aarch64-static; do
	command -v "$t" >/dev/null 2>&1 ||
		skip "no $t on this host (deploy/olp-local build --arch arm64 installs it)"
done
[ -f /usr/lib/aarch64-linux-gnu/pkgconfig/jansson.pc ] ||
	skip "no :arm64 libraries on this host (deploy/olp-local build --arch arm64 installs them)"

mkdir -p "$bdir"
bdir=$(cd -- "$bdir" && pwd) # the guest sees it at the same, absolute, path
say "cross build in $bdir"
cmake -S "$SRC" -B "$bdir" -DCMAKE_TOOLCHAIN_FILE="$SRC/deploy/cross/aarch64-linux-gnu.cmake" \
	-DENABLE_WERROR=ON -DBUILD_TESTING=ON >"$bdir/arm64-configure.log" ||
	{ cat "$bdir/arm64-configure.log" >&2; exit 1; }
cmake --build "$bdir" -j "$(nproc 2>/dev/null || echo 2)" >"$bdir/arm64-build.log" 2>&1 ||
	{ grep -E -m 30 'error|warning|Error' "$bdir/arm64-build.log" >&2; exit 1; }
for f in sandbox/olp-sandbox-exec sandbox/olp-sandbox fcgi/olp-fcgi; do
	file -b "$bdir/$f" 2>/dev/null | grep -q 'ARM aarch64' || {
		echo "arm64: $bdir/$f is not an arm64 program: $(file -b "$bdir/$f")" >&2
		exit 1
	}
done
file -b "$bdir/sandbox/olp-sandbox-exec" | grep -q 'statically linked' || {
	echo "arm64: olp-sandbox-exec is not linked statically" >&2
	exit 1
}

if [ $vm != pool ]; then
	say "the CUnit suites under qemu user emulation"
	(cd "$bdir" && ctest --output-on-failure --no-tests=error -j 2 -R "$USER_SUITES")
fi

[ $vm != 0 ] || {
	say "done (no VM)"
	exit 0
}

# fetch_claude: claude_dir := the directory of the arm64 claude (see the header), or
# claude_why := why there is none.
claude_dir='' claude_why=''
fetch_claude() {
	local lock=$SRC/tests/provider-clis/package-lock.json pkg=@anthropic-ai/claude-code-linux-arm64
	local ver sri cache tmp
	command -v npm >/dev/null 2>&1 || { claude_why="no npm on this host"; return 0; }
	read -r ver sri < <(node -e '
		const l = require(process.argv[1]).packages["node_modules/" + process.argv[2]] || {};
		console.log(l.version || "", l.integrity || "");' "$lock" "$pkg") || true
	{ [ -n "$ver" ] && [ -n "$sri" ]; } || { claude_why="$pkg is not in $lock"; return 0; }
	cache=${OLP_VM_CACHE:-/var/cache/olp-vm}/arm64/claude
	if [ -x "$cache/$ver/claude" ]; then
		claude_dir=$cache/$ver
		return 0
	fi
	mkdir -p "$cache" 2>/dev/null || { claude_why="cannot create $cache"; return 0; }
	rm -rf "$cache"/*.tmp
	tmp=$(mktemp -d "$cache/$ver.XXXXXX.tmp")
	say "fetching $pkg@$ver (about 184 MB, once)"
	if ! (cd "$tmp" && npm pack --silent "$pkg@$ver" >/dev/null 2>"$tmp/npm.err"); then
		claude_why="npm pack $pkg@$ver failed: $(tail -n 3 "$tmp/npm.err" | paste -sd' ')"
		rm -rf "$tmp"
		return 0
	fi
	# The tarball npm gave is the one the lock file pins, or nothing is kept.
	node -e '
		const fs = require("fs"), c = require("crypto");
		const [f, sri] = process.argv.slice(1);
		const got = "sha512-" + c.createHash("sha512").update(fs.readFileSync(f)).digest("base64");
		process.exit(got === sri ? 0 : 1);' "$tmp"/*.tgz "$sri" || {
		rm -rf "$tmp"
		echo "arm64: $pkg@$ver does not match the integrity in $lock" >&2
		exit 1
	}
	{ tar -xzf "$tmp"/*.tgz -C "$tmp" package/claude package/package.json &&
		mkdir "$tmp/$ver" && mv "$tmp/package/claude" "$tmp/package/package.json" "$tmp/$ver/" &&
		file -b "$tmp/$ver/claude" | grep -q 'ARM aarch64'; } || {
		rm -rf "$tmp"
		echo "arm64: $pkg@$ver holds no arm64 claude" >&2
		exit 1
	}
	rm -rf "${cache:?}/$ver"
	mv "$tmp/$ver" "$cache/$ver"
	rm -rf "$tmp"
	claude_dir=$cache/$ver
}
fetch_claude
rc=0
if [ $vm = pool ]; then
	[ -n "$claude_dir" ] || { echo "arm64: no arm64 claude: $claude_why" >&2; exit 1; }
	say "tests/bench/pool-memory.sh in the arm64 VM (4 GiB)"
	# Under TCG a claude takes about 40 s to start, alone: the refills are given 60 s, each
	# request 600 s, and the 4 streams' deltas are 20 s apart (a stream lasts 2 minutes),
	# so that the one a pre-started claude serves is still live when the three started
	# cold (about 80 s, together) stream too: the sum is then of four live runs, as on a
	# real host with 1 s deltas.
	"$SRC/tests/vm/olp-vm" --arch arm64 --mem 4096 --timeout 3000 --unavailable-status 77 \
		--rw "$SRC" --rw "$bdir" --ro "$claude_dir" -- env POOL_BUILT=1 \
		POOL_CLAUDE="$claude_dir/claude" POOL_SETTLE_S=60 POOL_MAX_S=600 \
		POOL_STREAM_DELTA_MS=20000 "$SRC/tests/bench/pool-memory.sh" "$bdir" || rc=$?
	say "done ($rc)"
	exit $rc
fi
say "the arm64 VM${claude_why:+ (no claude: $claude_why)}"
"$SRC/tests/vm/olp-vm" --arch arm64 --mem 1536 --timeout 1200 --unavailable-status 77 \
	--rw "$SRC" --rw "$bdir" ${claude_dir:+--ro "$claude_dir"} -- \
	"$SRC/tests/vm/arm64-vm.sh" "$SRC" "$bdir" "${claude_dir:+$claude_dir/claude}" \
	"$claude_why" || rc=$?
say "done ($rc)"
exit $rc

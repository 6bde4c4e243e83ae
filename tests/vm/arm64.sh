#!/usr/bin/env bash
# arm64.sh -- OLP built for arm64 on this x86-64 host and tested (docs/adr/0031-arm64.md):
#
#   1. the cross build (deploy/cross/aarch64-linux-gnu.cmake: Debian's cross gcc and the
#      :arm64 libraries) in BUILD_DIR, with -Werror; incremental when BUILD_DIR exists;
#   2. the CUnit suites that need no kernel feature, under qemu user emulation (CTest's
#      emulator): USER_SUITES below;
#   3. unless --no-vm: an arm64 Debian VM (tests/vm/olp-vm --arch arm64, TCG) runs
#      tests/vm/arm64-vm.sh on the build: the guest's uname -m, unit_sandbox,
#      unit_metrics, the escape suite as root and as www-data, requests through lighttpd.
#
# Exit 77 (a skip, with the reason) only for a host that cannot do it: no cross
# toolchain or qemu (deploy/olp-local installs them), or a VM that cannot boot for a
# reason of the host (olp-vm --unavailable-status 77).  Everything else passes or fails.
#
# usage: tests/vm/arm64.sh [--no-vm] BUILD_DIR
set -euo pipefail

SRC=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)
# Those of unit_* that qemu-user runs as the kernel would: the others need namespaces,
# cgroups or seccomp(2), which qemu-user does not emulate (they run in the VM, or on the
# host in the x86 build), and unit_metrics reads /proc/self/stat, which qemu-user fakes.
USER_SUITES='^unit_(common|providers|providers_command_output|providers_logins|fcgi|auth|egress|egress_connect_addrs|usage)$'

vm=1
if [ "${1:-}" = --no-vm ]; then
	vm=0
	shift
fi
[ $# -eq 1 ] || {
	echo "usage: $0 [--no-vm] BUILD_DIR" >&2
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

say "the CUnit suites under qemu user emulation"
(cd "$bdir" && ctest --output-on-failure --no-tests=error -j 2 -R "$USER_SUITES")

[ $vm = 1 ] || {
	say "done (no VM)"
	exit 0
}
say "the arm64 VM"
rc=0
"$SRC/tests/vm/olp-vm" --arch arm64 --mem 1536 --timeout 1200 --unavailable-status 77 \
	--rw "$SRC" --rw "$bdir" -- "$SRC/tests/vm/arm64-vm.sh" "$SRC" "$bdir" || rc=$?
say "done ($rc)"
exit $rc

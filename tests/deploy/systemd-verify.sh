#!/usr/bin/env bash
# systemd-verify.sh UNIT...: `systemd-analyze verify` on the units as shipped (their
# syntax, every directive known to this systemd with a value it parses, the programs
# they run present and executable: any message fails; not their man pages, which only an installed package has: deb.sh checks
# those), then each one's exposure score from `systemd-analyze security --offline`
# (printed, not judged: systemd-hardening.sh is what shows the hardening holding).
#
# No systemd is started and none needs to run: what a unit does once started is not
# verified here (docs/deploy.md says what is). Skips (77) saying why when
# systemd-analyze, or a program the units run, is not installed.
set -euo pipefail

skip() {
	echo "SKIP: $*"
	exit 77
}
command -v systemd-analyze >/dev/null || skip "systemd-analyze not installed (Debian's systemd package)"
for u in "$@"; do
	while read -r exe; do
		[ -x "$exe" ] || skip "$(basename "$u") runs $exe, which is not installed here"
	done < <(sed -n 's/^Exec[A-Za-z]*=[-+!@:]*\([^ ]*\).*/\1/p' "$u" | sort -u)
done
systemd-analyze --version | head -1
# verify exits 0 after an unknown key or a value it cannot parse ("…, ignoring"): any
# message at all is a failure.
out=$(systemd-analyze verify --man=no "$@" 2>&1) && rc=0 || rc=$?
if [ "$rc" -ne 0 ] || [ -n "$out" ]; then
	printf '%s\n' "$out"
	echo "FAIL systemd-analyze verify (exit $rc)"
	exit 1
fi
echo "ok   systemd-analyze verify, no message: $*"
for u in "$@"; do
	systemd-analyze security --offline=yes "$u" 2>/dev/null | tail -1 || true
done

#!/usr/bin/env bash
# cgroup-vm.sh — run inside the test VM (tests/vm/olp-vm: a pure cgroup v2 host) by CTest:
# the cgroup suite as root (runs go below /sys/fs/cgroup/olp) and as www-data in a cgroup
# delegated to it the way systemd delegates one (owned by the user), where the worker
# must first move itself into a leaf. Each must find cgroup v2 usable (OLP_EXPECT_CGROUP).
#
# usage: cgroup-vm.sh TEST_CGROUP OLP_PROBE OLP_SANDBOX
set -euo pipefail

test_bin=$1 probe=$2 cli=$3
cgroot=/sys/fs/cgroup

[ -f "$cgroot/cgroup.controllers" ] || {
	echo "cgroup-vm.sh: $cgroot is not a cgroup v2 hierarchy" >&2
	exit 1
}
echo "== controllers: $(cat "$cgroot/cgroup.controllers")"

echo "== as root, in the root cgroup"
OLP_EXPECT_CGROUP=cgroup2 "$test_bin"

echo "== as www-data, in a cgroup delegated to it"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$test_bin" "$probe" "$cli" "$work/"
chmod 755 "$work" "$work"/*
# What systemd does for a Delegate=yes unit with User=www-data: the controllers are
# available to the unit's cgroup, and the cgroup and its control files belong to the user.
echo "+memory +pids +cpu" >"$cgroot/cgroup.subtree_control"
deleg=$cgroot/olp-deleg-test
mkdir -p "$deleg"
chown www-data: "$deleg" "$deleg/cgroup.procs" "$deleg/cgroup.subtree_control" \
	"$deleg/cgroup.threads"
(
	echo "$BASHPID" >"$deleg/cgroup.procs"
	cd "$work"
	exec setpriv --reuid=www-data --regid=www-data --clear-groups --reset-env \
		env OLP_EXPECT_CGROUP=cgroup2 OLP_PROBE="$work/$(basename "$probe")" \
		OLP_SANDBOX="$work/$(basename "$cli")" "$work/$(basename "$test_bin")"
)
# The worker moved itself into the leaf, and every run cgroup is gone.
left=$(find "$deleg" -mindepth 1 -maxdepth 1 -type d -name 'sbx-*' | wc -l)
[ -d "$deleg/olp-workers" ] || {
	echo "cgroup-vm.sh: no olp-workers leaf in $deleg" >&2
	exit 1
}
[ "$left" -eq 0 ] || {
	echo "cgroup-vm.sh: $left run cgroups left in $deleg" >&2
	exit 1
}
echo "== cgroup-vm.sh: all passed"

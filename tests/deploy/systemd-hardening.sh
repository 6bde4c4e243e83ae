#!/usr/bin/env bash
# systemd-hardening.sh OLP_SANDBOX OLP_SANDBOX_EXEC UNIT...
#
# The hardening of deploy/systemd/*.service, reproduced without systemd (no unit
# can be started here: CI runs in containers without a systemd of its own), and
# a real sandboxed run under it:
#
#  - what the units keep: User=olp, their CapabilityBoundingSet= (setpriv
#    --bounding-set), ProtectSystem=strict with the state directory writable
#    (a read-only bind of / as the new root, pivot_root), ProtectHome=yes and
#    PrivateTmp=yes (tmpfs), ProtectProc=invisible (a /proc with
#    hidepid=invisible): `olp-sandbox -- id -u` must print the run's own uid;
#  - what they leave out, each of which the unit's comments say breaks it:
#    NoNewPrivileges=yes (setpriv --no-new-privs), ProtectKernelTunables=yes
#    (/proc/sys read-only), ProcSubset=pid, and a bounding set without any one
#    of the capabilities kept: each must make that run fail.
#
# Both units must carry the same hardening block. Needs root (namespaces,
# mounts), the user olp with a subordinate uid range (deploy/olp-local test
# makes both), unshare, setpriv, findmnt; skips (77) saying why otherwise.
set -euo pipefail

sandbox=$1 stub=$2
shift 2
units=("$@")

skip() {
	echo "SKIP: $*"
	exit 77
}
[ "$(id -u)" -eq 0 ] || skip "needs root (mount namespaces, setpriv to olp)"
id -u olp >/dev/null 2>&1 || skip "no user olp (deploy/olp-local test creates it)"
grep -q '^olp:' /etc/subuid 2>/dev/null || skip "olp has no range in /etc/subuid"
for t in unshare setpriv findmnt pivot_root; do
	command -v "$t" >/dev/null || skip "$t not installed"
done

fail=0
ok() { printf 'ok   %s\n' "$*"; }
bad() {
	printf 'FAIL %s\n' "$*"
	fail=1
}

# The hardening block (from its heading to [Install]) is the same in every unit.
block() { sed -n '/^# ---- Hardening/,/^\[Install\]/p' "$1"; }
for u in "${units[@]:1}"; do
	if diff <(block "${units[0]}") <(block "$u") >/dev/null; then
		ok "$(basename "$u") has the hardening block of $(basename "${units[0]}")"
	else
		bad "$(basename "$u") and $(basename "${units[0]}") differ in their hardening block"
	fi
done

unit=${units[0]}
setting() { sed -n "s/^$1=//p" "$unit" | tail -1; }
for want in ProtectSystem=strict ProtectHome=yes PrivateTmp=yes ProtectProc=invisible Delegate=yes User=olp; do
	if [ "$(setting "${want%%=*}")" = "${want#*=}" ]; then
		ok "$(basename "$unit"): $want"
	else
		bad "$(basename "$unit"): $want expected (this test reproduces it)"
	fi
done
for absent in NoNewPrivileges ProtectKernelTunables ProcSubset RestrictNamespaces SystemCallFilter \
	PrivateUsers ProtectControlGroups MemoryDenyWriteExecute PrivateDevices; do
	v=$(setting "$absent")
	case $v in "" | no | false) ok "$(basename "$unit"): no $absent" ;;
	*) bad "$(basename "$unit"): $absent=$v breaks the sandbox (see the unit's comments)" ;;
	esac
done
# CapabilityBoundingSet=CAP_A CAP_B -> setpriv's -all,+a,+b
caps=$(setting CapabilityBoundingSet)
[ -n "$caps" ] || bad "no CapabilityBoundingSet= in $(basename "$unit")"
bset=-all
for c in $caps; do
	c=${c#CAP_}
	bset+=",+${c,,}"
done

work=$(mktemp -d /tmp/olp-hardening.XXXXXX)
trap 'rm -rf "$work"' EXIT
chmod 0755 "$work"
install -m 0755 "$sandbox" "$work/olp-sandbox"
install -m 0755 "$stub" "$work/olp-sandbox-exec"
# The state directory (StateDirectory=olp): the runs' scratch dirs live there.
install -d -m 0700 -o olp -g olp "$work/state"
mkdir "$work/root"

# run NAME EXPECT(pass|fail) SETPRIV-ARGS... -- PROC-MOUNT-OPTS SYS-RO(0|1)
# In a mount namespace of its own: the whole tree read-only as the new root
# (ProtectSystem=strict), the state dir writable, tmpfs over /home, /root and
# /tmp (ProtectHome, PrivateTmp), /proc remounted with PROC-MOUNT-OPTS, /proc/sys
# read-only when SYS-RO; then, as olp with SETPRIV-ARGS, one sandboxed run.
run() {
	local name=$1 expect=$2 procopts=$3 sysro=$4 out rc
	shift 4
	# shellcheck disable=SC2016 # expanded by the inner shell
	out=$(OLP_SANDBOX_EXEC=$work/olp-sandbox-exec unshare -m --propagation private -- sh -c '
		set -e
		w=$1 procopts=$2 sysro=$3
		shift 3
		mount --rbind / "$w/root"
		mount -o remount,bind,ro "$w/root"
		mount -t tmpfs -o mode=0755 tmpfs "$w/root/tmp"
		# This test'"'"'s own files, which lived in the /tmp just hidden.
		mkdir -p "$w/root$w"
		mount --rbind "$w" "$w/root$w"
		mount -o remount,bind,ro "$w/root$w"
		mount --bind "$w/state" "$w/root$w/state"
		mount -o remount,bind,rw "$w/root$w/state"
		for d in /home /root; do
			[ -d "$w/root$d" ] && mount -t tmpfs -o mode=0755 tmpfs "$w/root$d"
		done
		cd "$w/root"
		pivot_root . mnt
		umount -l /mnt
		cd /
		mount -t proc -o "$procopts" proc /proc
		if [ "$sysro" = 1 ]; then
			mount --bind /proc/sys /proc/sys
			mount -o remount,bind,ro /proc/sys
		fi
		# Nothing of the old tree is writable (ProtectSystem=strict).
		if touch /usr/.olp-hardening 2>/dev/null || touch /etc/.olp-hardening 2>/dev/null; then
			echo "the tree is writable: not reproduced"; exit 3
		fi
		exec setpriv --reuid=olp --regid=olp --init-groups "$@" -- \
			"$w/olp-sandbox" --runtime-dir "$w/state/run" -- /usr/bin/id -u
	' sh "$work" "$procopts" "$sysro" "$@" 2>&1) && rc=0 || rc=$?
	if [ "$expect" = pass ] && [ $rc -eq 0 ] && [ "$out" != 0 ] && [ -n "$out" ] &&
		[ "$out" = "${out//[^0-9]/}" ]; then
		ok "$name: a run starts (uid $out inside)"
	elif [ "$expect" = fail ] && [ $rc -ne 0 ] && [[ $out == *"olp-sandbox: cannot start"* ]]; then
		ok "$name: the run fails, as the unit's comment says (${out##*$'\n'})"
	else
		bad "$name: expected the run to ${expect}, got exit $rc: $out"
	fi
}

run "the unit's hardening" pass hidepid=invisible 0 --bounding-set "$bset"
run "NoNewPrivileges=yes" fail hidepid=invisible 0 --bounding-set "$bset" --no-new-privs
run "ProtectKernelTunables=yes" fail hidepid=invisible 1 --bounding-set "$bset"
run "ProcSubset=pid" fail hidepid=invisible,subset=pid 0 --bounding-set "$bset"
for c in $caps; do
	c=${c#CAP_}
	run "CapabilityBoundingSet= without CAP_$c" fail hidepid=invisible 0 --bounding-set "$bset,-${c,,}"
done
exit $fail

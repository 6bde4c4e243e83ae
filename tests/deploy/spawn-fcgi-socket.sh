#!/usr/bin/env bash
# spawn-fcgi-socket.sh UNIT: the FastCGI socket olp-spawn-fcgi.service makes, made the way
# the unit makes it: a runtime directory as systemd creates it (0750, the unit's User and
# Group), the unit's own ExecStartPre= steps run as root ("+"), then its ExecStart= as the
# unit's user with /run/olp moved to a scratch directory and a program that only waits in
# place of olp-fcgi. The socket must be 0660 and belong to the web server's group
# (www-data): www-data connects, another unprivileged user does not (issue 22: it was
# 0666). Root only (it switches users); skips (77) saying why otherwise.
set -euo pipefail

unit=$1
skip() {
	echo "SKIP: $*"
	exit 77
}
fail() {
	echo "FAIL $*"
	exit 1
}
[ "$(id -u)" -eq 0 ] || skip "needs root (the unit's steps run as root and as its user)"
command -v spawn-fcgi >/dev/null || skip "spawn-fcgi not installed"
command -v curl >/dev/null || skip "curl not installed"
user=$(sed -n 's/^User=//p' "$unit")
group=$(sed -n 's/^Group=//p' "$unit")
for u in "$user" www-data nobody; do
	id -u "$u" >/dev/null 2>&1 || skip "no user $u here (deploy/olp-local test creates olp)"
done

grep -q -- '-M 0666' "$unit" && fail "$unit: the socket is made world-writable (-M 0666)"

run=$(mktemp -d /tmp/olp-sock-test.XXXXXX)
pid=
cleanup() {
	[ -z "$pid" ] || kill "$pid" 2>/dev/null || true
	rm -rf "$run"
}
trap cleanup EXIT
chmod 0755 "$run"
dir=$run/olp
install -d -m 0750 -o "$user" -g "$group" "$dir"

# The unit's lines, /run/olp moved; each word as its own argument, as systemd splits them.
steps() { sed -n "s/^$1=//p" "$unit" | sed "s|/run/olp|$dir|g"; }
while read -r -a pre; do
	[ "${pre[0]:0:1}" = + ] || fail "ExecStartPre=${pre[*]}: expected a privileged (+) step"
	pre[0]=${pre[0]#+}
	"${pre[@]}" || fail "ExecStartPre=${pre[*]}"
done < <(steps ExecStartPre)
read -r -a start < <(steps ExecStart)
for i in "${!start[@]}"; do
	[ "${start[$i]}" = -- ] && start=("${start[@]:0:i+1}" /bin/sleep 30) && break
done
setpriv --reuid="$user" --regid="$group" --init-groups -- "${start[@]}" &
pid=$!
sock=$dir/olp-fcgi.sock
for _ in $(seq 50); do
	[ -S "$sock" ] && break
	sleep 0.1
done
[ -S "$sock" ] || fail "no socket at $sock from: ${start[*]}"

mode=$(stat -c '%a %U %G' "$sock")
echo "socket: $mode"
[ "$mode" = "660 $user www-data" ] || fail "socket is $mode, not 660 $user www-data"

# connects AS: curl reaches the socket (then times out: nothing answers HTTP there) or
# does not (exit 7).
connects() {
	local rc=0
	setpriv --reuid="$1" --regid="$(id -g "$1")" --clear-groups -- \
		curl -s -o /dev/null --max-time 1 --unix-socket "$sock" http://olp/ || rc=$?
	[ "$rc" -ne 7 ]
}
connects www-data || fail "www-data (nginx) cannot connect to the socket"
connects nobody && fail "nobody can connect to the socket"
echo "ok   the socket is 0660 $user:www-data: www-data connects, nobody does not"

#!/usr/bin/env bash
# cgroup-vm.sh — run inside the test VM (tests/vm/olp-vm: a pure cgroup v2 host) by CTest:
# the cgroup suite as root (runs go below /sys/fs/cgroup/olp) and as www-data in a cgroup
# delegated to it the way systemd delegates one (owned by the user), where the worker
# must first move itself into a leaf. Each must find cgroup v2 usable (OLP_EXPECT_CGROUP).
#
# Then the server itself, olp-fcgi as plain CGI in that cgroup: /health reports cgroup2,
# and a command provider whose "limits" give it 64 MiB has its memory hog killed (502).
#
# usage: cgroup-vm.sh TEST_CGROUP OLP_PROBE OLP_SANDBOX OLP_FCGI
set -euo pipefail

test_bin=$1 probe=$2 cli=$3 fcgi=$4
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
cp "$test_bin" "$probe" "$cli" "$fcgi" "$work/"
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
echo "== olp-fcgi (plain CGI) as www-data in that cgroup"
home=$work/home
mkdir -p "$home"
printf '{"sandbox": {"warm": false}}\n' >"$home/config.json"
cat >"$home/models-registry.json" <<EOF
{"providers": {
  "hog": {"type": "command", "argv": ["$work/$(basename "$probe")", "hog"], "timeout_s": 60,
          "limits": {"memory_mb": 64, "as_mb": 1048576}, "models": [{"id": "hog"}]},
  "cat": {"type": "command", "argv": ["/usr/bin/cat"], "models": [{"id": "cat"}]}}}
EOF
chown -R www-data: "$home"
# cgi METHOD URI [BODY]: one request to olp-fcgi as CGI, as www-data in the delegated
# cgroup; its whole output (headers and body) on stdout.
cgi() {
	local body=${3:-}
	(
		echo "$BASHPID" >"$deleg/olp-workers/cgroup.procs"
		printf '%s' "$body" | exec setpriv --reuid=www-data --regid=www-data --clear-groups \
			--reset-env env OLP_HOME="$home" OLP_OWNER_TOKEN=olp_vm_owner \
			GATEWAY_INTERFACE=CGI/1.1 SERVER_PROTOCOL=HTTP/1.1 SERVER_NAME=localhost \
			SERVER_PORT=80 REMOTE_ADDR=127.0.0.1 SCRIPT_NAME= QUERY_STRING= \
			REQUEST_METHOD="$1" REQUEST_URI="$2" PATH_INFO="$2" \
			HTTP_AUTHORIZATION="Bearer olp_vm_owner" CONTENT_TYPE=application/json \
			CONTENT_LENGTH=${#body} "$work/$(basename "$fcgi")"
	)
}
expect() { # expect WHAT TEXT PATTERN
	if ! grep -q -- "$3" <<<"$2"; then
		echo "cgroup-vm.sh: $1: expected /$3/ in:" >&2
		printf '%s\n' "$2" >&2
		exit 1
	fi
	echo "ok: $1"
}
out=$(cgi GET /health)
expect "/health reports cgroup2" "$out" '"cgroup":"cgroup2"'
out=$(cgi POST /v1/chat/completions '{"model":"cat","messages":[{"role":"user","content":"hello vm"}]}')
expect "a command provider answers" "$out" 'hello vm'
out=$(cgi POST /v1/chat/completions '{"model":"hog","messages":[{"role":"user","content":"x"}]}')
expect "the hog is stopped by its memory.max (502)" "$out" 'Status: 502'
expect "killed by the OOM killer (SIGKILL)" "$out" 'killed by signal 9'
left=$(find "$deleg" -mindepth 1 -maxdepth 1 -type d -name 'sbx-*' | wc -l)
[ "$left" -eq 0 ] || {
	echo "cgroup-vm.sh: $left run cgroups left in $deleg after the CGI requests" >&2
	exit 1
}
echo "== cgroup-vm.sh: all passed"

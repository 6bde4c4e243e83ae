#!/usr/bin/env bash
# arm64-vm.sh -- run inside the arm64 test VM (tests/vm/olp-vm --arch arm64) by
# tests/vm/arm64.sh: the arm64 build (made on the host by the cross toolchain) on an
# arm64 kernel.
#
#   1. the guest's uname -m (aarch64, or this fails);
#   2. the sandbox suite (unit_sandbox) and the metrics suite (unit_metrics, which
#      qemu user emulation cannot run: it fakes /proc/self/stat);
#   3. the escape suite, as root and as www-data (escape.test.mjs runs both);
#   4. requests through lighttpd (lighttpd/olp.conf, the workers as www-data) to a
#      command provider: a completion, a streamed one, and /health;
#   5. one completion through lighttpd to the real claude, its arm64 build, sandboxed,
#      against the fake Anthropic upstream (tests/upstream/fake-anthropic.mjs, run by the
#      guest's own node on its 127.0.0.1) through OLP's egress forwarder (network
#      "upstream"). Without CLAUDE_BIN (arm64.sh could not fetch it) this step is
#      skipped and says CLAUDE_WHY.
#
# usage: arm64-vm.sh SOURCE_DIR ARM64_BUILD_DIR [CLAUDE_BIN [CLAUDE_WHY]]
set -euo pipefail

src=$1 build=$2 claude=${3:-} claude_why=${4:-}
step() { printf '== %s\n' "$*"; }
fail() {
	printf 'arm64-vm.sh: %s\n' "$*" >&2
	exit 1
}
# Every step runs, whatever the one before did; the status says whether all passed.
failed=()
check() { # check NAME COMMAND...: runs it, notes a failure
	local name=$1
	shift
	step "$name"
	"$@" || {
		echo "arm64-vm.sh: FAILED: $name" >&2
		failed+=("$name")
	}
}

arch=$(uname -m)
step "guest uname -m: $arch ($(uname -r))"
[ "$arch" = aarch64 ] || fail "the guest is $arch, not aarch64"

# A few of unit_sandbox's checks bound a duration (a run killed at its timeout ends
# within 5 s); a 2-vCPU TCG guest on a loaded 2-core host runs several times slower than
# the host, so they are given 3 times as long (OLP_TEST_TIME_FACTOR, test_sandbox.c's
# took_under: never past 19 s, below the 20 s a run that did not stop would take), and
# each prints what it took. Run once: a miss fails the test.
check unit_sandbox sh -c "cd '$build/tests/sandbox' && OLP_TEST_TIME_FACTOR=3 ./test_sandbox"
check unit_metrics sh -c "cd '$build/tests/metrics' && ./test_metrics"
check "escape_sandbox (as root and as www-data)" \
	env OLP_SANDBOX="$build/sandbox/olp-sandbox" OLP_PROBE="$build/tests/sandbox/olp-probe" \
	OLP_SANDBOX_EXEC="$build/sandbox/olp-sandbox-exec" \
	node --test "$src/tests/sandbox/escape.test.mjs"

step "lighttpd -> olp-fcgi (www-data) -> a command provider"
work=$(mktemp -d)
lpid='' upid=''
cleanup() {
	local p
	for p in $lpid $upid; do
		kill "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
	rm -rf "$work"
}
trap 'cleanup; ((${#failed[@]} == 0)) || fail "failed: ${failed[*]}"' EXIT
chmod 755 "$work"
mkdir -p "$work/bin" "$work/home" "$work/run"
# www-data cannot necessarily read the build tree: its own copies.
cp "$build/fcgi/olp-fcgi" "$build/sandbox/olp-sandbox-exec" "$work/bin/"
printf '{"sandbox": {"warm": false}}\n' >"$work/home/config.json"
# The fake Anthropic upstream, for claude: its first line is its port.
claude_json=''
if [ -n "$claude" ]; then
	node "$src/tests/upstream/fake-anthropic.mjs" 0 >"$work/upstream.out" 2>"$work/upstream.err" &
	upid=$!
	for _ in $(seq 1 300); do
		up=$(head -n 1 "$work/upstream.out" 2>/dev/null | tr -dc 0-9)
		[ -z "$up" ] || break
		kill -0 "$upid" 2>/dev/null || fail "the fake upstream exited: $(cat "$work/upstream.err")"
		sleep 0.2
	done
	[ -n "$up" ] || fail "the fake upstream did not start"
	# 240 s: an emulated claude starts in tens of seconds.
	claude_json=$(printf ',\n  "anthropic": {"type": "claude", "bin": "%s", "timeout_s": 240,
    "credentials": [], "network": {"upstream": "http://127.0.0.1:%s"},
    "env": {"ANTHROPIC_API_KEY": "sk-ant-fake-key"}, "models": [{"id": "claude-fake"}]}' \
		"$claude" "$up")
fi
cat >"$work/home/models-registry.json" <<JSON
{"providers": {
  "cat": {"type": "command", "argv": ["/usr/bin/cat"], "models": [{"id": "cat"}]},
  "arch": {"type": "command", "argv": ["/usr/bin/uname", "-m"], "models": [{"id": "arch"}]}$claude_json}}
JSON
# A worker that cannot even load (a library missing from the VM's root: olp-vm's
# ROOTFS_PKGS) is said now, by name, rather than as lighttpd restarting it for a minute.
"$work/bin/olp-fcgi" --version >/dev/null 2>"$work/loader.err" ||
	fail "olp-fcgi does not start in the VM: $(head -n 3 "$work/loader.err")"
chown -R www-data: "$work/home" "$work/run"
chmod 700 "$work/home"
token=olp_arm64_vm_owner
port=8089
setpriv --reuid=www-data --regid=www-data --clear-groups --reset-env \
	env PATH=/usr/bin:/bin SHELL=/bin/sh OLP_BIN="$work/bin/olp-fcgi" OLP_HOME="$work/home" \
	OLP_RUN_DIR="$work/run" OLP_PORT=$port OLP_MAX_PROCS=1 OLP_THREADS=4 \
	OLP_OWNER_TOKEN=$token OLP_SANDBOX_EXEC="$work/bin/olp-sandbox-exec" \
	OLP_ERROR_LOG=- OLP_WORKER_LOG=- \
	/usr/sbin/lighttpd -D -f "$src/lighttpd/olp.conf" &
lpid=$!
url=http://127.0.0.1:$port
for _ in $(seq 1 300); do
	curl -fsS -o /dev/null "$url/health" 2>/dev/null && break
	kill -0 "$lpid" 2>/dev/null || fail "lighttpd exited"
	sleep 0.2
done
expect() { # expect WHAT TEXT PATTERN
	grep -q -- "$3" <<<"$2" || fail "$1: expected /$3/ in: $2"
	echo "ok: $1"
}
auth=(-H "Authorization: Bearer $token" -H 'Content-Type: application/json')
out=$(curl -sS "$url/health")
expect "/health answers" "$out" '"ok":true'
out=$(curl -sS "${auth[@]}" "$url/v1/chat/completions" \
	-d '{"model":"cat","messages":[{"role":"user","content":"hello arm64"}]}')
expect "a command provider answers through lighttpd" "$out" 'hello arm64'
out=$(curl -sS -N "${auth[@]}" "$url/v1/chat/completions" \
	-d '{"model":"arch","stream":true,"messages":[{"role":"user","content":"x"}]}')
expect "a streamed answer from inside the sandbox, on arm64" "$out" 'aarch64'
expect "the stream ends" "$out" 'data: \[DONE\]'
out=$(curl -sS -o /dev/null -w '%{http_code}' "$url/v1/chat/completions" -d '{}')
expect "no token: 401" "$out" '^401$'

if [ -n "$claude" ]; then
	step "lighttpd -> olp-fcgi (www-data) -> claude $(basename "$(dirname "$claude")") (arm64) -> the fake upstream"
	t0=$SECONDS
	out=$(curl -sS --max-time 300 "${auth[@]}" "$url/v1/chat/completions" \
		-d '{"model":"claude-fake","messages":[{"role":"user","content":"Say hello"}]}' 2>&1) || true
	echo "(the completion took $((SECONDS - t0)) s, emulated)"
	expect "claude answers through lighttpd, from the fake upstream" "$out" \
		'"content": *"Hello from the fake Anthropic server!"'
	expect "claude's answer ends normally" "$out" '"finish_reason": *"stop"'
else
	step "claude: SKIPPED: ${claude_why:-no arm64 claude was given}"
fi
((${#failed[@]} == 0)) || exit 1
step "arm64-vm.sh: all passed"

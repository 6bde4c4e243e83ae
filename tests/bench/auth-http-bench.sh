#!/usr/bin/env bash
# auth-http-bench.sh — GET /health requests/s through lighttpd, authenticated as the owner
# two ways against the same server in the same run: the OLP_OWNER_TOKEN env owner (one
# hash compare, no file) vs a stored owner key in a store of 1,000 keys (hash, binary
# search, one lstat of its manifest, last_used_at queued at most once a minute).
# Rounds alternate A, B, A, B… so that machine noise hits both alike.
#
# Goal (issue 3): no cliff. The Node OLP serves this at 30k req/s with its env token but
# 1.9k with a stored key (it re-reads every manifest and fsyncs last_used_at per request).
#
# usage: tests/bench/auth-http-bench.sh [BUILD_DIR]   (default: build/bench; configured and built each run)
# env:   BENCH_SECONDS (per wrk round, default 5), BENCH_ROUNDS (per side, default 3),
#        BENCH_CONNS (default 16), BENCH_THREADS (wrk threads, default 1),
#        BENCH_KEYS (keys in the store, default 1000), BENCH_PROCS (olp-fcgi workers, 2)
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build/bench}
secs=${BENCH_SECONDS:-5}
rounds=${BENCH_ROUNDS:-3}
conns=${BENCH_CONNS:-16}
wthreads=${BENCH_THREADS:-1}
nkeys=${BENCH_KEYS:-1000}
procs=${BENCH_PROCS:-2}

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
if ! command -v wrk >/dev/null; then
	echo "installing wrk"
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q wrk >/dev/null ||
		{ as_root apt-get update -q >/dev/null && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q wrk >/dev/null; }
fi
lighttpd=$(PATH=$PATH:/usr/sbin:/sbin command -v lighttpd) ||
	{ echo "lighttpd missing: run deploy/olp-local test first" >&2; exit 1; }
# shellcheck source=tests/bench/lib.sh
. "$(dirname "$0")/lib.sh" # free_port (its own cleanup: one server)
bench_build "$build" olp-fcgi olp-keys

work=$(mktemp -d /tmp/olp-auth-bench.XXXXXX)
lpid=
cleanup() {
	[ -n "$lpid" ] && kill "$lpid" 2>/dev/null && wait "$lpid" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT


home=$work/home
mkdir -m 0700 "$home" "$work/run"
cat >"$home/models-registry.json" <<'JSON'
{"providers":{"bench":{"type":"command","argv":["/usr/bin/printf","ok"],"timeout_s":30,
 "models":[{"id":"instant"}]}}}
JSON

# The store: nkeys-1 guest keys written in the Node OLP's manifest format (their tokens
# are thrown away), plus one owner key made by olp-keys, whose token we use.
python3 - "$home" "$((nkeys - 1))" <<'PY'
import hashlib, json, os, secrets, string, sys
home, n = sys.argv[1], int(sys.argv[2])
keys = os.path.join(home, "keys")
os.makedirs(keys, mode=0o700, exist_ok=True)
alphabet = string.ascii_lowercase + string.digits
for i in range(n):
    kid = "".join(secrets.choice(alphabet) for _ in range(8))
    tok = "olp_" + secrets.token_urlsafe(32)
    d = os.path.join(keys, kid)
    os.mkdir(d, 0o700)
    m = {"schema_version": 1, "id": kid, "name": f"bench-{i}",
         "token_hash": hashlib.sha256(tok.encode()).hexdigest(), "token_hash_algo": "sha256",
         "owner_tier": "guest", "providers_enabled": "*", "quota": None,
         "created_at": "2026-01-01T00:00:00.000Z", "revoked_at": None,
         "last_used_at": None, "notes": None}
    fd = os.open(os.path.join(d, "manifest.json"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, json.dumps(m, indent=2).encode())
    os.close(fd)
PY
stored=$("$build/auth/olp-keys" keygen --owner --json --olp-home="$home" |
	sed -n 's/^ *"token": *"\([A-Za-z0-9_-]*\)",\{0,1\}$/\1/p')
[ -n "$stored" ] || { echo "olp-keys keygen --owner failed" >&2; exit 1; }
count=$("$build/auth/olp-keys" list --json --olp-home="$home" | grep -c '"id"')
env_token=olp_$(head -c 32 /dev/urandom | base64 -w0 | tr '+/' '-_' | tr -d '=')

port=$(free_port)
OLP_BIN=$build/fcgi/olp-fcgi OLP_HOME=$home OLP_RUN_DIR=$work/run OLP_PORT=$port \
OLP_MAX_PROCS=$procs OLP_THREADS=16 OLP_OWNER_TOKEN=$env_token OLP_LOG_LEVEL=warn \
	"$lighttpd" -D -f "$root/lighttpd/olp.conf" >"$work/run/stdout" 2>&1 &
lpid=$!
url=http://127.0.0.1:$port/health
for _ in $(seq 200); do
	curl -sf "$url" >/dev/null 2>&1 && break
	sleep 0.05
done
# Both credentials must be the owner (full /health), or the comparison means nothing.
for t in "$env_token" "$stored"; do
	curl -sf -H "Authorization: Bearer $t" "$url" | grep -q '"sandbox"' ||
		{ echo "owner /health failed; lighttpd output:" >&2; cat "$work/run/stdout" "$work/run/error.log" >&2 2>/dev/null; exit 1; }
done

# rps TOKEN: one wrk round; fails if any answer was not 2xx (a 401 would be faster).
rps() {
	local out
	out=$(wrk -t"$wthreads" -c"$conns" -d"${secs}s" -H "Authorization: Bearer $1" "$url")
	if grep -q 'Non-2xx' <<<"$out"; then
		echo "non-2xx answers during the run:" >&2
		echo "$out" >&2
		exit 1
	fi
	awk '/Requests\/sec/ {print $2}' <<<"$out"
}

echo "# auth-http-bench: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)," \
	"$(uname -srm), $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "# $count keys in the store; lighttpd $("$lighttpd" -v | sed -n 's/^lighttpd\/\([^ ]*\).*/\1/p'), $procs olp-fcgi x 16 threads; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== GET /health as the owner, wrk -t$wthreads -c$conns -d${secs}s, $rounds alternating rounds"
sa=()
sb=()
for r in $(seq "$rounds"); do
	a=$(rps "$env_token")
	b=$(rps "$stored")
	printf 'round %d: env owner %s req/s, stored key %s req/s\n' "$r" "$a" "$b"
	sa+=("$a")
	sb+=("$b")
done
med() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
ma=$(med "${sa[@]}")
mb=$(med "${sb[@]}")
echo "health_rps_env_owner $ma"
echo "health_rps_stored_key $mb"
awk -v a="$ma" -v b="$mb" 'BEGIN {printf "stored_over_env %.2f (Node OLP: 1.9k / 30k = 0.06)\n", b / a}'
# The stored key was really used: its last_used_at was written by the workers.
"$build/auth/olp-keys" list --owner-only --json --olp-home="$home" | grep -q '"last_used_at": "' ||
	echo "warning: the owner key's last_used_at was not written" >&2

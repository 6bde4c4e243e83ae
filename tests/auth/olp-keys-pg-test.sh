#!/bin/sh
# olp-keys against a PostgreSQL store (ADR 0034), run by tests/pg/with-pg.sh: store init as
# the schema owner (twice: the second is a no-op), store status, migrate of the fixture
# home (twice: the second copies nothing), then keygen/list/revoke/set-quota/set-login on
# the store named by OLP_STORE and by config.json "store", a URL with a password refused,
# and a store that cannot be reached reported (exit 1), never a crash.
# usage: olp-keys-pg-test.sh PATH-TO-olp-keys FIXTURE-HOME PATH-TO-usage-fill
set -u
KEYS=${1:?usage: $0 PATH-TO-olp-keys FIXTURE-HOME PATH-TO-usage-fill}
FIX=${2:?usage: $0 PATH-TO-olp-keys FIXTURE-HOME PATH-TO-usage-fill}
FILL=${3:?usage: $0 PATH-TO-olp-keys FIXTURE-HOME PATH-TO-usage-fill}
: "${OLP_TEST_PG_URL:?run under tests/pg/with-pg.sh}"
T=$(mktemp -d "${TMPDIR:-/tmp}/olp-keys-pg-test.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
H="$T/home"
mkdir -m 700 "$H" && cp -r "$FIX/keys" "$H/" && chmod -R go= "$H"
fails=0

fail() {
	echo "FAIL: $*"
	fails=$((fails + 1))
}

expect() {
	want=$1
	shift
	"$@" >"$T/out" 2>"$T/err"
	got=$?
	[ "$got" = "$want" ] || fail "exit $got (want $want): $* :: $(cat "$T/err")"
}

json() {
	python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"
}

export OLP_HOME="$H"
expect 1 "$KEYS" store status
grep -q 'no store is configured' "$T/err" || fail "store status without a store: $(cat "$T/err")"
expect 2 "$KEYS" store frob
expect 2 "$KEYS" store status --worker-role=x

OLP_STORE=$OLP_TEST_PG_URL expect 1 "$KEYS" store init
grep -q 'store init' "$T/err" || fail "the workers' role created the schema"
OLP_STORE=$OLP_TEST_PG_ADMIN_URL expect 0 "$KEYS" store init --worker-role=olp_worker
grep -q 'keys: version 0 -> 1' "$T/out" || fail "store init: $(cat "$T/out")"
grep -q 'usage: version 0 -> 2' "$T/out" || fail "store init, usage: $(cat "$T/out")"
OLP_STORE=$OLP_TEST_PG_ADMIN_URL expect 0 "$KEYS" store init
grep -q 'keys: version 1, current' "$T/out" || fail "store init again: $(cat "$T/out")"
OLP_STORE=$OLP_TEST_PG_URL expect 0 "$KEYS" --json store status
[ "$(json "$T/out" 'd["reachable"], d["schemas"]["keys"]')" = "(True, 'version 1, current')" ] ||
	fail "store status: $(cat "$T/out")"

expect 0 "$KEYS" --json migrate --to="$OLP_TEST_PG_URL"
[ "$(json "$T/out" 'd["copied"], d["unchanged"]')" = "(3, 0)" ] || fail "migrate: $(cat "$T/out")"
expect 0 "$KEYS" migrate --to "$OLP_TEST_PG_URL"
grep -q '^0 keys copied, 3 unchanged' "$T/out" || fail "migrate again: $(cat "$T/out")"
# The ledger too: three rows, copied once however often migrate runs.
for i in 1 2 3; do
	"$FILL" "$H" own3r0k1 claude 200 10 "$i" || fail "usage-fill"
done
expect 0 "$KEYS" --json migrate --to "$OLP_TEST_PG_URL"
[ "$(json "$T/out" 'd["unchanged"], d["ledger"]["rows_read"], d["ledger"]["rows_copied"]')" = "(3, 3, 3)" ] ||
	fail "migrate with a ledger: $(cat "$T/out")"
expect 0 "$KEYS" migrate --to "$OLP_TEST_PG_URL"
grep -q '^usage ledger: 0 rows copied (3 already there)' "$T/out" ||
	fail "the ledger copied twice: $(cat "$T/out")"
rows=$("$OLP_TEST_PG_CTL" psql -tA -c "SELECT count(*), sum(completion_tokens) FROM olp_requests WHERE key_id = 'own3r0k1'")
[ "$rows" = "3|6" ] || fail "the ledger in the store: $rows"
rm -f "$H/usage.db"
expect 2 "$KEYS" migrate
expect 1 "$KEYS" migrate --to="postgresql://olp_worker:secret@127.0.0.1/olp"

# The store from config.json, then from OLP_STORE (which wins).
printf '{"store": "%s"}\n' "$OLP_TEST_PG_URL" >"$H/config.json"
expect 0 "$KEYS" --json list --include-revoked
[ "$(json "$T/out" 'sorted(k["id"] for k in d)')" = "['gu3st0k1', 'own3r0k1', 'r3vok3d1']" ] ||
	fail "list from the store: $(cat "$T/out")"
mv "$H/keys" "$H/keys.away" # nothing of what follows reads the files
export OLP_STORE=$OLP_TEST_PG_URL
expect 1 "$KEYS" keygen --owner
grep -q 'owner key already exists' "$T/err" || fail "a second owner: $(cat "$T/err")"
expect 0 "$KEYS" --json keygen --name="x'); DROP TABLE olp_keys; --" --quota-rpd=5
id=$(json "$T/out" 'd["id"]')
expect 0 "$KEYS" revoke --id=gu3st0k1
expect 0 "$KEYS" set-quota --id=own3r0k1 --quota-rpm=7
expect 0 "$KEYS" set-login --id="$id" --allow=codex
expect 1 "$KEYS" revoke --id=nosuchk1
# Accounts (ADR 0037) in the store: the same manifest member as in a file.
expect 0 "$KEYS" --json keygen --name=acc --account=claude=alice
acc_id=$(json "$T/out" 'd["id"]')
expect 0 "$KEYS" set-account --id="$acc_id" codex=bob
expect 0 "$KEYS" set-account --id="$acc_id" --clear claude
expect 1 "$KEYS" set-account --id="$acc_id" codex=B0B
expect 0 "$KEYS" --json list
[ "$(json "$T/out" '[k["accounts"] for k in d if k["id"] == "'"$acc_id"'"]')" = "[{'codex': 'bob'}]" ] ||
	fail "set-account in the store: $(cat "$T/out")"
expect 0 "$KEYS" --json list --include-revoked
[ "$(json "$T/out" '[(k["id"], k["revoked_at"] is not None) for k in d if k["id"] == "gu3st0k1"]')" = "[('gu3st0k1', True)]" ] ||
	fail "revoke not listed"
[ "$(json "$T/out" '[k["name"] for k in d if k["id"] == "'"$id"'"]')" = "[\"x'); DROP TABLE olp_keys; --\"]" ] ||
	fail "the name not stored verbatim: $(cat "$T/out")"
grep -q token_hash "$T/out" && fail "list shows a hash"

OLP_STORE="postgresql://olp_worker@127.0.0.1:1/olp" expect 1 "$KEYS" list
grep -q 'cannot read the keys of the store' "$T/err" || fail "an unreachable store: $(cat "$T/err")"

[ "$fails" = 0 ] && echo "olp-keys against PostgreSQL: all checks passed"
[ "$fails" = 0 ]

#!/bin/sh
# olp-keys as an operator uses it: keygen/list/revoke, both flag forms, --json, exit codes
# 0/1/2, the second-owner guard, the permission check, and no token or hash in list.
# usage: olp-keys-test.sh PATH-TO-olp-keys
set -u
KEYS=${1:?usage: $0 PATH-TO-olp-keys}
T=$(mktemp -d "${TMPDIR:-/tmp}/olp-keys-test.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
H="$T/home"
fails=0

fail() {
	echo "FAIL: $*"
	fails=$((fails + 1))
}

# expect RC CMD...: run CMD, keep stdout in $T/out and stderr in $T/err, check the status.
expect() {
	want=$1
	shift
	"$@" >"$T/out" 2>"$T/err"
	got=$?
	[ "$got" = "$want" ] || fail "exit $got (want $want): $* :: $(cat "$T/err")"
}

json() { # json FILE EXPR: print a value with python3's json (jq may be missing)
	python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"
}

expect 0 "$KEYS" --help
grep -q 'keygen --owner' "$T/out" || fail "--help lacks the keygen synopsis"
expect 2 "$KEYS"
expect 2 "$KEYS" frobnicate
expect 2 "$KEYS" keygen --olp-home="$H"
expect 2 "$KEYS" keygen --owner --tier=guest --olp-home="$H"
expect 2 "$KEYS" keygen --name=x --tier=admin --olp-home="$H"
expect 2 "$KEYS" list --id=abc --olp-home="$H"
expect 2 "$KEYS" revoke --olp-home="$H"
expect 2 "$KEYS" list --olp-home
expect 2 "$KEYS" list --json=yes --olp-home="$H"

# keygen --owner: named "owner", token printed once, store created 0700/0600.
expect 0 "$KEYS" keygen --owner --json --olp-home="$H"
owner_id=$(json "$T/out" 'd["id"]')
owner_tok=$(json "$T/out" 'd["token"]')
[ "$(json "$T/out" 'd["name"]')" = owner ] || fail "owner key not named owner"
[ "$(json "$T/out" 'd["owner_tier"]')" = owner ] || fail "owner key tier"
[ "$(json "$T/out" 'sorted(d)')" = "['id', 'name', 'owner_tier', 'token']" ] || fail "keygen --json fields"
case $owner_tok in olp_*) ;; *) fail "token prefix" ;; esac
[ ${#owner_tok} -eq 47 ] || fail "token length ${#owner_tok}"
[ "$(stat -c %a "$H/keys")" = 700 ] || fail "keys/ mode"
[ "$(stat -c %a "$H/keys/$owner_id")" = 700 ] || fail "key dir mode"
[ "$(stat -c %a "$H/keys/$owner_id/manifest.json")" = 600 ] || fail "manifest mode"
grep -q "$owner_tok" "$H/keys/$owner_id/manifest.json" && fail "token stored in clear"

# A name or notes that are not UTF-8 are refused as such (jansson would refuse to
# write them, which once surfaced as "Cannot allocate memory"), and nothing is stored.
expect 1 "$KEYS" keygen --name="$(printf 'bad\377name')" --olp-home="$H"
grep -q 'UTF-8' "$T/err" || fail "a non-UTF-8 name: $(cat "$T/err")"
expect 1 "$KEYS" keygen --name=notes --notes="$(printf '\300\200')" --olp-home="$H"
grep -q 'UTF-8' "$T/err" || fail "non-UTF-8 notes: $(cat "$T/err")"
[ "$(ls "$H/keys" | wc -l)" = 1 ] || fail "a refused key left a directory"

# A second owner needs --force.
expect 1 "$KEYS" keygen --owner --olp-home "$H"
grep -q -- '--force' "$T/err" || fail "second-owner refusal does not mention --force"
expect 0 "$KEYS" keygen --owner --force --olp-home "$H"

# Guests, both flag forms, OLP_HOME from the environment.
expect 0 env OLP_HOME="$H" "$KEYS" keygen --name alice --providers claude,codex
grep -q '^olp_' "$T/out" || fail "human keygen does not print the token"
expect 0 "$KEYS" --olp-home "$H" --json keygen --name=bob --tier guest
bob_id=$(json "$T/out" 'd["id"]')
bob_tok=$(json "$T/out" 'd["token"]')

expect 0 "$KEYS" list --json --olp-home="$H"
[ "$(json "$T/out" 'len(d)')" = 4 ] || fail "list shows $(json "$T/out" 'len(d)') keys, want 4"
grep -q token_hash "$T/out" && fail "list --json shows hashes"
grep -q "$bob_tok" "$T/out" && fail "list shows a token"
[ "$(json "$T/out" '[k["providers_enabled"] for k in d if k["name"]=="alice"][0]')" = "['claude', 'codex']" ] ||
	fail "alice's providers"
expect 0 "$KEYS" list --owner-only --json --olp-home="$H"
[ "$(json "$T/out" 'len(d)')" = 2 ] || fail "--owner-only"

# Revoke: gone from the default list, back with --include-revoked; twice is fine.
expect 0 "$KEYS" revoke --id="$bob_id" --olp-home="$H"
expect 0 "$KEYS" revoke --id "$bob_id" --json --olp-home="$H"
[ "$(json "$T/out" 'd["already_revoked"]')" = True ] || fail "second revoke not reported"
expect 0 "$KEYS" list --json --olp-home="$H"
[ "$(json "$T/out" 'len(d)')" = 3 ] || fail "revoked key still listed"
expect 0 "$KEYS" list --include-revoked --json --olp-home="$H"
[ "$(json "$T/out" 'len(d)')" = 4 ] || fail "--include-revoked"
expect 0 "$KEYS" list --olp-home="$H"
grep -q "$owner_id" "$T/out" || fail "human list lacks the owner"
expect 1 "$KEYS" revoke --id=nosuch00 --olp-home="$H"
expect 1 "$KEYS" revoke --id=../etc --olp-home="$H"

# A store others can read is refused, with the fix in the message.
chmod 755 "$H/keys"
expect 1 "$KEYS" list --olp-home="$H"
grep -q "chmod -R go= '$H/keys'" "$T/err" || fail "no fix in the permission message: $(cat "$T/err")"
expect 1 "$KEYS" keygen --name=carol --olp-home="$H"
chmod 700 "$H/keys"
expect 0 "$KEYS" list --olp-home="$H"

# Never a token or a hash on stderr, whatever happened above.
if [ "$fails" -eq 0 ]; then
	echo "olp-keys CLI: all checks passed"
	exit 0
fi
echo "olp-keys CLI: $fails check(s) failed"
exit 1

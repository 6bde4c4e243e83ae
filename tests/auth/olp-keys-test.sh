#!/bin/sh
# olp-keys as an operator uses it: keygen/list/revoke, both flag forms, --json, exit codes
# 0/1/2, the second-owner guard, the permission check, and no token or hash in list;
# quotas (keygen --quota-*, set-quota, list) and usage (rows written by usage-fill through
# usage/usage.h, as a worker writes them); logins (keygen --allow-login, set-login).
# usage: olp-keys-test.sh PATH-TO-olp-keys PATH-TO-usage-fill
set -u
KEYS=${1:?usage: $0 PATH-TO-olp-keys PATH-TO-usage-fill}
FILL=${2:?usage: $0 PATH-TO-olp-keys PATH-TO-usage-fill}
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
[ "$(json "$T/out" 'sorted(d)')" = "['id', 'name', 'owner_tier', 'quota', 'token']" ] || fail "keygen --json fields"
[ "$(json "$T/out" 'd["quota"]')" = None ] || fail "a key made without --quota-* has a quota"
grep -q '"quota": null' "$H/keys/$owner_id/manifest.json" || fail "manifest quota is not null"
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

# Quotas: keygen writes them into the manifest; bad values are usage errors and create
# nothing; set-quota changes only what it is given; list shows them.
n_before=$(ls "$H/keys" | wc -l)
for bad in 0 -1 1.5 abc 1000000000000001 ''; do
	expect 2 "$KEYS" keygen --name=q --quota-rpm="$bad" --olp-home="$H"
done
grep -q -- '--quota-rpm' "$T/err" || fail "a bad quota's message does not name the flag: $(cat "$T/err")"
expect 2 "$KEYS" list --quota-rpm=1 --olp-home="$H"
expect 2 "$KEYS" set-quota --olp-home="$H"
expect 2 "$KEYS" set-quota --id="$owner_id" --olp-home="$H"
expect 2 "$KEYS" set-quota --id="$owner_id" --quota-tpd=0 --olp-home="$H"
[ "$(ls "$H/keys" | wc -l)" = "$n_before" ] || fail "a refused quota created a key"
expect 0 "$KEYS" keygen --name=quota --quota-rpm=5 --quota-rpd=100 --quota-tpd=2000 --json --olp-home="$H"
q_id=$(json "$T/out" 'd["id"]')
[ "$(json "$T/out" 'd["quota"]')" = "{'requests_per_minute': 5, 'requests_per_day': 100, 'tokens_per_day': 2000}" ] ||
	fail "keygen --json quota: $(json "$T/out" 'd["quota"]')"
[ "$(json "$H/keys/$q_id/manifest.json" 'd["quota"]')" = "{'requests_per_minute': 5, 'requests_per_day': 100, 'tokens_per_day': 2000}" ] ||
	fail "manifest quota"
expect 0 "$KEYS" set-quota --id="$q_id" --quota-rpm=none --quota-rpd 3 --olp-home="$H"
grep -q 'rpd=3,tpd=2000' "$T/out" || fail "set-quota output: $(cat "$T/out")"
[ "$(json "$H/keys/$q_id/manifest.json" 'd["quota"]')" = "{'requests_per_day': 3, 'tokens_per_day': 2000}" ] ||
	fail "set-quota did not keep tpd / drop rpm: $(json "$H/keys/$q_id/manifest.json" 'd["quota"]')"
[ "$(stat -c %a "$H/keys/$q_id/manifest.json")" = 600 ] || fail "set-quota manifest mode"
expect 0 "$KEYS" list --json --olp-home="$H"
[ "$(json "$T/out" '[k["quota"] for k in d if k["id"]=="'"$q_id"'"][0]')" = "{'requests_per_day': 3, 'tokens_per_day': 2000}" ] ||
	fail "list --json quota"
expect 0 "$KEYS" list --olp-home="$H"
grep "$q_id" "$T/out" | grep -q 'rpd=3,tpd=2000' || fail "list lacks the quota: $(cat "$T/out")"
expect 0 "$KEYS" set-quota --id="$q_id" --clear --quota-rpm=7 --json --olp-home="$H"
[ "$(json "$T/out" 'd["quota"]')" = "{'requests_per_minute': 7}" ] || fail "--clear with a limit"
expect 0 "$KEYS" set-quota --id="$q_id" --clear --olp-home="$H"
[ "$(json "$H/keys/$q_id/manifest.json" 'd["quota"]')" = None ] || fail "--clear leaves quota null"
# max_concurrent: 1..1024 only; keygen --quota-concurrent, set-quota --concurrent (or
# --quota-concurrent), list shows it, --clear clears it.
expect 0 "$KEYS" set-quota --id="$q_id" --quota-rpm=7 --olp-home="$H"
for bad in 0 -1 1.5 abc 1025 ''; do
	expect 2 "$KEYS" keygen --name=q --quota-concurrent="$bad" --olp-home="$H"
	expect 2 "$KEYS" set-quota --id="$q_id" --concurrent="$bad" --olp-home="$H"
done
expect 2 "$KEYS" set-quota --id="$q_id" --concurrent=1025 --olp-home="$H"
grep -q -- '1 to 1024' "$T/err" || fail "a bad concurrency's message: $(cat "$T/err")"
[ "$(ls "$H/keys" | wc -l)" = "$((n_before + 1))" ] || fail "a refused concurrency created a key"
[ "$(json "$H/keys/$q_id/manifest.json" 'd["quota"]')" = "{'requests_per_minute': 7}" ] ||
	fail "a refused concurrency changed the quota"
expect 0 "$KEYS" keygen --name=conc --quota-concurrent=2 --json --olp-home="$H"
c_id=$(json "$T/out" 'd["id"]')
[ "$(json "$T/out" 'd["quota"]')" = "{'max_concurrent': 2}" ] || fail "keygen --quota-concurrent: $(cat "$T/out")"
[ "$(json "$H/keys/$c_id/manifest.json" 'd["quota"]')" = "{'max_concurrent': 2}" ] ||
	fail "manifest max_concurrent"
expect 0 "$KEYS" set-quota --id="$q_id" --concurrent=3 --olp-home="$H"
grep -q 'rpm=7,concurrent=3' "$T/out" || fail "set-quota --concurrent output: $(cat "$T/out")"
[ "$(json "$H/keys/$q_id/manifest.json" 'd["quota"]')" = "{'requests_per_minute': 7, 'max_concurrent': 3}" ] ||
	fail "set-quota --concurrent: $(json "$H/keys/$q_id/manifest.json" 'd["quota"]')"
expect 0 "$KEYS" set-quota --id="$q_id" --quota-concurrent=1024 --olp-home="$H"
[ "$(json "$H/keys/$q_id/manifest.json" 'd["quota"]["max_concurrent"]')" = 1024 ] ||
	fail "set-quota --quota-concurrent"
expect 0 "$KEYS" list --olp-home="$H"
grep "$q_id" "$T/out" | grep -q 'rpm=7,concurrent=1024' || fail "list lacks max_concurrent: $(cat "$T/out")"
expect 0 "$KEYS" list --json --olp-home="$H"
[ "$(json "$T/out" '[k["quota"] for k in d if k["id"]=="'"$c_id"'"][0]')" = "{'max_concurrent': 2}" ] ||
	fail "list --json max_concurrent"
expect 0 "$KEYS" set-quota --id="$q_id" --concurrent=none --olp-home="$H"
[ "$(json "$H/keys/$q_id/manifest.json" 'd["quota"]')" = "{'requests_per_minute': 7}" ] ||
	fail "--concurrent=none"
expect 0 "$KEYS" set-quota --id="$c_id" --clear --olp-home="$H"
[ "$(json "$H/keys/$c_id/manifest.json" 'd["quota"]')" = None ] || fail "--clear clears max_concurrent"
expect 1 "$KEYS" set-quota --id=nosuch00 --quota-rpd=1 --olp-home="$H"
grep -q 'no key nosuch00' "$T/err" || fail "set-quota of a missing key: $(cat "$T/err")"
expect 1 "$KEYS" set-quota --id=../etc --quota-rpd=1 --olp-home="$H"

# usage: nothing yet (and no database made by asking), then per key, provider and day.
expect 0 "$KEYS" usage --olp-home="$H"
grep -q 'No usage recorded' "$T/out" || fail "usage on an empty ledger: $(cat "$T/out")"
[ -e "$H/usage.db" ] && fail "olp-keys usage created the workers' database"
expect 0 "$KEYS" usage --json --olp-home="$H"
[ "$(json "$T/out" 'd')" = "[]" ] || fail "usage --json on an empty ledger"
# Yesterday and today (UTC): within the ledger's retention, which prunes older rows.
now_s=$(date -u +%s)
day1=$(((now_s / 86400 - 1) * 86400 * 1000))
d1=$(date -u -d "@$((day1 / 1000))" +%Y-%m-%d)
d2=$(date -u -d "@$((day1 / 1000 + 86400))" +%Y-%m-%d)
"$FILL" "$H" "$q_id" claude 200 10 20 $((day1 + 1000)) || fail "usage-fill"
"$FILL" "$H" "$q_id" claude 500 5 0 $((day1 + 2000)) || fail "usage-fill"
"$FILL" "$H" "$q_id" codex 200 1 2 $((day1 + 3000)) || fail "usage-fill"
"$FILL" "$H" "$q_id" - 429 0 0 $((day1 + 86400000)) || fail "usage-fill"
"$FILL" "$H" "$owner_id" claude 200 100 200 $((day1 + 86400000 + 5)) alice || fail "usage-fill"
[ "$(stat -c %a "$H/usage.db")" = 600 ] || fail "usage.db mode"
expect 0 "$KEYS" usage --json --olp-home="$H"
[ "$(json "$T/out" 'len(d)')" = 4 ] || fail "usage rows: $(cat "$T/out")"
# The provider's account (ADR 0037): a member of each row, null where none ran.
[ "$(json "$T/out" 'sorted(str(r["account"]) for r in d)')" = "['None', 'None', 'None', 'alice']" ] ||
	fail "usage --json account: $(cat "$T/out")"
[ "$(json "$T/out" '[(r["date"], r["name"], r["provider"], r["requests"], r["errors"], r["prompt_tokens"], r["completion_tokens"]) for r in d][0]')" = "('$d1', 'quota', 'claude', 2, 1, 15, 20)" ] ||
	fail "usage claude row: $(cat "$T/out")"
[ "$(json "$T/out" '[r["provider"] for r in d if r["date"]=="'"$d2"'" and r["key_id"]=="'"$q_id"'"][0]')" = None ] ||
	fail "a row without a provider"
expect 0 "$KEYS" usage --id="$owner_id" --json --olp-home="$H"
[ "$(json "$T/out" '[(r["name"], r["requests"], r["prompt_tokens"]) for r in d]')" = "[('owner', 1, 100)]" ] ||
	fail "usage --id: $(cat "$T/out")"
expect 0 "$KEYS" usage --since="$d2" --json --olp-home="$H"
[ "$(json "$T/out" 'len(d)')" = 2 ] || fail "usage --since"
expect 0 "$KEYS" usage --olp-home="$H"
grep "^$d1" "$T/out" | grep "$q_id" | grep -q 'quota' || fail "usage table: $(cat "$T/out")"
grep -q 'PROMPT' "$T/out" || fail "usage table header"
grep -q 'ACCOUNT' "$T/out" || fail "usage table: no ACCOUNT column"
grep "^$d2" "$T/out" | grep "$owner_id" | grep -q ' claude  *alice ' ||
	fail "usage table: the row's account: $(cat "$T/out")"
# --account: that account's rows only (ADR 0037), with --id and --since too.
expect 0 "$KEYS" usage --account=alice --json --olp-home="$H"
[ "$(json "$T/out" '[(r["key_id"], r["account"], r["requests"]) for r in d]')" = "[('$owner_id', 'alice', 1)]" ] ||
	fail "usage --account: $(cat "$T/out")"
expect 0 "$KEYS" usage --account=alice --id="$q_id" --json --olp-home="$H"
[ "$(json "$T/out" 'd')" = "[]" ] || fail "usage --account --id: $(cat "$T/out")"
expect 0 "$KEYS" usage --account=alice --since="$d2" --olp-home="$H"
grep "^$d2" "$T/out" | grep -q ' claude  *alice ' || fail "usage --account table: $(cat "$T/out")"
grep -q ' codex ' "$T/out" && fail "usage --account: another account's row"
expect 0 "$KEYS" usage --account=bob --olp-home="$H"
grep -q 'No usage recorded on account bob' "$T/out" || fail "usage --account=bob: $(cat "$T/out")"
for bad in Alice a.b '' abcdefghijabcdefghijabcdefghijabc 'a b'; do
	expect 2 "$KEYS" usage --account="$bad" --olp-home="$H"
done
grep -q 'account name' "$T/err" || fail "--account message: $(cat "$T/err")"
for bad in 2026-1-1 2026-13-01 2026-02-30 yesterday 2026-01-01x; do
	expect 2 "$KEYS" usage --since="$bad" --olp-home="$H"
done
grep -q 'YYYY-MM-DD' "$T/err" || fail "--since message: $(cat "$T/err")"
expect 2 "$KEYS" usage --clear --olp-home="$H"
# The ledger holds no token and no hash.
grep -q "$owner_tok" "$H/usage.db" "$H"/usage.db-* 2>/dev/null && fail "a token in the ledger"

# Logins (issue 22): keygen --allow-login and set-login write "login_access", say the risk
# in words, refuse an owner key; list shows it; a key without one has no such field.
expect 2 "$KEYS" keygen --owner --force --allow-login=codex --olp-home="$H"
expect 2 "$KEYS" keygen --name=l --allow-login=, --olp-home="$H"
expect 0 "$KEYS" keygen --name=login1 --allow-login=codex --json --olp-home="$H"
l_id=$(json "$T/out" 'd["id"]')
grep -q "prompts can read codex's login" "$T/err" || fail "keygen --allow-login does not say the risk: $(cat "$T/err")"
[ "$(json "$H/keys/$l_id/manifest.json" 'd["login_access"]')" = "['codex']" ] || fail "manifest login_access"
[ "$(json "$H/keys/$q_id/manifest.json" '"login_access" in d')" = False ] || fail "login_access written unasked"
expect 2 "$KEYS" set-login --id="$l_id" --olp-home="$H"
expect 2 "$KEYS" set-login --id="$l_id" --allow=vibe --deny=codex --olp-home="$H"
expect 2 "$KEYS" set-quota --id="$l_id" --allow=vibe --olp-home="$H"
expect 0 "$KEYS" set-login --id="$l_id" --allow=vibe --olp-home="$H"
grep -q 'login access codex,vibe' "$T/out" || fail "set-login --allow output: $(cat "$T/out")"
grep -q "prompts can read vibe's login" "$T/err" || fail "set-login --allow does not say the risk"
expect 0 "$KEYS" set-login --id="$l_id" --deny=codex --json --olp-home="$H"
[ "$(json "$T/out" 'd["login_access"]')" = "['vibe']" ] || fail "set-login --deny: $(cat "$T/out")"
expect 0 "$KEYS" list --json --olp-home="$H"
[ "$(json "$T/out" '[k["login_access"] for k in d if k["id"]=="'"$l_id"'"][0]')" = "['vibe']" ] || fail "list --json login_access"
expect 0 "$KEYS" list --olp-home="$H"
grep "$l_id" "$T/out" | grep -q 'vibe' || fail "list lacks the login access: $(cat "$T/out")"
expect 1 "$KEYS" set-login --id="$owner_id" --allow=codex --olp-home="$H"
expect 0 "$KEYS" set-login --id="$l_id" --clear --olp-home="$H"
[ "$(json "$H/keys/$l_id/manifest.json" '"login_access" in d')" = False ] || fail "set-login --clear leaves the field"

# Accounts (issue 26, ADR 0037): keygen --account and set-account write "accounts"
# ({"provider": "account"}), --clear takes one back, the field goes when empty; bad names
# and a binding given twice are refused.
expect 0 "$KEYS" keygen --name=acc1 --account=claude=alice,codex=bob --json --olp-home="$H"
a_id=$(json "$T/out" 'd["id"]')
[ "$(json "$H/keys/$a_id/manifest.json" 'd["accounts"]')" = "{'claude': 'alice', 'codex': 'bob'}" ] || fail "keygen --account: $(cat "$H/keys/$a_id/manifest.json")"
[ "$(json "$H/keys/$q_id/manifest.json" '"accounts" in d')" = False ] || fail "accounts written unasked"
expect 1 "$KEYS" keygen --name=acc2 --account=claude=Alice --olp-home="$H"
expect 1 "$KEYS" keygen --name=acc2 --account=claude --olp-home="$H"
expect 1 "$KEYS" keygen --name=acc2 --account=claude=a,claude=b --olp-home="$H"
expect 2 "$KEYS" set-account --id="$a_id" --olp-home="$H"
expect 2 "$KEYS" set-account --id="$a_id" --clear claude=alice --olp-home="$H"
expect 2 "$KEYS" set-account claude=bob --olp-home="$H"
expect 1 "$KEYS" set-account --id="$a_id" claude=../x --olp-home="$H"
expect 1 "$KEYS" set-account --id=nosuchk1 claude=bob --olp-home="$H"
expect 0 "$KEYS" set-account --id="$a_id" claude=carol --olp-home="$H"
grep -q 'provider claude uses account carol only' "$T/out" || fail "set-account output: $(cat "$T/out")"
expect 0 "$KEYS" set-account --id="$a_id" --clear codex --json --olp-home="$H"
[ "$(json "$T/out" 'd["account"]')" = None ] || fail "set-account --clear --json: $(cat "$T/out")"
[ "$(json "$H/keys/$a_id/manifest.json" 'd["accounts"]')" = "{'claude': 'carol'}" ] || fail "set-account: $(cat "$H/keys/$a_id/manifest.json")"
expect 0 "$KEYS" list --json --olp-home="$H"
[ "$(json "$T/out" '[k["accounts"] for k in d if k["id"]=="'"$a_id"'"][0]')" = "{'claude': 'carol'}" ] || fail "list --json accounts"
expect 0 "$KEYS" list --olp-home="$H"
grep "$a_id" "$T/out" | grep -q 'accounts:claude=carol' || fail "list lacks the accounts: $(cat "$T/out")"
expect 0 "$KEYS" set-account --id="$a_id" --clear claude --olp-home="$H"
[ "$(json "$H/keys/$a_id/manifest.json" '"accounts" in d')" = False ] || fail "set-account --clear leaves the field"
# A manifest whose accounts are not names is invalid: the key is left out, never unbound.
python3 -c 'import json,sys; p=sys.argv[1]; d=json.load(open(p)); d["accounts"]={"claude": 7}; json.dump(d, open(p, "w"))' "$H/keys/$a_id/manifest.json"
expect 0 "$KEYS" list --json --olp-home="$H"
[ "$(json "$T/out" '[k for k in d if k["id"]=="'"$a_id"'"]')" = "[]" ] || fail "a key with a bad accounts field is listed"
rm -rf "$H/keys/$a_id"

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

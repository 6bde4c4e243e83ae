// Provider accounts, one login per person (issue 26 item 1, ADR 0037), through the whole
// path: curl → lighttpd → olp-fcgi → bubblewrap → a command provider with two accounts,
// alice and bob, whose logins are two directories. The command prints its account and
// its login dir's file, so each answer says which account ran it. A key bound to bob
// (olp-keys keygen --account) always gets bob; an unbound key sticks to one account
// across requests and moves to the other only when its account is rejected: the command
// (prompt "reject") makes one request (curl) through the worker's forwarder to the fake
// Anthropic upstream, which answers 429 with the account's limit rejected for a while
// (model "*-limitonceN"), as an upstream says of a subscription at its limit. /health,
// /v1/usage and /metrics show the accounts; the ledger's rows carry the account that ran
// them, so /v1/usage and olp-keys usage split a key's days and totals by account.
//
// Env (CTest): what harness.mjs needs, and OLP_KEYS.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { startServer, curl, chatBody, makeHome, olpKeys, testRegistry, testConfig, waitFor } from './harness.mjs';
import { startUpstream } from '../upstream/procs.mjs';

// How long the fake upstream keeps the account rejected.
const RESET_S = 60;
let anthropic, server, work, home, bobKey, freeKey, bobSet;
const children = new Set();

// The command: its account, its login file, and with "reject" in the prompt one request
// to the upstream whose answer rejects the account.
const script = [
  'p=$(cat)',
  'echo "acct=$OLP_ACCOUNT"',
  'cat "$OLP_ACCOUNT_HOME/login.txt"',
  'case "$p" in *reject*) /usr/bin/curl -s -o /dev/null -w "upstream=%{http_code}\\n" -X POST'
    + ' -H "content-type: application/json" http://127.0.0.1:4180/v1/messages'
    + ` -d '{"model":"acct-limitonce${RESET_S}","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}';; esac`,
].join('; ');

before(async () => {
  work = fs.mkdtempSync(path.join(os.tmpdir(), 'olp-accounts-'));
  fs.chmodSync(work, 0o755);
  for (const who of ['alice', 'bob']) {
    fs.mkdirSync(path.join(work, who), { mode: 0o755 });
    fs.writeFileSync(path.join(work, who, 'login.txt'), `${who.toUpperCase()}-LOGIN\n`, { mode: 0o644 });
  }
  anthropic = await startUpstream('fake-anthropic.mjs', {}, children);
  const registry = testRegistry();
  registry.providers.acct = {
    type: 'command', displayName: 'Accounts', argv: ['/bin/sh', '-c', script], timeout_s: 30,
    network: { upstream: anthropic.url },
    accounts: { alice: { home: path.join(work, 'alice') }, bob: { home: path.join(work, 'bob') } },
    default_account: 'alice',
    models: [{ id: 'acct', created: 1700000000 }],
  };
  const dirs = makeHome({ registry, config: testConfig() });
  home = dirs.home;
  bobKey = olpKeys(dirs.home, 'keygen', '--name=bob', '--tier=guest', '--account=acct=bob');
  freeKey = olpKeys(dirs.home, 'keygen', '--name=free', '--tier=guest');
  bobSet = olpKeys(dirs.home, 'keygen', '--name=later', '--tier=guest');
  olpKeys(dirs.home, 'set-account', `--id=${bobSet.id}`, 'acct=bob');
  server = await startServer({ dirs });
});

after(async () => {
  await server?.stop();
  for (const c of children) c.kill('SIGTERM');
  if (work) fs.rmSync(work, { recursive: true, force: true });
});

const ask = (key, content = 'hello') => curl(server, { method: 'POST', path: '/v1/chat/completions',
  auth: `Bearer ${key.token}`, headers: { 'Content-Type': 'application/json' },
  body: JSON.stringify(chatBody('acct', content)) });
const text = (r) => r.json?.choices?.[0]?.message?.content ?? '';
const accountOf = (r) => (/acct=(\w+)/.exec(text(r)) ?? [])[1];

test('a key bound to bob always gets bob, and only bob\'s login', async () => {
  for (const key of [bobKey, bobSet]) {
    for (let i = 0; i < 5; i++) {
      const r = await ask(key);
      assert.equal(r.status, 200, r.text);
      assert.equal(accountOf(r), 'bob', text(r));
      assert.match(text(r), /BOB-LOGIN/);
      assert.doesNotMatch(text(r), /ALICE-LOGIN/);
    }
  }
  const u = await curl(server, { path: '/v1/usage', auth: `Bearer ${bobKey.token}` });
  assert.equal(u.status, 200, u.text);
  assert.deepEqual(Object.keys(u.json.accounts.acct), ['bob']);
});

test('an unbound key sticks to one account and moves only when it is rejected', async () => {
  const seen = new Set();
  for (let i = 0; i < 10; i++) {
    const r = await ask(freeKey);
    assert.equal(r.status, 200, r.text);
    seen.add(accountOf(r));
    const acc = accountOf(r);
    assert.match(text(r), new RegExp(`${acc.toUpperCase()}-LOGIN`));
  }
  assert.equal(seen.size, 1, `one account for ten requests: ${[...seen]}`);
  const [first] = seen;
  const other = first === 'alice' ? 'bob' : 'alice';
  // Its run makes the upstream reject its account.
  const r = await ask(freeKey, 'please reject');
  assert.equal(r.status, 200, r.text);
  assert.match(text(r), /upstream=429/);
  const h = await curl(server, { path: '/health', auth: true });
  assert.equal(h.json.providers.acct.accounts[first].limited, true, JSON.stringify(h.json.providers.acct));
  assert.equal(h.json.providers.acct.accounts[other].limited, false);
  assert.deepEqual(Object.keys(h.json.providers.acct.accounts).sort(), ['alice', 'bob']);
  assert.equal(h.json.providers.acct.accounts.alice.default, true);
  assert.equal(h.json.providers.acct.accounts.bob.default, false);
  assert.ok('login' in h.json.providers.acct.accounts.bob, 'the owner sees each account\'s login');
  for (let i = 0; i < 5; i++) {
    const m = await ask(freeKey);
    assert.equal(m.status, 200, m.text);
    assert.equal(accountOf(m), other, text(m));
  }
  const metrics = (await curl(server, { path: '/metrics', auth: true })).text;
  assert.match(metrics, new RegExp(`olp_account_limited\\{provider="acct",account="${first}"\\} 1`));
  // Every run counted by its account: bob's ten of the first test at least.
  const runs = (acc) => Number((new RegExp(`olp_account_requests_total\\{provider="acct",account="${acc}"\\} (\\d+)`)
    .exec(metrics) ?? [])[1]);
  assert.ok(runs('bob') >= 10 && runs('alice') >= 1, metrics);
  const u = await curl(server, { path: '/v1/usage', auth: `Bearer ${freeKey.token}` });
  assert.deepEqual(Object.keys(u.json.accounts.acct), [other]);
  // The other account rejected too (the unbound key's run there meets the same upstream
  // answer): bob's key gets a 429 with Retry-After, never alice's account; so does the
  // unbound key, with both rejected.
  const r2 = await ask(freeKey, 'please reject');
  assert.equal(r2.status, 200, r2.text);
  assert.equal(accountOf(r2), other);
  assert.match(text(r2), /upstream=429/);
  for (const key of [bobKey, freeKey]) {
    const b = await ask(key);
    assert.equal(b.status, 429, b.text);
    assert.ok(Number(b.headers['retry-after']) > 0, JSON.stringify(b.headers));
    assert.equal(b.json.error.code, 'subscription_limit');
  }
  assert.match((await ask(bobKey)).json.error.message, /account bob/);
});

test('the ledger splits a key\'s requests by account: /v1/usage and olp-keys usage', async () => {
  // The unbound key ran on both accounts (the test before): its own view shows both, with
  // every day row and recent row carrying its account. Rows are written after each
  // answer is out: wait for the 17 served.
  let u;
  const served17 = (x) =>
    (x.json?.keys?.[0]?.by_account ?? []).filter((a) => a.provider === 'acct').reduce((n, a) => n + a.requests - a.errors, 0) >= 17;
  await waitFor(async () => served17((u = await curl(server, { path: '/v1/usage?recent=50', auth: `Bearer ${freeKey.token}` }))),
    { timeoutMs: 10000, stepMs: 200 });
  assert.equal(u.status, 200, u.text);
  assert.equal(u.json.keys.length, 1);
  const k = u.json.keys[0];
  assert.equal(k.key_id, freeKey.id);
  const runs = {};
  for (const a of k.by_account) if (a.provider === 'acct' && a.account) runs[a.account] = a.requests - a.errors;
  assert.deepEqual(Object.keys(runs).sort(), ['alice', 'bob'], JSON.stringify(k.by_account));
  // 11 answered on the first account, 6 on the other (the test before).
  assert.deepEqual(Object.values(runs).sort((a, b) => a - b), [6, 11], JSON.stringify(k.by_account));
  const fromDays = {};
  for (const d of k.days) {
    assert.ok('account' in d, JSON.stringify(d));
    if (d.provider === 'acct' && d.account) fromDays[d.account] = (fromDays[d.account] ?? 0) + d.requests - d.errors;
  }
  assert.deepEqual(fromDays, runs);
  const ok = u.json.recent.filter((r) => r.status === 200);
  assert.ok(ok.length >= 17, JSON.stringify(u.json.recent));
  for (const r of ok) assert.ok(r.account === 'alice' || r.account === 'bob', JSON.stringify(r));
  // The owner, one key: bob's key ran on bob only.
  const o = await curl(server, { path: `/v1/usage?key=${bobKey.id}&recent=50`, auth: true });
  assert.equal(o.status, 200, o.text);
  const bk = o.json.keys.find((x) => x.key_id === bobKey.id);
  const served = bk.by_account.filter((a) => a.requests > a.errors);
  assert.deepEqual(served.map((a) => [a.provider, a.account]), [['acct', 'bob']], JSON.stringify(bk.by_account));
  assert.equal(served[0].requests - served[0].errors, 5);
  for (const r of o.json.recent.filter((x) => x.status === 200)) assert.equal(r.account, 'bob');
  // olp-keys usage --json: the same rows, with their account.
  const rows = olpKeys(home, 'usage', `--id=${freeKey.id}`);
  const accts = new Set(rows.filter((r) => r.provider === 'acct' && r.requests > r.errors).map((r) => r.account));
  assert.deepEqual([...accts].sort(), ['alice', 'bob'], JSON.stringify(rows));
});

test('GET /v1/usage?account= and olp-keys usage --account: one account\'s rows', async () => {
  const get = (q, auth) => curl(server, { path: `/v1/usage${q}`, auth });
  const owner = (q) => get(q, true);
  // The owner: bob's rows of every key, and only the keys with some (bob's key, the key
  // set later, the unbound one that moved there).
  const all = await owner('?recent=200');
  const b = await owner('?account=bob&recent=200');
  assert.equal(b.status, 200, b.text);
  assert.equal(b.json.account, 'bob');
  assert.ok(b.json.keys.length >= 3, JSON.stringify(b.json.keys.map((k) => k.key_id)));
  for (const k of b.json.keys) {
    assert.ok(k.days.length > 0, `a key without bob's rows listed: ${k.key_id}`);
    for (const d of k.days) assert.equal(d.account, 'bob', JSON.stringify(d));
    for (const a of k.by_account) assert.equal(a.account, 'bob');
    // Its totals are bob's: the sum of the key's bob rows in the unfiltered answer.
    const full = all.json.keys.find((x) => x.key_id === k.key_id);
    const want = full.days.filter((d) => d.account === 'bob').reduce((s, d) => s + d.requests, 0);
    assert.equal(k.totals.requests, want, k.key_id);
  }
  assert.ok(b.json.keys.some((k) => k.key_id === bobKey.id));
  assert.ok(b.json.recent.length > 0);
  for (const r of b.json.recent) assert.equal(r.account, 'bob', JSON.stringify(r));
  assert.deepEqual(Object.keys(b.json.accounts.acct), ['bob']);
  assert.ok('login' in b.json.accounts.acct.bob, 'the owner\'s view of the account');
  // With the other parameters: ?key= and ?since=.
  const bk = await owner(`?account=bob&key=${bobKey.id}&since=2020-01-01`);
  assert.equal(bk.status, 200, bk.text);
  assert.deepEqual(bk.json.keys.map((k) => k.key_id), [bobKey.id]);
  assert.equal(bk.json.keys[0].totals.requests - bk.json.keys[0].totals.errors, 5);
  const future = await owner('?account=bob&since=2999-01-01');
  assert.equal(future.status, 200);
  assert.deepEqual(future.json.keys, []);
  // An account no provider has: an answer without rows.
  const none = await owner('?account=carol');
  assert.equal(none.status, 200, none.text);
  assert.deepEqual(none.json.keys, []);
  assert.deepEqual(none.json.recent, []);
  assert.deepEqual(none.json.accounts.acct, {});

  // A guest key: its own rows on an account its requests ran on.
  const gb = await get('?account=bob', `Bearer ${bobKey.token}`);
  assert.equal(gb.status, 200, gb.text);
  assert.equal(gb.json.keys.length, 1);
  assert.equal(gb.json.keys[0].key_id, bobKey.id);
  assert.ok(gb.json.keys[0].totals.requests >= 5);
  assert.deepEqual(Object.keys(gb.json.accounts.acct), ['bob']);
  assert.ok(!('login' in gb.json.accounts.acct.bob), 'a key does not see the login');
  // Another person's account, and one that does not exist, answer alike: nothing of
  // alice's (her name, her limits, her use) shows.
  const ga = await get('?account=alice&recent=50', `Bearer ${bobKey.token}`);
  const gc = await get('?account=carol&recent=50', `Bearer ${bobKey.token}`);
  assert.equal(ga.status, 200, ga.text);
  assert.equal(gc.status, 200, gc.text);
  const strip = (j) => JSON.stringify({ ...j, account: null, generated_at: null });
  assert.equal(strip(ga.json), strip(gc.json));
  assert.deepEqual(ga.json.accounts.acct, {});
  assert.equal(ga.json.keys[0].totals.requests, 0);
  assert.deepEqual(ga.json.recent, []);
  assert.ok(!ga.text.includes('ALICE') && !/"alice"/.test(ga.text.replace('"account":"alice"', '')), ga.text);
  // The unbound key ran on both: each filter gives its own share.
  const fb = await get('?account=bob', `Bearer ${freeKey.token}`);
  const fa = await get('?account=alice', `Bearer ${freeKey.token}`);
  const ok = (r) => r.json.keys[0].totals.requests - r.json.keys[0].totals.errors;
  assert.deepEqual([ok(fa), ok(fb)].sort((x, y) => x - y), [6, 11]);
  // A guest's ?key= of another key is still refused.
  const other = await get(`?account=bob&key=${freeKey.id}`, `Bearer ${bobKey.token}`);
  assert.equal(other.status, 403, other.text);

  // Malformed names: 400, an OpenAI error object naming the parameter.
  for (const bad of ['Bob', 'a.b', '', 'x'.repeat(33), '%ZZ', '..%2Fx', 'b%20ob']) {
    const r = await owner(`?account=${bad}`);
    assert.equal(r.status, 400, `${bad}: ${r.text}`);
    assert.ok(r.json, `${bad}: ${r.text}`);
    assert.equal(r.json.error.type, 'invalid_request_error');
    assert.equal(r.json.error.param, 'account');
    assert.match(r.json.error.message, /^account: must be an account name/);
  }
  // Unknown parameters are ignored, as before.
  const unk = await owner('?account=bob&color=blue');
  assert.equal(unk.status, 200);
  // No key, or a bad one: 401, whatever the account.
  const nokey = await get('?account=bob', false);
  assert.equal(nokey.status, 401, nokey.text);
  const badkey = await get('?account=bob', 'Bearer sk-olp-not-a-key-at-all-0000000000');
  assert.equal(badkey.status, 401, badkey.text);

  // olp-keys usage --account: the same rows.
  const rows = olpKeys(home, 'usage', '--account=bob');
  assert.ok(rows.length > 0);
  for (const r of rows) assert.equal(r.account, 'bob', JSON.stringify(r));
  const mine = olpKeys(home, 'usage', '--account=bob', `--id=${bobKey.id}`);
  assert.equal(mine.reduce((s, r) => s + r.requests - r.errors, 0), 5);
  assert.deepEqual(olpKeys(home, 'usage', '--account=carol'), []);
});

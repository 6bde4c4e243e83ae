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

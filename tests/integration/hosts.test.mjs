// Two hosts behind a load balancer, one PostgreSQL (issue 25 item 6, ADR 0034): two real
// lighttpd + olp-fcgi stacks, each with its own OLP_HOME whose config.json names the
// store, sharing only the database (a with-pg.sh cluster), behind a real HAProxy (round
// robin). Keys are made and revoked with the real olp-keys against one host's home.
//
// - a key made on host a works through b and the balancer;
// - revoked on a, refused by every worker of both hosts within 2 s (measured);
// - requests_per_day 5 under 40 concurrent requests spread over both hosts: exactly 5
//   served, 35 refused (429 quota_exceeded);
// - max_concurrent 1 across hosts: a slow stream on a, the key's next request on b is 429;
// - /v1/usage and the dashboard's data on either host show both hosts' requests;
// - the database stopped and started under load: no worker crashes (/health/live 200
//   throughout, the same worker pids), /health says the store is away and since when,
//   keys already known keep working, quota keys and unknown keys get 503
//   store_unavailable, and once it is back every request served meanwhile is in the ledger
//   and everything works within 10 s;
// - SQL injection through key names, notes, model ids, tokens and query parameters:
//   stored verbatim, the tables intact;
// - the accounts' limits and sticky choices are shared (ADR 0035 and 0037 amendments): a
//   command provider with two accounts (alice, bob) whose runs print the account they ran
//   as and make one request to a fake Anthropic upstream through the worker's forwarder;
//   an account the upstream rejects on host a gets the next request on host b a 429 with
//   Retry-After and no run (the upstream's request count does not move); an unbound key
//   sent round robin over both hosts runs on one account every time, also when host a
//   chose it while the other account was rejected and host b first sees it after the
//   reset (a host choosing on its own would then pick the other account).
//
// CTest runs it as `tests/pg/with-pg.sh node --test hosts.test.mjs` (it_hosts): no
// PostgreSQL server installed is a skip (77, from with-pg.sh), and so is no HAProxy (77,
// below); nothing else is.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';

import { fcgiRequest } from './fcgi-client.mjs';
import { chatBody, commandProvider, curl, jsonOrUndefined, waitFor } from './harness.mjs';
import { haproxyBin, olpKeysRun, pgCtl, psql, startHosts } from './hosts.mjs';
import { meteredRegistry } from './metered.mjs';
import { startUpstream } from '../upstream/procs.mjs';

if (!haproxyBin()) {
  process.stderr.write('it_hosts: skipped: haproxy is not installed (deploy/olp-local test installs it)\n');
  process.exit(77);
}

const bearer = (t) => `Bearer ${t}`;

// 30 lines 0.2 s apart: about 6 s, far longer than the requests made while it runs.
const SLOW = 'cat >/dev/null; i=0; while [ $i -lt 30 ]; do echo "tick $i"; sleep 0.2; i=$((i+1)); done';

// How long the fake upstream keeps an account rejected (its "-limitonce<N>" model).
const RESET_S = 120;
// ... and a short rejection, that passes within the test.
const SHORT_S = 10;

// The accounts' command: its account, then one request to the upstream through the
// worker's forwarder (whose answer's limits the worker keeps): a rejecting one when the
// prompt says "reject", else one that announces the account allowed.
const ACCT = [
  'p=$(cat)',
  'echo "acct=$OLP_ACCOUNT"',
  `case "$p" in *reject-short*) m=acct-limitonce${SHORT_S};; *reject*) m=acct-limitonce${RESET_S};; *) m=acct-limits;; esac`,
  '/usr/bin/curl -s -o /dev/null -w "upstream=%{http_code}\\n" -X POST -H "content-type: application/json"'
    + ' http://127.0.0.1:4180/v1/messages'
    + ' -d "{\\"model\\":\\"$m\\",\\"max_tokens\\":5,\\"messages\\":[{\\"role\\":\\"user\\",\\"content\\":\\"hi\\"}]}"',
].join('; ');

function registry(upstream, work) {
  const r = meteredRegistry();
  r.providers.slow = commandProvider('slow', ['/bin/sh', '-c', SLOW], { timeout_s: 60 });
  r.providers.acct = {
    type: 'command', displayName: 'Accounts', argv: ['/bin/sh', '-c', ACCT], timeout_s: 30,
    network: { upstream },
    accounts: { alice: { home: path.join(work, 'alice') }, bob: { home: path.join(work, 'bob') } },
    default_account: 'alice',
    models: [{ id: 'acct', created: 1700000000 }],
  };
  return r;
}

// olp-keys with host h's home (and so its config.json's store): the parsed JSON.
function keys(h, ...args) {
  const r = olpKeysRun(h.home, args);
  if (r.status !== 0) throw new Error(`olp-keys ${args.join(' ')} exited ${r.status}: ${r.stderr}`);
  return r.json;
}

// A request straight to one worker process's FastCGI socket (no balancing).
async function direct(sock, { method = 'GET', uri, token, body }) {
  const headers = {};
  if (token) headers.authorization = bearer(token);
  if (body !== undefined) headers['content-type'] = 'application/json';
  const r = await fcgiRequest(sock, { method, uri, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  return { status: r.status, headers: Object.fromEntries(r.headers), text: r.text, json: r.json };
}

// The same request to every worker of every host given: [{host, pid, res}].
async function everyWorker(hosts, req) {
  const out = [];
  for (const h of hosts)
    for (const { sock, pid } of h.workerSockets()) out.push({ host: h.name, pid, res: await direct(sock, req) });
  return out;
}

// A request (through the balancer or to one host) on a connection of its own, so that no
// kept-alive connection the server is closing is reused: status, host, headers.get(), json.
function send(target, { method = 'POST', path = '/v1/chat/completions', token, body }) {
  const payload = body === undefined ? undefined : JSON.stringify(body);
  const headers = {
    ...(token ? { Authorization: bearer(token) } : {}),
    ...(payload !== undefined ? { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(payload) } : {}),
  };
  return new Promise((resolve, reject) => {
    const req = http.request(target.url(path), { method, agent: false, headers, timeout: 60000 }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d) => (text += d));
      res.on('error', reject);
      res.on('end', () => {
        const json = jsonOrUndefined(text);
        const get = (n) => res.headers[n.toLowerCase()] ?? null;
        resolve({ status: res.statusCode, host: get('x-olp-host'), headers: { get }, text, json });
      });
    });
    req.on('timeout', () => req.destroy(new Error(`${method} ${path}: no answer in 60 s`)));
    req.on('error', reject);
    req.end(payload);
  });
}

const chat = (target, token, model = 'echo', content = 'hello') => send(target, { token, body: chatBody(model, content) });

// The owner's /v1/usage row of one key, as host h sees it.
async function usageOf(h, token, id) {
  const u = await send(h, { method: 'GET', path: `/v1/usage?key=${id}&recent=200`, token });
  assert.equal(u.status, 200, u.text);
  return { key: u.json.keys.find((k) => k.key_id === id), recent: u.json.recent, all: u.json };
}

// A streaming request that resolves `started` once its first tick came, `done` when it ends.
function stream(target, token, model) {
  const payload = JSON.stringify(chatBody(model, 'slowly', { stream: true }));
  let onStart;
  const started = new Promise((r) => {
    onStart = r;
  });
  let req;
  const done = new Promise((resolve, reject) => {
    req = http.request(
      target.url('/v1/chat/completions'),
      {
        method: 'POST',
        agent: false,
        headers: { Authorization: bearer(token), 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(payload) },
      },
      (res) => {
        let body = '';
        res.setEncoding('utf8');
        res.on('data', (d) => {
          body += d;
          if (body.includes('tick')) onStart(res);
        });
        res.on('end', () => {
          onStart(res);
          resolve({ status: res.statusCode, body });
        });
        res.on('error', () => resolve({ status: res.statusCode, body, aborted: true }));
      },
    );
    req.on('error', (e) => (req.destroyed ? resolve({ aborted: true }) : reject(e)));
    req.end(payload);
  });
  return { started, done, abort: () => req.destroy() };
}

// The tables of the public schema and their row counts.
function tables() {
  const names = psql("SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1").map((r) => r[0]);
  return Object.fromEntries(names.map((t) => [t, Number(psql(`SELECT count(*) FROM "${t}"`)[0][0])]));
}

describe('two hosts behind HAProxy, one PostgreSQL', () => {
  let env;
  let a;
  let b;
  let lb;
  let owner;

  let upstream;
  let work;
  const children = new Set();

  before(async () => {
    work = fs.mkdtempSync(path.join(os.tmpdir(), 'olp-hosts-accounts-'));
    fs.chmodSync(work, 0o755);
    for (const who of ['alice', 'bob']) fs.mkdirSync(path.join(work, who), { mode: 0o755 });
    upstream = await startUpstream('fake-anthropic.mjs', {}, children);
    env = await startHosts({ n: 2, registry: registry(upstream.url, work), maxProcs: 2, threads: 4 });
    [a, b] = env.hosts;
    lb = env.lb;
    owner = env.ownerToken;
  });
  after(async () => {
    await env?.stop();
    for (const c of children) c.kill('SIGTERM');
    if (work) fs.rmSync(work, { recursive: true, force: true });
  });

  it('the schema is made by the operator; the workers\' role has data rights only', () => {
    const t = tables();
    for (const name of ['olp_schema', 'olp_keys']) assert.ok(name in t, `no table ${name}: ${Object.keys(t)}`);
    // olp_worker may read and write rows, never change the schema.
    const rights = psql(
      "SELECT DISTINCT privilege_type FROM information_schema.role_table_grants WHERE grantee = 'olp_worker' ORDER BY 1",
    ).map((r) => r[0]);
    for (const p of rights) assert.ok(['SELECT', 'INSERT', 'UPDATE', 'DELETE'].includes(p), `olp_worker has ${p}`);
    const owners = psql("SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = 'public'").map((r) => r[0]);
    assert.deepEqual(owners, ['olp_admin']);
    // Both hosts report a healthy store on their owner /health.
    return Promise.all(
      [a, b].map(async (h) => {
        const r = await send(h, { method: 'GET', path: '/health', token: owner });
        assert.equal(r.status, 200, r.text);
        assert.equal(r.json.store?.kind, 'postgresql', `${h.name}: ${r.text}`);
        assert.equal(r.json.store.ok, true, `${h.name}: ${r.text}`);
        assert.equal(r.json.store.accounts_shared, true, `${h.name}: ${r.text}`);
      }),
    );
  });

  it('a key made on host a works on host b and through the balancer', async () => {
    const k = keys(a, 'keygen', '--name=made on a');
    // olp-keys with b's home sees it too: one store.
    assert.ok(keys(b, 'list').some((x) => x.id === k.id), 'b\'s olp-keys lists the key made with a\'s');
    const onB = await everyWorker([b], { method: 'POST', uri: '/v1/chat/completions', token: k.token, body: chatBody('echo', 'hi b') });
    for (const { pid, res } of onB) assert.equal(res.status, 200, `b worker ${pid}: ${res.text}`);
    const hosts = new Set();
    for (let i = 0; i < 4; i++) {
      const r = await chat(lb, k.token, 'echo', `through the balancer ${i}`);
      assert.equal(r.status, 200, r.text);
      assert.equal(typeof r.json.choices[0].message.content, 'string');
      hosts.add(r.host);
    }
    assert.deepEqual([...hosts].sort(), ['a', 'b'], 'round robin reached both hosts');
  });

  it('revoked on host a: refused by every worker of both hosts within 2 s', async () => {
    const k = keys(a, 'keygen', '--name=revokee');
    const req = { method: 'GET', uri: '/v1/models', token: k.token };
    // Every worker of both hosts has accepted (and cached) the key.
    for (const { host, pid, res } of await everyWorker([a, b], req)) assert.equal(res.status, 200, `${host}/${pid}: ${res.text}`);
    const t0 = performance.now();
    keys(a, 'revoke', `--id=${k.id}`);
    const t1 = performance.now();
    const refusedAt = new Map();
    const all = await waitFor(
      async () => {
        for (const { host, pid, res } of await everyWorker([a, b], req)) {
          const w = `${host}/${pid}`;
          if (res.status === 401 && !refusedAt.has(w)) refusedAt.set(w, performance.now() - t1);
          // Once refused, never served again.
          if (refusedAt.has(w)) assert.equal(res.status, 401, `${w} served the revoked key again`);
        }
        return refusedAt.size === a.workerPids().length + b.workerPids().length;
      },
      { timeoutMs: 10000, stepMs: 20 },
    );
    const worst = Math.max(...refusedAt.values());
    process.stderr.write(
      `revocation: olp-keys revoke took ${(t1 - t0).toFixed(0)} ms; then refused after ` +
        `${[...refusedAt].map(([w, t]) => `${w} ${t.toFixed(0)} ms`).join(', ')}\n`,
    );
    assert.ok(all, `not every worker refuses the revoked key: ${JSON.stringify([...refusedAt])}`);
    assert.ok(worst <= 2000, `the last worker refused it ${worst.toFixed(0)} ms after the revocation`);
    const viaLb = await chat(lb, k.token);
    assert.equal(viaLb.status, 401, viaLb.text);
  });

  it('requests_per_day 5 under 40 concurrent requests over both hosts: exactly 5 served', async () => {
    const k = keys(a, 'keygen', '--name=five a day', '--quota-rpd=5');
    const all = await Promise.all(Array.from({ length: 40 }, (_, i) => chat(lb, k.token, 'metered', `n${i}`)));
    const count = (s) => all.filter((r) => r.status === s).length;
    const other = all.filter((r) => r.status !== 200 && r.status !== 429);
    assert.deepEqual(other.map((r) => `${r.status} ${r.text}`), [], 'every answer is 200 or 429');
    assert.equal(count(200), 5, `served: ${count(200)}`);
    assert.equal(count(429), 35, `refused: ${count(429)}`);
    for (const r of all.filter((x) => x.status === 429)) assert.equal(r.json.error.code, 'quota_exceeded');
    assert.deepEqual([...new Set(all.map((r) => r.host))].sort(), ['a', 'b'], 'both hosts answered');
    // Still refused afterwards, by either host; both count 5.
    for (const h of [a, b]) {
      assert.equal((await chat(h, k.token, 'metered')).status, 429);
      const u = await usageOf(h, owner, k.id);
      assert.equal(u.key.quota_state.requests_today, 5, `${h.name}: ${JSON.stringify(u.key)}`);
    }
  });

  it('max_concurrent 1 across hosts: a stream on a, the key\'s request on b is 429, then served', async () => {
    const k = keys(a, 'keygen', '--name=one at a time', '--quota-concurrent=1');
    const first = stream(a, k.token, 'slow');
    await first.started;
    const second = await chat(b, k.token, 'echo', 'on b meanwhile');
    assert.equal(second.status, 429, second.text);
    assert.equal(second.json.error.code, 'concurrency_limit_exceeded');
    assert.equal(second.headers.get('retry-after'), '1');
    // And the other way round, through the balancer: whichever host it reaches refuses.
    for (let i = 0; i < 2; i++) assert.equal((await chat(lb, k.token)).status, 429);
    const end = await first.done;
    assert.equal(end.status, 200);
    assert.match(end.body, /tick 29/);
    // The lease is given back: b serves the key again.
    const again = await waitFor(async () => (await chat(b, k.token, 'echo', 'after')).status === 200, {
      timeoutMs: 5000,
      stepMs: 100,
    });
    assert.ok(again, 'b did not serve the key once the stream on a was over');
  });

  it('/v1/usage and the dashboard\'s data on either host show both hosts\' requests', async () => {
    const k = keys(b, 'keygen', '--name=usage both');
    for (const h of [a, b])
      for (let i = 0; i < 3; i++) assert.equal((await chat(h, k.token, 'metered', `${h.name}${i}`)).status, 200);
    for (const h of [a, b]) {
      // The ledger is written off the request path: wait for the 6 rows.
      let u;
      const ok = await waitFor(
        async () => {
          u = await usageOf(h, owner, k.id);
          return u.key?.totals.requests === 6;
        },
        { timeoutMs: 10000, stepMs: 200 },
      );
      assert.ok(ok, `${h.name}: ${JSON.stringify(u.key)}`);
      assert.equal(u.recent.filter((r) => r.key_id === k.id && r.status === 200).length, 6);
      // The key itself sees the same.
      const own = await send(h, { method: 'GET', path: '/v1/usage', token: k.token });
      assert.equal(own.json.keys[0].totals.requests, 6);
      // The dashboard: its page, and the two calls it makes for its data.
      const page = await send(h, { method: 'GET', path: '/dashboard' });
      assert.equal(page.status, 200);
      assert.match(page.headers.get('content-type'), /text\/html/);
      const data = await send(h, { method: 'GET', path: '/v1/usage?recent=50', token: owner });
      assert.equal(data.json.keys.find((x) => x.key_id === k.id).totals.requests, 6);
      const health = await send(h, { method: 'GET', path: '/health', token: owner });
      assert.equal(health.status, 200);
    }
  });

  it('SQL injection through every stored string: stored verbatim, the tables intact', async () => {
    const before = tables();
    const evil = [
      "Robert'); DROP TABLE olp_keys; --",
      "x' OR '1'='1",
      '"; DELETE FROM olp_requests; --',
      "$$; TRUNCATE olp_schema; $$ \\' \\x27 %s %n ő 😀",
    ];
    const made = evil.map((s, i) => keys(a, 'keygen', `--name=${s}`, `--notes=${evil[(i + 1) % evil.length]}`, '--quota-rpd=100'));
    const listed = keys(b, 'list');
    for (const [i, m] of made.entries()) {
      const row = listed.find((x) => x.id === m.id);
      assert.equal(row?.name, evil[i], `name of ${m.id}`);
      // It works, and its usage shows the name verbatim on the other host.
      assert.equal((await chat(b, m.token, 'metered')).status, 200);
    }
    // Model ids, tokens and query parameters that are SQL: refused, nothing run.
    for (const s of evil) {
      const r = await chat(lb, made[0].token, s);
      assert.equal(r.status, 404, r.text);
      // A header carries Latin-1 at most: the token is the string's ASCII.
      assert.equal((await chat(lb, `olp_${s.replace(/[^\x20-\x7e]/g, '')}`)).status, 401);
      // As a key id: refused, or looked up as the very string (no such key, nothing used).
      const q = await send(a, { method: 'GET', path: `/v1/usage?key=${encodeURIComponent(s)}`, token: owner });
      assert.ok([200, 400].includes(q.status), q.text);
      if (q.status === 200) {
        assert.deepEqual(q.json.keys.map((k) => [k.key_id, k.totals.requests]), [[s, 0]]);
        assert.deepEqual(q.json.recent, []);
      }
    }
    await waitFor(async () => (await usageOf(a, owner, made[0].id)).key?.totals.requests === 1 + evil.length, {
      timeoutMs: 10000,
      stepMs: 200,
    });
    for (const [i, m] of made.entries()) {
      const u = await usageOf(a, owner, m.id);
      assert.equal(u.key.name, evil[i]);
    }
    assert.equal((await usageOf(a, owner, made[0].id)).key.totals.requests, 1 + evil.length);
    // Every table is still there, none lost a row.
    const afterT = tables();
    assert.deepEqual(Object.keys(afterT), Object.keys(before));
    for (const [t, n] of Object.entries(before)) assert.ok(afterT[t] >= n, `${t}: ${n} rows before, ${afterT[t]} after`);
    // The notes too, as another host's olp-keys reads them back.
    const again = keys(b, 'list');
    for (const [i, m] of made.entries())
      assert.equal(again.find((x) => x.id === m.id).notes, evil[(i + 1) % evil.length], `notes of ${m.id}`);
  });

  // The upstream's requests so far (the fake's log): one per run of the accounts' command.
  const upstreamRequests = async () => (await (await fetch(`${upstream.url}/_requests`)).json()).length;
  const accountOf = (r) => (/acct=(\w+)/.exec(r.json?.choices?.[0]?.message?.content ?? '') ?? [])[1];

  it('an unbound key round robin over both hosts runs on one account every time', async () => {
    for (let k = 0; k < 4; k++) {
      const key = keys(a, 'keygen', `--name=unbound ${k}`);
      // Its first requests on both hosts at the same moment, then ten through the balancer.
      const first = await Promise.all([a, b].map((h) => chat(h, key.token, 'acct', 'hello')));
      const rest = [];
      for (let i = 0; i < 10; i++) rest.push(await chat(lb, key.token, 'acct', `hello ${i}`));
      const all = [...first, ...rest];
      for (const r of all) assert.equal(r.status, 200, r.text);
      const accounts = new Set(all.map(accountOf));
      assert.equal(accounts.size, 1, `key ${k}: accounts ${[...accounts]} (${all.map((r) => `${r.host}:${accountOf(r)}`)})`);
      assert.deepEqual([...new Set(rest.map((r) => r.host))].sort(), ['a', 'b'], 'both hosts served');
    }
  });

  // Where an unbound key's first choice starts (providers/sticky.c): FNV-1a of its id,
  // modulo the number of accounts (alice 0, bob 1).
  const startOf = (id) => {
    let h = 2166136261;
    for (const c of Buffer.from(id)) h = Math.imul(h ^ c, 16777619) >>> 0;
    return h % 2;
  };

  it('an unbound key chosen on host a while alice was rejected keeps bob on host b after the reset', async () => {
    // Keys whose own first choice would be alice.
    const fresh = [];
    while (fresh.length < 3) {
      const k = keys(a, 'keygen', `--name=moved ${fresh.length}`);
      if (startOf(k.id) === 0) fresh.push(k);
    }
    const alice = keys(a, 'keygen', '--name=alice short', '--account=acct=alice');
    const r = await chat(a, alice.token, 'acct', 'please reject-short');
    assert.match(r.json?.choices?.[0]?.message?.content ?? '', /upstream=429/, r.text);
    const t0 = Date.now();
    // While alice is rejected, host a gives each key bob.
    for (const k of fresh) {
      const m = await chat(a, k.token, 'acct', 'first');
      assert.equal(m.status, 200, m.text);
      assert.equal(accountOf(m), 'bob', m.text);
    }
    // Alice's reset passes: a host that chose on its own would now give these keys alice.
    await sleep(Math.max(0, (SHORT_S + 1) * 1000 - (Date.now() - t0)));
    assert.equal((await chat(b, alice.token, 'acct', 'back')).status, 200, 'alice is allowed again');
    for (const k of fresh) {
      const all = [await chat(b, k.token, 'acct', 'on b')];
      for (let i = 0; i < 6; i++) all.push(await chat(lb, k.token, 'acct', `via lb ${i}`));
      for (const x of all) assert.equal(x.status, 200, x.text);
      assert.deepEqual([...new Set(all.map(accountOf))], ['bob'], all.map((x) => `${x.host}:${accountOf(x)}`).join(' '));
    }
  });

  it('an account rejected on host a: host b answers 429 with Retry-After, and runs nothing', async () => {
    const alice = keys(a, 'keygen', '--name=alice', '--account=acct=alice');
    const ok = await chat(b, alice.token, 'acct', 'hello');
    assert.equal(ok.status, 200, ok.text);
    assert.equal(accountOf(ok), 'alice');
    // Host a's run meets the upstream's rejection of alice.
    const r = await chat(a, alice.token, 'acct', 'please reject');
    assert.equal(r.status, 200, r.text);
    assert.match(r.json.choices[0].message.content, /upstream=429/);
    const before = await upstreamRequests();
    // The next request, on host b: refused before any run.
    const refused = await chat(b, alice.token, 'acct', 'hello again');
    assert.equal(refused.status, 429, refused.text);
    assert.equal(refused.json.error.code, 'subscription_limit');
    const retry = Number(refused.headers.get('retry-after'));
    assert.ok(retry > 0 && retry <= RESET_S, `Retry-After ${refused.headers.get('retry-after')}`);
    // Every worker of both hosts, and the balancer: the same.
    const req = { method: 'POST', uri: '/v1/chat/completions', token: alice.token, body: chatBody('acct', 'hi') };
    for (const { host, pid, res } of await everyWorker([a, b], req)) assert.equal(res.status, 429, `${host}/${pid}: ${res.text}`);
    for (let i = 0; i < 4; i++) assert.equal((await chat(lb, alice.token, 'acct', 'via lb')).status, 429);
    assert.equal(await upstreamRequests(), before, 'no run reached the upstream');
    // Host b's owner sees alice limited, though none of b's runs was told so.
    const h = await send(b, { method: 'GET', path: '/health', token: owner });
    assert.equal(h.json.providers.acct.accounts.alice.limited, true, JSON.stringify(h.json.providers.acct));
    assert.equal(h.json.providers.acct.accounts.alice.status, 'rejected');
    // The store holds one row per account, written by host a.
    const rows = psql("SELECT account, state->>'s' FROM olp_account_limits WHERE provider = 'acct' ORDER BY 1");
    assert.deepEqual(rows.find((x) => x[0] === 'alice'), ['alice', '3']);
  });

  it('the database stopped and started under load: nothing crashes, nothing served is lost', async () => {
    const known = keys(a, 'keygen', '--name=known');
    const quota = keys(a, 'keygen', '--name=quota', '--quota-rpd=100000');
    const unknown = keys(a, 'keygen', '--name=never used');
    // Every worker of both hosts has checked the known and the quota key.
    for (const t of [known.token, quota.token])
      for (const { host, pid, res } of await everyWorker([a, b], { method: 'GET', uri: '/v1/models', token: t }))
        assert.equal(res.status, 200, `${host}/${pid}: ${res.text}`);
    const pids = { a: a.workerPids(), b: b.workerPids() };

    // The load: the known key through the balancer, 4 at a time; /health/live of each host.
    const served = [];
    const knownFailed = [];
    const live = [];
    let running = true;
    const loop = async () => {
      while (running) {
        try {
          const r = await chat(lb, known.token, 'echo', 'under load');
          if (r.status === 200) served.push(r.headers.get('x-request-id'));
          else knownFailed.push(`${r.status} ${r.host} ${r.text}`);
        } catch (e) {
          knownFailed.push(e.message);
        }
      }
    };
    const liveLoop = async () => {
      while (running) {
        for (const h of [a, b]) {
          try {
            const r = await send(h, { method: 'GET', path: '/health/live' });
            live.push(`${h.name} ${r.status}`);
          } catch (e) {
            live.push(`${h.name} ${e.message}`);
          }
        }
        await sleep(100);
      }
    };
    const loops = [loop(), loop(), loop(), loop(), liveLoop()];
    await sleep(1000);

    const servedBefore = served.length;
    const tStop = Date.now();
    pgCtl('stop');
    // /health says so, on both hosts, and since when.
    for (const h of [a, b]) {
      let r;
      const away = await waitFor(
        async () => {
          r = await send(h, { method: 'GET', path: '/health', token: owner });
          return r.json?.store?.ok === false;
        },
        { timeoutMs: 5000, stepMs: 100 },
      );
      assert.ok(away, `${h.name}: /health ${r.status} ${r.text}`);
      const since = typeof r.json.store.failing_since === 'number' ? r.json.store.failing_since : Date.parse(r.json.store.failing_since);
      assert.ok(since >= tStop - 2000 && since <= Date.now(), `${h.name}: failing_since ${r.json.store.failing_since}`);
      assert.ok(r.json.store.last_error, `${h.name}: no last_error`);
    }
    // A quota key and a key never seen: 503 store_unavailable with Retry-After, on both.
    for (const h of [a, b]) {
      for (const t of [unknown.token, quota.token]) {
        const r = await chat(h, t);
        assert.equal(r.status, 503, `${h.name}: ${r.text}`);
        assert.equal(r.json.error.code, 'store_unavailable');
        assert.ok(Number(r.headers.get('retry-after')) >= 1, `${h.name}: Retry-After ${r.headers.get('retry-after')}`);
      }
    }
    await sleep(1500);
    const servedDuring = served.length;

    pgCtl('start');
    const tStart = performance.now();
    // Everything works again within 10 s, without a restart.
    const back = await waitFor(
      async () => {
        for (const h of [a, b]) {
          if ((await chat(h, quota.token)).status !== 200) return false;
          if ((await chat(h, unknown.token)).status !== 200) return false;
          const hr = await send(h, { method: 'GET', path: '/health', token: owner });
          if (hr.json?.store?.ok !== true) return false;
        }
        return true;
      },
      { timeoutMs: 15000, stepMs: 200 },
    );
    const backMs = performance.now() - tStart;
    process.stderr.write(
      `database back: everything works again after ${backMs.toFixed(0)} ms; the known key served ` +
        `${servedBefore} requests before the stop, ${servedDuring - servedBefore} while away, ${served.length - servedDuring} after\n`,
    );
    await sleep(1000);
    running = false;
    await Promise.all(loops);

    assert.ok(back, 'the hosts did not work again within 15 s of the database\'s start');
    assert.ok(backMs <= 10000, `everything worked again only after ${backMs.toFixed(0)} ms`);
    assert.deepEqual(knownFailed, [], 'the known key was refused while the database was away');
    assert.ok(servedDuring > 0, 'no request was served while the database was away');
    const notLive = live.filter((l) => !l.endsWith(' 200'));
    assert.deepEqual(notLive, [], '/health/live failed');
    assert.deepEqual({ a: a.workerPids(), b: b.workerPids() }, pids, 'a worker was restarted');
    // Every request of the known key that was served, before, during and after the
    // outage, is in the shared ledger (the warm-up's /v1/models are not ledger rows).
    const expect = served.length;
    let u;
    const all = await waitFor(
      async () => {
        u = await usageOf(b, owner, known.id);
        return u.key?.totals.requests === expect;
      },
      { timeoutMs: 15000, stepMs: 250 },
    );
    assert.ok(all, `ledger has ${u.key?.totals.requests} requests of the known key, ${expect} were made`);
    const dropped = await send(a, { method: 'GET', path: '/metrics', token: owner });
    // Nothing was dropped: the counter is there, at 0 (made at the store's first sync).
    assert.match(dropped.text, /^# TYPE olp_ledger_dropped_total counter$/m);
    assert.match(dropped.text, /^olp_ledger_dropped_total 0$/m);
  });
});

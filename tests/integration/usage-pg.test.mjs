// Two OLP hosts sharing only a PostgreSQL (ADR 0034): two lighttpd + olp-fcgi stacks, each
// with its own OLP_HOME, the keys (made on one, olp-keys) and the usage in one database of a throwaway cluster (tests/pg/with-pg.sh, which CTest runs this
// under; skipped without a server). A key's requests_per_day of 5 under 20 concurrent
// requests spread over both hosts gives exactly 5; its max_concurrent of 1 holds across
// them (a lease row in the store); /v1/usage on either host shows the requests of both;
// the database stopped: the quota key gets 503, a key without a quota is served, and once
// it is back the quota key is served again within 10 s and the rows served meanwhile are
// in the ledger.
//
// Keys are made with the real olp-keys (OLP_KEYS); the keys' schema by olp-keys store init,
// the usage tables' too (olp-keys store init).

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import http from 'node:http';
import { after, before, describe, it } from 'node:test';

import { chatBody, commandProvider, curl, makeHome, olpKeys, startServer, testConfig, testRegistry, waitFor } from './harness.mjs';

const bearer = (t) => `Bearer ${t}`;
const pgURL = process.env.OLP_TEST_PG_URL;
const SLOW = 'cat >/dev/null; i=0; while [ $i -lt 25 ]; do echo "tick $i"; sleep 0.2; i=$((i+1)); done';

function registry() {
  const r = testRegistry();
  // Room for every request at once: a run refused by the provider's own per-host cap
  // would give its count back (no run, no quota used), and fewer than 5 would be served.
  r.providers.echo.max_concurrent = 64;
  r.providers.slow = commandProvider('slow', ['/bin/sh', '-c', SLOW], { timeout_s: 60 });
  return r;
}

function pgCtl(what) {
  const r = spawnSync(process.env.OLP_TEST_PG_CTL, [what], { encoding: 'utf8', timeout: 60000 });
  assert.equal(r.status, 0, `pg-ctl.sh ${what}: ${r.stderr}`);
}

// A streaming request: { started } once its first tick came, { done } at its end.
function stream(server, token) {
  const payload = JSON.stringify(chatBody('slow', 'slowly', { stream: true }));
  let onStart;
  const started = new Promise((r) => { onStart = r; });
  const done = new Promise((resolve, reject) => {
    const req = http.request(server.url('/v1/chat/completions'), {
      method: 'POST',
      agent: false,
      headers: { Authorization: bearer(token), 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(payload) },
    }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d) => {
        body += d;
        if (body.includes('tick')) onStart(res);
      });
      res.on('end', () => resolve({ status: res.statusCode, body }));
    });
    req.on('error', reject);
    req.end(payload);
  });
  return { started, done };
}

const chat = (server, token, text) =>
  curl(server, { method: 'POST', path: '/v1/chat/completions', auth: bearer(token), body: chatBody('echo', text) });

describe('two hosts, one PostgreSQL: quotas, max_concurrent and the ledger shared', { skip: !pgURL && 'no PostgreSQL: run under tests/pg/with-pg.sh' }, () => {
  let a, b, daily, conc, free;

  before(async () => {
    // The schemas, as the operator makes them (olp-keys store init: keys and usage).
    const keysInit = spawnSync(process.env.OLP_KEYS, ['store', 'init', '--worker-role=olp_worker'], {
      encoding: 'utf8', timeout: 60000, env: { ...process.env, OLP_STORE: process.env.OLP_TEST_PG_ADMIN_URL },
    });
    assert.equal(keysInit.status, 0, `olp-keys store init: ${keysInit.stderr}`);
    // config.json names the store (lighttpd passes workers no OLP_STORE); the password
    // from with-pg.sh's 0600 passfile.
    const config = { ...testConfig(), store: pgURL, store_passfile: process.env.PGPASSFILE };
    const dirsA = makeHome({ registry: registry(), config });
    const dirsB = makeHome({ registry: registry(), config });
    daily = olpKeys(dirsA.home, 'keygen', '--name=daily', '--quota-rpd=5');
    conc = olpKeys(dirsA.home, 'keygen', '--name=conc', '--quota-concurrent=1');
    free = olpKeys(dirsA.home, 'keygen', '--name=free');
    // The keys are in the store (config.json names it): host B knows them too.
    a = await startServer({ dirs: dirsA, maxProcs: 1, threads: 8 });
    b = await startServer({ dirs: dirsB, maxProcs: 1, threads: 8 });
  });
  after(async () => {
    await a?.stop();
    await b?.stop();
  });

  it('requests_per_day 5: 20 concurrent requests over both hosts give exactly 5', async () => {
    const all = await Promise.all(Array.from({ length: 20 }, (_, i) => chat(i % 2 ? a : b, daily.token, `r${i}`)));
    const ok = all.filter((r) => r.status === 200);
    const refused = all.filter((r) => r.status === 429);
    assert.equal(ok.length, 5, all.map((r) => r.status).join(' '));
    assert.equal(refused.length, 15);
    for (const r of refused) assert.equal(r.json.error.code, 'quota_exceeded');
  });

  it('max_concurrent 1 holds across hosts, and the slot comes back at the answer\'s end', async () => {
    const first = stream(a, conc.token);
    await first.started;
    const second = await chat(b, conc.token, 'again');
    assert.equal(second.status, 429, second.text);
    assert.equal(second.json.error.code, 'concurrency_limit_exceeded');
    const end = await first.done;
    assert.equal(end.status, 200);
    const again = await chat(b, conc.token, 'now');
    assert.equal(again.status, 200, again.text);
  });

  it('/v1/usage on either host shows both hosts\' requests', async () => {
    for (const server of [a, b]) {
      let u;
      await waitFor(async () => {
        u = await curl(server, { path: '/v1/usage', auth: bearer(daily.token) });
        return u.status === 200 && u.json.keys[0]?.totals.requests === 20;
      }, { timeoutMs: 10000 });
      assert.equal(u.json.keys[0]?.totals.requests, 20, u.text);
      assert.equal(u.json.keys[0].quota_state.requests_today, 5);
    }
  });

  it('the database away: 503 for the quota key, a key without one served; back within 10 s, nothing lost', async () => {
    // Keys checked lately keep working while the store is away (ADR 0034): check them
    // on both hosts first.
    for (const server of [a, b]) {
      const f = await chat(server, free.token, 'before');
      assert.equal(f.status, 200, f.text);
    }
    pgCtl('stop');
    let restarted = false;
    try {
      const q = await chat(a, daily.token, 'away');
      assert.equal(q.status, 503, q.text);
      assert.equal(JSON.parse(q.text).error.code, 'store_unavailable', q.text);
      assert.ok(Number(q.headers['retry-after']) > 0, 'a Retry-After');
      const c = await chat(b, conc.token, 'away');
      assert.equal(c.status, 503, c.text);
      assert.equal(JSON.parse(c.text).error.code, 'store_unavailable', c.text);
      for (let i = 0; i < 3; i++) {
        const f = await chat(i % 2 ? a : b, free.token, `away${i}`);
        assert.equal(f.status, 200, f.text);
      }
      pgCtl('start');
      restarted = true;
      const t0 = Date.now();
      let c2;
      await waitFor(async () => {
        c2 = await chat(a, conc.token, 'back');
        return c2.status === 200;
      }, { timeoutMs: 10000, stepMs: 200 });
      assert.equal(c2.status, 200, c2.text);
      assert.ok(Date.now() - t0 < 10000);
      // The free key's rows served while the database was away are written: the two
      // before it went and the three meanwhile.
      let u;
      await waitFor(async () => {
        u = await curl(b, { path: '/v1/usage', auth: bearer(free.token) });
        return u.status === 200 && u.json.keys[0]?.totals.requests === 5;
      }, { timeoutMs: 10000 });
      assert.equal(u.json.keys[0]?.totals.requests, 5, u.text);
    } finally {
      if (!restarted) pgCtl('start');
    }
  });

  it('/health says whether the accounts\' limits and choices are shared, and why not', async () => {
    const h = await curl(a, { path: '/health', auth: true });
    assert.equal(h.json.store.accounts_shared, true, h.text);
    assert.equal(h.json.store.accounts_shared_why, undefined, h.text);
    // A store whose providers schema is missing (made by an older olp-keys store init):
    // a worker started on it keeps them per host, and its owner is told how to fix it.
    const admin = (sql) => {
      const r = spawnSync(process.env.OLP_TEST_PG_CTL, ['psql', '-v', 'ON_ERROR_STOP=1', '-c', sql], { encoding: 'utf8', timeout: 30000 });
      assert.equal(r.status, 0, `psql ${sql}: ${r.stderr}`);
    };
    // Its row only: the tables stay, and the row goes back at the end.
    admin("CREATE TABLE olp_schema_saved AS SELECT * FROM olp_schema WHERE module = 'providers'");
    admin("DELETE FROM olp_schema WHERE module = 'providers'");
    let c;
    try {
      const config = { ...testConfig(), store: pgURL, store_passfile: process.env.PGPASSFILE };
      c = await startServer({ dirs: makeHome({ registry: registry(), config }), maxProcs: 1, threads: 2 });
      const hc = await curl(c, { path: '/health', auth: true });
      assert.equal(hc.json.store.accounts_shared, false, hc.text);
      assert.match(hc.json.store.accounts_shared_why, /no providers schema: run olp-keys store init/, hc.text);
      // A guest sees no store object at all.
      const g = await curl(c, { path: '/health', auth: bearer(free.token) });
      assert.equal(g.json.store, undefined, g.text);
    } finally {
      await c?.stop();
      admin('INSERT INTO olp_schema SELECT * FROM olp_schema_saved; DROP TABLE olp_schema_saved');
    }
  });
});

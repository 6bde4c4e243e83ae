// The usage ledger and quotas over HTTP (issue 14), behind a real lighttpd with three
// olp-fcgi worker processes sharing one $OLP_HOME/usage.db: a guest key's
// requests_per_day holds across the pool (requests sent at once land on different
// workers), a refusal is a 429 quota_exceeded with Retry-After, a malformed request is
// refused before the quota and costs nothing, every chat request that passed auth is in
// the ledger with the provider's tokens (refusals counted in a row a minute), GET
// /v1/usage shows a key its own usage and the owner everyone's, and a database that
// cannot be opened refuses keys with a quota (503), serves the others, and counts
// failures in /health.
//
// Keys are made with the real olp-keys (OLP_KEYS, set by CTest), as an operator would.

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';

import { fcgiRequest } from './fcgi-client.mjs';
import { cfg, chatBody, curl, makeHome, olpKeys, startServer, testConfig, waitFor } from './harness.mjs';
import { COMPLETION_TOKENS, PROMPT_TOKENS, meteredRegistry } from './metered.mjs';

const bearer = (t) => `Bearer ${t}`;

// Which worker process answered each request id: from the workers' own log lines.
function pidsOf(server, rids) {
  const pids = new Set();
  for (const line of server.errorLog().split('\n')) {
    if (!line.startsWith('{')) continue;
    try {
      const j = JSON.parse(line);
      if (j.event === 'request' && rids.includes(j.request_id)) pids.add(j.pid);
    } catch {
      /* not ours */
    }
  }
  return pids;
}

// A guest key with requests_per_day 3.
function makeQuotaGuest(home) {
  return olpKeys(home, 'keygen', '--name=quota guest <b>&', '--quota-rpd=3');
}

describe('usage ledger and quotas, 3 workers', () => {
  let server;
  let guest;
  let other;
  const rids = [];

  before(async () => {
    const dirs = makeHome({ registry: meteredRegistry(), config: testConfig() });
    guest = makeQuotaGuest(dirs.home);
    other = olpKeys(dirs.home, 'keygen', '--name=other guest');
    server = await startServer({ dirs, maxProcs: 3, threads: 2 });
    await waitFor(() => server.workerPids().length === 3, { timeoutMs: 15000 });
  });
  after(async () => {
    await server?.stop();
  });

  it('a malformed request is refused before the quota and costs nothing of it', async () => {
    const r = await curl(server, {
      method: 'POST',
      path: '/v1/chat/completions',
      auth: bearer(guest.token),
      body: { model: 'metered', messages: 'not an array' },
    });
    assert.equal(r.status, 400, r.text);
    const m = await curl(server, {
      method: 'POST',
      path: '/v1/chat/completions',
      auth: bearer(guest.token),
      body: chatBody('no-such-model'),
    });
    assert.equal(m.status, 404, m.text);
  });

  it('requests_per_day 3 holds across the workers: 3 served, then 429 quota_exceeded with Retry-After', async () => {
    assert.equal(server.workerPids().length, 3, 'three workers');
    const send = () =>
      curl(server, { method: 'POST', path: '/v1/chat/completions', auth: bearer(guest.token), body: chatBody('metered', 'count me') });
    // Each of the five goes to a worker's own FastCGI socket in turn (fcgi-client.mjs), so
    // that at least two processes count against the one quota, whatever lighttpd's
    // balancing would have picked.
    const socks = server.workerSockets();
    assert.ok(socks.length >= 2, `worker sockets: ${JSON.stringify(socks)}`);
    const direct = async (sock) => {
      const r = await fcgiRequest(sock, {
        method: 'POST',
        uri: '/v1/chat/completions',
        headers: { authorization: bearer(guest.token), 'content-type': 'application/json' },
        body: JSON.stringify(chatBody('metered', 'count me')),
      });
      return { status: r.status, headers: Object.fromEntries(r.headers), text: r.text, json: r.json };
    };
    const all = await Promise.all([0, 1, 2, 3, 4].map((i) => direct(socks[i % socks.length].sock)));
    for (const r of all) rids.push(r.headers['x-request-id']);
    const statuses = all.map((r) => r.status).sort();
    assert.deepEqual(statuses, [200, 200, 200, 429, 429], all.map((r) => `${r.status} ${r.text}`).join('\n'));
    for (const r of all.filter((x) => x.status === 200)) {
      assert.equal(r.json.choices[0].message.content, 'metered answer');
      assert.equal(r.json.usage.prompt_tokens, PROMPT_TOKENS);
      assert.equal(r.json.usage.completion_tokens, COMPLETION_TOKENS);
    }
    for (const r of all.filter((x) => x.status === 429)) {
      assert.equal(r.json.error.type, 'rate_limit_error');
      assert.equal(r.json.error.code, 'quota_exceeded');
      assert.equal(r.json.error.param, null);
      assert.match(r.json.error.message, /requests_per_day is 3 and it has used 3/);
      const ra = Number(r.headers['retry-after']);
      assert.ok(Number.isInteger(ra) && ra >= 1 && ra <= 86400, `Retry-After ${r.headers['retry-after']}`);
      assert.match(r.json.error.message, new RegExp(`try again in ${ra} s`));
    }
    // Sent at once, they were served by more than one process: the limit is the pool's.
    const pids = pidsOf(server, rids);
    assert.ok(pids.size >= 2, `answered by worker pids ${[...pids].join(', ')}`);
    // Still refused afterwards, by whichever worker.
    const again = await send();
    assert.equal(again.status, 429);
    rids.push(again.headers['x-request-id']);
    // The pool's metrics count every refusal, whichever worker made it.
    const m = await curl(server, { path: '/metrics', auth: true });
    assert.equal(m.status, 200);
    assert.match(m.text, /^olp_quota_rejections_total\{limit="requests_per_day"\} 3$/m);
  });

  it('GET /v1/usage: a guest sees its own key, with the ledger rows of every request that passed auth', async () => {
    // Rows are written after each answer is finished: wait for the last ones.
    // 2 refused before the quota (400, 404) + 3 served + 3 refused by it.
    let u;
    const ok = await waitFor(
      async () => {
        u = await curl(server, { path: '/v1/usage', auth: bearer(guest.token) });
        return u.status === 200 && u.json.keys[0]?.totals.requests === 8;
      },
      { timeoutMs: 10000, stepMs: 200 },
    );
    assert.ok(ok, u.text);
    assert.equal(u.headers['cache-control'], 'no-store');
    assert.equal(u.json.keys.length, 1);
    const k = u.json.keys[0];
    assert.equal(k.key_id, guest.id);
    assert.equal(k.name, 'quota guest <b>&');
    assert.equal(k.tier, 'guest');
    assert.deepEqual(k.quota, { requests_per_minute: 0, requests_per_day: 3, tokens_per_day: 0, max_concurrent: 0 });
    assert.equal(k.quota_state.requests_today, 3);
    assert.equal(k.quota_state.tokens_today, 3 * (PROMPT_TOKENS + COMPLETION_TOKENS));
    assert.equal(k.totals.errors, 5);
    assert.equal(k.totals.prompt_tokens, 3 * PROMPT_TOKENS);
    assert.equal(k.totals.completion_tokens, 3 * COMPLETION_TOKENS);
    // No provider ran for those refused (400, 404 and the quota's 429s): no provider.
    const metered = k.days.find((d) => d.provider === 'metered');
    assert.equal(metered.requests, 3);
    assert.equal(metered.errors, 0);
    assert.match(metered.date, /^\d{4}-\d{2}-\d{2}$/);
    const none = k.days.find((d) => d.provider === null);
    assert.equal(none.requests, 5);
    assert.equal(none.errors, 5);
    // Recent requests: what they cost and how they went, no content. Refusals (no run, no
    // token) are counted in a row per status and minute (ADR 0026).
    assert.equal(u.json.recent.reduce((n, r) => n + r.count, 0), 8);
    const served = u.json.recent.filter((r) => r.status === 200);
    assert.equal(served.length, 3);
    for (const r of served) {
      assert.equal(r.key_id, guest.id);
      assert.equal(r.provider, 'metered');
      assert.equal(r.model, 'metered');
      assert.equal(r.prompt_tokens, PROMPT_TOKENS);
      assert.ok(r.duration_ms >= r.ttfb_ms && r.ttfb_ms > 0, JSON.stringify(r));
      assert.ok(['cold', 'warm', 'prestart'].includes(r.start), r.start);
    }
    const refused = u.json.recent.filter((r) => r.status === 429);
    assert.equal(refused.reduce((n, r) => n + r.count, 0), 3);
    for (const r of refused) {
      assert.equal(r.start, 'none');
      assert.equal(r.provider, null);
    }
    assert.ok(!u.text.includes('count me') && !u.text.includes('metered answer'), 'no content in the ledger');
  });

  it('a guest may not read another key (403), may name its own, and bad parameters are 400 naming them', async () => {
    const forbidden = await curl(server, { path: `/v1/usage?key=${other.id}`, auth: bearer(guest.token) });
    assert.equal(forbidden.status, 403, forbidden.text);
    assert.equal(forbidden.json.error.code, 'usage_forbidden');
    const own = await curl(server, { path: `/v1/usage?key=${guest.id}`, auth: bearer(guest.token) });
    assert.equal(own.status, 200);
    assert.equal(own.json.keys[0].key_id, guest.id);
    for (const [q, param] of [
      ['since=yesterday', 'since'],
      ['since=2026-02-30', 'since'],
      ['since=2026-1-01', 'since'],
      ['recent=201', 'recent'],
      ['recent=-1', 'recent'],
      ['key=', 'key'],
      [`key=${'x'.repeat(80)}`, 'key'],
    ]) {
      const r = await curl(server, { path: `/v1/usage?${q}`, auth: bearer(guest.token) });
      assert.equal(r.status, 400, `${q}: ${r.text}`);
      assert.equal(r.json.error.param, param, q);
      assert.match(r.json.error.message, new RegExp(`^${param}:`));
    }
    const since = await curl(server, { path: '/v1/usage?since=2000-01-01&recent=0', auth: bearer(guest.token) });
    assert.equal(since.status, 200);
    assert.equal(since.json.since, '2000-01-01');
    assert.deepEqual(since.json.recent, []);
    const anon = await curl(server, { path: '/v1/usage', auth: false });
    assert.equal(anon.status, 401);
  });

  it('the owner sees every key, and one with ?key=', async () => {
    const u = await curl(server, { path: '/v1/usage?recent=200', auth: true });
    assert.equal(u.status, 200, u.text);
    assert.equal(u.json.all_keys, true);
    const ids = u.json.keys.map((k) => k.key_id);
    assert.ok(ids.includes(guest.id) && ids.includes(other.id), ids.join(', '));
    const g = u.json.keys.find((k) => k.key_id === guest.id);
    assert.equal(g.totals.requests, 8);
    assert.equal(g.name, 'quota guest <b>&');
    assert.deepEqual(g.quota, { requests_per_minute: 0, requests_per_day: 3, tokens_per_day: 0, max_concurrent: 0 });
    const o = u.json.keys.find((k) => k.key_id === other.id);
    assert.equal(o.totals.requests, 0);
    assert.equal(o.quota, null);
    const one = await curl(server, { path: `/v1/usage?key=${other.id}`, auth: true });
    assert.equal(one.status, 200);
    assert.deepEqual(
      one.json.keys.map((k) => k.key_id),
      [other.id],
    );
  });

  it('tokens_per_day: a request that starts below the limit is served, the next one refused', async () => {
    const k = olpKeys(server.home, 'keygen', '--name=token guest', `--quota-tpd=${PROMPT_TOKENS + COMPLETION_TOKENS - 2}`);
    const send = () =>
      curl(server, { method: 'POST', path: '/v1/chat/completions', auth: bearer(k.token), body: chatBody('metered') });
    const first = await send();
    assert.equal(first.status, 200, first.text);
    // Its tokens count once its row is in (written after the answer).
    const seen = await waitFor(
      async () => (await curl(server, { path: '/v1/usage', auth: bearer(k.token) })).json?.keys[0]?.quota_state.tokens_today > 0,
      { timeoutMs: 10000, stepMs: 100 },
    );
    assert.ok(seen, 'the first request\'s tokens reached the ledger');
    const second = await send();
    assert.equal(second.status, 429, second.text);
    assert.equal(second.json.error.code, 'quota_exceeded');
    assert.match(
      second.json.error.message,
      new RegExp(`tokens_per_day is ${PROMPT_TOKENS + COMPLETION_TOKENS - 2} and it has used ${PROMPT_TOKENS + COMPLETION_TOKENS}`),
    );
    assert.ok(Number(second.headers['retry-after']) >= 1);
  });

  it('olp-keys usage reads the same ledger', () => {
    const j = olpKeys(server.home, 'usage', `--id=${guest.id}`);
    // Whatever its layout, the key's tokens are in it.
    const flat = JSON.stringify(j);
    assert.ok(flat.includes(guest.id), flat);
    assert.match(flat, new RegExp(`"prompt_tokens":${3 * PROMPT_TOKENS}\\b`));
  });

  it('a key made, given a quota and revoked while the workers run shows in the very next /v1/usage of every worker', async () => {
    // Asked at once, several times over, of whichever workers answer: each indexed the key
    // store when it started (and answered /v1/usage from that index before), so an answer
    // that shows a change came through the index being brought in step, not a first read.
    const ask = async () => {
      const rs = await Promise.all(Array.from({ length: 6 }, () => curl(server, { path: '/v1/usage?recent=0', auth: true })));
      for (const r of rs) assert.equal(r.status, 200, r.text);
      return rs.map((r) => r.json.keys);
    };
    const before = await ask();
    const late = olpKeys(server.home, 'keygen', '--name=late guest');
    for (const keys of before) assert.ok(!keys.some((k) => k.key_id === late.id));
    for (const keys of await ask()) {
      const k = keys.find((x) => x.key_id === late.id);
      assert.ok(k, `the new key is listed: ${keys.map((x) => x.key_id).join(', ')}`);
      assert.equal(k.name, 'late guest');
      assert.equal(k.tier, 'guest');
      assert.equal(k.revoked, false);
      assert.equal(k.quota, null);
    }
    olpKeys(server.home, 'set-quota', `--id=${late.id}`, '--quota-rpm=7');
    for (const keys of await ask()) {
      assert.deepEqual(keys.find((x) => x.key_id === late.id).quota, {
        requests_per_minute: 7,
        requests_per_day: 0,
        tokens_per_day: 0,
        max_concurrent: 0,
      });
    }
    olpKeys(server.home, 'revoke', `--id=${late.id}`);
    for (const keys of await ask()) assert.equal(keys.find((x) => x.key_id === late.id).revoked, true);
  });

  it('a client that goes away is in the ledger with status 499', async () => {
    const k = olpKeys(server.home, 'keygen', '--name=impatient guest');
    await assert.rejects(
      fetch(server.url('/v1/chat/completions'), {
        method: 'POST',
        headers: { Authorization: bearer(k.token), 'Content-Type': 'application/json' },
        body: JSON.stringify(chatBody('forever', 'hello', { stream: true })),
        signal: AbortSignal.timeout(1500),
      }).then((r) => r.text()),
    );
    let row;
    const ok = await waitFor(
      async () => {
        row = (await curl(server, { path: '/v1/usage', auth: bearer(k.token) })).json?.recent?.[0];
        return row !== undefined;
      },
      { timeoutMs: 20000, stepMs: 200 },
    );
    assert.ok(ok, 'no ledger row');
    assert.equal(row.status, 499, JSON.stringify(row));
    assert.equal(row.provider, 'forever');
    assert.ok(row.duration_ms >= 1000, JSON.stringify(row));
    // A local command spends no upstream tokens: a cut run of one is not estimated.
    assert.equal(row.prompt_tokens, 0, JSON.stringify(row));
    assert.equal(row.completion_tokens, 0, JSON.stringify(row));
  });

  it('usage.db is the owner\'s alone (0600) and the owner\'s /health reports the ledger and the providers', async () => {
    const st = fs.statSync(path.join(server.home, 'usage.db'));
    assert.equal(st.mode & 0o777, 0o600);
    const h = await curl(server, { path: '/health', auth: true });
    assert.deepEqual(h.json.usage, { enabled: true, available: true, ok: true, failing_since: null, last_error: null, failures: 0 });
    assert.equal(h.json.providers.metered.cli_found, true);
    assert.equal(h.json.providers.metered.credentials, 'not_needed');
    const g = await curl(server, { path: '/health', auth: bearer(guest.token) });
    assert.equal(g.json.usage, undefined, 'not for a guest');
  });
});

describe('usage ledger unavailable', () => {
  let server;
  let guest;
  let free;

  before(async () => {
    const dirs = makeHome({ registry: meteredRegistry(), config: testConfig() });
    guest = makeQuotaGuest(dirs.home);
    free = olpKeys(dirs.home, 'keygen', '--name=no quota');
    // A directory where the database should be: it cannot be opened, ever.
    fs.mkdirSync(path.join(dirs.home, 'usage.db'), { mode: 0o700 });
    server = await startServer({ dirs, maxProcs: 1, threads: 2 });
  });
  after(async () => {
    await server?.stop();
  });

  it('a key with a quota is refused (503: the quota fails closed), one without is served, and /health counts the failures', async () => {
    const h0 = (await curl(server, { path: '/health', auth: true })).json.usage;
    assert.equal(h0.enabled, true);
    assert.equal(h0.available, false);
    assert.equal(h0.ok, false);
    assert.match(h0.failing_since, /^\d{4}-\d\d-\d\dT/);
    for (let i = 0; i < 4; i++) {
      const r = await curl(server, { method: 'POST', path: '/v1/chat/completions', auth: bearer(guest.token), body: chatBody('metered') });
      assert.equal(r.status, 503, r.text);
      assert.equal(r.json.error.code, 'usage_unavailable');
      assert.ok(Number(r.headers['retry-after']) >= 1);
      const f = await curl(server, { method: 'POST', path: '/v1/chat/completions', auth: bearer(free.token), body: chatBody('metered') });
      assert.equal(f.status, 200, f.text);
    }
    const h1 = (await curl(server, { path: '/health', auth: true })).json.usage;
    assert.equal(h1.available, false);
    assert.equal(h1.ok, false);
    assert.ok(h1.failures > h0.failures, `failures ${h0.failures} → ${h1.failures}`);
    const m = await curl(server, { path: '/metrics', auth: true });
    const fails = /^olp_ledger_write_failures_total (\d+)$/m.exec(m.text);
    assert.ok(fails && Number(fails[1]) >= 4, m.text);
    assert.match(m.text, /^olp_ledger_available 0$/m);
    const u = await curl(server, { path: '/v1/usage', auth: true });
    assert.equal(u.status, 503);
    assert.equal(u.json.error.code, 'usage_unavailable');
    assert.ok(server.errorLog().split('\n').some((l) => /usage/.test(l) && /"level":"(warn|error)"/.test(l)), 'the failure is logged');
  });
});

describe('usage ledger off', () => {
  let server;

  before(async () => {
    server = await startServer({ registry: meteredRegistry(), config: { ...testConfig(), usage: { enabled: false } }, maxProcs: 1 });
  });
  after(async () => {
    await server?.stop();
  });

  it('no database, chat still served, /v1/usage 404 usage_disabled', async () => {
    const r = await curl(server, { method: 'POST', path: '/v1/chat/completions', body: chatBody('metered') });
    assert.equal(r.status, 200, r.text);
    const u = await curl(server, { path: '/v1/usage' });
    assert.equal(u.status, 404);
    assert.equal(u.json.error.code, 'usage_disabled');
    const h = await curl(server, { path: '/health' });
    assert.deepEqual(h.json.usage, { enabled: false, available: false, failures: 0 });
    assert.ok(!fs.existsSync(path.join(server.home, 'usage.db')));
  });
});

describe('usage settings are checked at start', () => {
  for (const [usage, field] of [
    [{ retention_days: 0 }, 'usage.retention_days'],
    [{ retention_days: 'long' }, 'usage.retention_days'],
    [{ enabled: 'yes' }, 'usage.enabled'],
    [[], 'usage'],
  ]) {
    it(`${JSON.stringify(usage)}: the worker refuses to start, naming ${field}`, () => {
      const dirs = makeHome({ config: { ...testConfig(), usage } });
      try {
        // fd 0 no socket: olp-fcgi starts as CGI, reading its configuration first.
        const r = spawnSync(cfg.bin, [], {
          env: { PATH: process.env.PATH, OLP_HOME: dirs.home, REQUEST_METHOD: 'GET', REQUEST_URI: '/health' },
          encoding: 'utf8',
          timeout: 30000,
        });
        assert.notEqual(r.status, 0, r.stdout);
        assert.ok(r.stderr.includes(path.join(dirs.home, 'config.json')), r.stderr);
        assert.ok(r.stderr.includes(`${field}:`), r.stderr);
      } finally {
        fs.rmSync(dirs.root, { recursive: true, force: true });
      }
    });
  }
});

describe('audit settings are checked at start', () => {
  for (const [audit, field] of [
    [{ max_bytes: 1000 }, 'audit.max_bytes'],
    [{ max_bytes: '64M' }, 'audit.max_bytes'],
    [{ keep: 0 }, 'audit.keep'],
    [{ keep: 1.5 }, 'audit.keep'],
    [{ max_byte: 65536 }, 'audit.max_byte'],
    [[], 'audit'],
  ]) {
    it(`${JSON.stringify(audit)}: the worker refuses to start, naming ${field}`, () => {
      const dirs = makeHome({ config: { ...testConfig(), audit } });
      try {
        const r = spawnSync(cfg.bin, [], {
          env: { PATH: process.env.PATH, OLP_HOME: dirs.home, REQUEST_METHOD: 'GET', REQUEST_URI: '/health' },
          encoding: 'utf8',
          timeout: 30000,
        });
        assert.notEqual(r.status, 0, r.stdout);
        assert.ok(r.stderr.includes(`${field}:`), r.stderr);
      } finally {
        fs.rmSync(dirs.root, { recursive: true, force: true });
      }
    });
  }
});

describe('auth.owner_only_endpoints covers /v1/usage', () => {
  let server;
  let guest;

  before(async () => {
    const dirs = makeHome({
      registry: meteredRegistry(),
      config: { ...testConfig(), auth: { allow_anonymous: false, owner_only_endpoints: ['/v1/usage'] } },
    });
    guest = olpKeys(dirs.home, 'keygen', '--name=plain guest');
    server = await startServer({ dirs, maxProcs: 1 });
  });
  after(async () => {
    await server?.stop();
  });

  it('a guest gets 403 owner_only, the owner its usage', async () => {
    const g = await curl(server, { path: '/v1/usage', auth: bearer(guest.token) });
    assert.equal(g.status, 403, g.text);
    assert.equal(g.json.error.code, 'owner_only');
    const o = await curl(server, { path: '/v1/usage', auth: true });
    assert.equal(o.status, 200, o.text);
  });
});

// A hop of a routing chain that spent tokens and then failed before any output is passed
// over (the next hop answers), but what it spent is the key's all the same: the ledger row
// (and so tokens_per_day) counts both hops; the answer's usage is the answering hop's.
describe('a chain hop passed over still counts its tokens', () => {
  let server;
  const SPENT = 11;

  before(async () => {
    const registry = meteredRegistry();
    registry.providers.spentfail = {
      type: 'command',
      displayName: 'Spends, then fails',
      argv: ['/bin/sh', '-c', 'cat >/dev/null; ' +
        `printf '%s\\n' '{"usage":{"prompt_tokens":${SPENT},"completion_tokens":0,"total_tokens":${SPENT}}}'; exit 3`],
      output: 'ndjson',
      timeout_s: 20,
      network: false,
      models: [{ id: 'spentfail', created: 1700000000 }],
    };
    const config = testConfig();
    config.routing = { chains: { 'spent-then-metered': [{ provider: 'spentfail', model: 'spentfail' },
      { provider: 'metered', model: 'metered' }] } };
    const dirs = makeHome({ registry, config });
    server = await startServer({ dirs, maxProcs: 1, threads: 2 });
  });
  after(async () => {
    await server?.stop();
  });

  it('the ledger row has both hops\' tokens, the answer the answering hop\'s', async () => {
    const k = olpKeys(server.home, 'keygen', '--name=chain guest');
    const r = await curl(server, { method: 'POST', path: '/v1/chat/completions', auth: bearer(k.token),
      body: chatBody('spent-then-metered') });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.headers['x-olp-fallback-hops'], '1');
    assert.equal(r.json.usage.prompt_tokens, PROMPT_TOKENS);
    let row;
    const ok = await waitFor(async () => {
      row = (await curl(server, { path: '/v1/usage', auth: bearer(k.token) })).json?.recent?.[0];
      return row !== undefined;
    }, { timeoutMs: 10000, stepMs: 100 });
    assert.ok(ok, 'no ledger row');
    assert.equal(row.provider, 'metered', JSON.stringify(row));
    assert.equal(row.prompt_tokens, PROMPT_TOKENS + SPENT, JSON.stringify(row));
    assert.equal(row.completion_tokens, COMPLETION_TOKENS, JSON.stringify(row));
  });
});

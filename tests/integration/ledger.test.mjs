// Issue 22 items 4 and 7 behind a real lighttpd (ADR 0026): what keeps the disk and a key's
// quota bounded when clients misbehave.
//  - tokens_per_day is reserved when a request starts: 10 requests sent at once against a
//    small limit stay within one request's reservation of it (they took a 1,000-token key
//    to 3,600 before).
//  - A request refused by a provider's own max_concurrent (no run) does not use up one of
//    the key's requests of the day.
//  - A client looping on a 429 adds a ledger row a minute, not a row a request, and
//    /v1/usage still counts every refusal.
//  - A flood of requests without a key does not grow the audit log (a summary line, a
//    counter); authenticated lines rotate past audit.max_bytes and only audit.keep rotated
//    files stay.
// ledger-full.test.mjs covers the ledger failing closed on a full disk.
//
// Keys are made with the real olp-keys (OLP_KEYS, set by CTest).

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';

import { chatBody, curl, jsonOrUndefined, makeHome, olpKeys, startServer, testConfig, waitFor } from './harness.mjs';
import { meteredRegistry } from './metered.mjs';

const bearer = (t) => `Bearer ${t}`;

// "big": spends BIG_PROMPT + BIG_COMPLETION tokens a run, after a second (so that requests
// sent at once overlap). "narrow": one run at a time (max_concurrent 1), each 2 s.
const BIG_PROMPT = 10; // at most what the worker estimates for the prompt (body bytes / 4)
const BIG_COMPLETION = 50;
function ledgerRegistry() {
  const reg = meteredRegistry();
  const answer = (p, c) =>
    `printf '%s\\n' '{"choices":[{"delta":{"content":"ok"}}]}' ` +
    `'{"choices":[{"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":${p},"completion_tokens":${c},"total_tokens":${p + c}}}'`;
  reg.providers.big = {
    type: 'command',
    displayName: 'Big',
    argv: ['/bin/sh', '-c', `cat >/dev/null; sleep 1; ${answer(BIG_PROMPT, BIG_COMPLETION)}`],
    output: 'ndjson',
    timeout_s: 20,
    network: false,
    max_concurrent: 16,
    models: [{ id: 'big', created: 1700000000 }],
  };
  reg.providers.narrow = {
    type: 'command',
    displayName: 'Narrow',
    argv: ['/bin/sh', '-c', `cat >/dev/null; sleep 2; ${answer(1, 1)}`],
    output: 'ndjson',
    timeout_s: 20,
    network: false,
    max_concurrent: 1,
    models: [{ id: 'narrow', created: 1700000000 }],
  };
  return reg;
}

// One request with fetch (faster than curl for floods): {status, json, headers}.
async function req(server, p, { token, method = 'GET', body } = {}) {
  const headers = {};
  if (token) headers.authorization = bearer(token);
  if (body !== undefined) headers['content-type'] = 'application/json';
  const r = await fetch(server.url(p), {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    signal: AbortSignal.timeout(60000),
  });
  const text = await r.text();
  const json = jsonOrUndefined(text);
  return { status: r.status, headers: r.headers, text, json };
}

// n requests made by make(i), width at a time.
async function flood(n, width, make) {
  const out = [];
  for (let i = 0; i < n; i += width) {
    const batch = [];
    for (let j = i; j < Math.min(n, i + width); j++) batch.push(make(j));
    out.push(...(await Promise.all(batch)));
  }
  return out;
}

function metric(text, series) {
  const esc = series.replace(/[{}()[\]\\.*+?^$|]/g, '\\$&');
  const m = new RegExp(`^${esc} (\\S+)$`, 'm').exec(text);
  return m ? Number(m[1]) : undefined;
}

describe('tokens_per_day reserved, provider caps refunded, refusals counted', () => {
  let server;

  before(async () => {
    const dirs = makeHome({ registry: ledgerRegistry(), config: testConfig() });
    server = await startServer({ dirs, maxProcs: 2, threads: 6 });
  });
  after(async () => {
    await server?.stop();
  });

  it('10 requests at once against tokens_per_day stay within one reservation of the limit', async () => {
    const LIMIT = 300;
    const k = olpKeys(server.home, 'keygen', '--name=token guest', `--quota-tpd=${LIMIT}`);
    const body = chatBody('big', 'hello', { max_tokens: BIG_COMPLETION });
    // What the worker reserves for each (fcgi/quota.c): body bytes / 4 + max_tokens. Each
    // run spends less (as a real one does: its completion is at most max_tokens).
    const reservation = Math.floor(JSON.stringify(body).length / 4) + BIG_COMPLETION;
    assert.ok(BIG_PROMPT + BIG_COMPLETION <= reservation);
    const all = await Promise.all(
      Array.from({ length: 10 }, () => curl(server, { method: 'POST', path: '/v1/chat/completions', auth: bearer(k.token), body })),
    );
    const served = all.filter((r) => r.status === 200).length;
    const refused = all.filter((r) => r.status === 429);
    assert.equal(served + refused.length, 10, all.map((r) => `${r.status} ${r.text}`).join('\n'));
    for (const r of refused) {
      assert.equal(r.json.error.code, 'quota_exceeded');
      assert.match(r.json.error.message, /tokens_per_day is 300/);
    }
    let u;
    const settled = await waitFor(
      async () => {
        u = await req(server, '/v1/usage', { token: k.token });
        const qs = u.json?.keys?.[0]?.quota_state;
        return qs && qs.tokens_today === served * (BIG_PROMPT + BIG_COMPLETION) && qs.tokens_reserved === 0;
      },
      { timeoutMs: 15000, stepMs: 200 },
    );
    assert.ok(settled, u?.text);
    const spent = u.json.keys[0].quota_state.tokens_today;
    assert.ok(served >= 1, 'at least one served');
    assert.ok(spent <= LIMIT + reservation, `spent ${spent} tokens of a ${LIMIT} limit (reservation ${reservation}); ${served} of 10 served`);
  });

  it('a request refused by the provider\'s own max_concurrent does not use up one of the key\'s requests', async () => {
    const k = olpKeys(server.home, 'keygen', '--name=day guest', '--quota-rpd=2');
    const send = () => curl(server, { method: 'POST', path: '/v1/chat/completions', auth: bearer(k.token), body: chatBody('narrow') });
    const first = send();
    // The first run holds narrow's one slot (2 s): wait until it runs.
    const running = await waitFor(
      async () => metric((await curl(server, { path: '/metrics', auth: true })).text, 'olp_runs_in_flight{provider="narrow"}') === 1,
      { timeoutMs: 10000, stepMs: 50 },
    );
    assert.ok(running, 'the first run never started');
    const capped = await send();
    assert.equal(capped.status, 429, capped.text);
    assert.equal(capped.json.error.code, 'CONCURRENCY_LIMIT');
    assert.equal((await first).status, 200);
    // The second of the day is still there: the capped one was given back.
    const second = await send();
    assert.equal(second.status, 200, second.text);
    const third = await send();
    assert.equal(third.status, 429, third.text);
    assert.equal(third.json.error.code, 'quota_exceeded');
    assert.match(third.json.error.message, /requests_per_day is 2 and it has used 2/);
  });

  it('a client looping on a 429 adds a ledger row a minute, and /v1/usage counts every refusal', async () => {
    const k = olpKeys(server.home, 'keygen', '--name=looping guest', '--quota-rpm=1');
    const N = 200;
    const all = await flood(N, 10, () =>
      req(server, '/v1/chat/completions', { method: 'POST', token: k.token, body: chatBody('metered') }),
    );
    const served = all.filter((r) => r.status === 200).length;
    assert.ok(served >= 1 && served <= 4, `${served} served`); // 1 a minute: a minute boundary may pass
    assert.equal(all.filter((r) => r.status === 429).length, N - served);
    let u;
    const counted = await waitFor(
      async () => {
        u = await req(server, '/v1/usage?recent=200', { token: k.token });
        return u.json?.keys?.[0]?.totals?.requests === N;
      },
      { timeoutMs: 15000, stepMs: 200 },
    );
    assert.ok(counted, u?.text);
    assert.equal(u.json.keys[0].totals.errors, N - served);
    // The served rows, and one refusal row per minute the flood lasted (a few at most).
    const rows = u.json.recent;
    assert.ok(rows.length <= served + 3, `${rows.length} ledger rows for ${N} requests`);
    const refusals = rows.filter((r) => r.status === 429);
    assert.equal(refusals.reduce((n, r) => n + r.count, 0), N - served);
    for (const r of refusals) assert.equal(r.start, 'none');
    // Counted just after each answer is finished (after its ledger row): wait for the last.
    let m;
    await waitFor(async () =>
      metric((m = await curl(server, { path: '/metrics', auth: true })).text, 'olp_quota_rejections_total{limit="requests_per_minute"}') >= N - served,
    { timeoutMs: 10000, stepMs: 100 });
    assert.ok(metric(m.text, 'olp_quota_rejections_total{limit="requests_per_minute"}') >= N - served, m.text);
  });
});

describe('the audit log: unauthenticated floods counted, size rotation with retention', () => {
  const MAX = 65536;
  const KEEP = 2;
  let server;

  before(async () => {
    const dirs = makeHome({ config: { ...testConfig(), audit: { max_bytes: MAX, keep: KEEP } } });
    server = await startServer({ dirs, maxProcs: 2, threads: 4 });
  });
  after(async () => {
    await server?.stop();
  });

  const logs = () => {
    const dir = path.join(server.home, 'logs');
    const files = fs.readdirSync(dir).filter((f) => f.startsWith('audit'));
    const sizes = files.map((f) => fs.statSync(path.join(dir, f)).size);
    return { files, sizes, total: sizes.reduce((a, b) => a + b, 0) };
  };

  it('2,000 requests without a key leave the audit log a few summary lines long', async () => {
    const before = logs().total;
    const all = await flood(2000, 20, (i) =>
      i % 2 ? req(server, '/v1/models') : req(server, `/no/such/route/${i}`, { token: 'olp_wrong' }),
    );
    assert.deepEqual([...new Set(all.map((r) => r.status))].sort(), [401, 404]);
    const grown = logs().total - before;
    // A summary line (~250 bytes) per worker and minute: not 2,000 lines of ~300.
    assert.ok(grown < 4096, `the audit log grew by ${grown} bytes`);
    // A request is counted just after its answer is finished: wait for the last ones.
    let m;
    const counted = (x) => ['401', '404'].every((st) => metric(x.text, `olp_unauthenticated_requests_total{status="${st}"}`) >= 1000);
    await waitFor(async () => counted((m = await curl(server, { path: '/metrics', auth: true }))), { timeoutMs: 10000, stepMs: 100 });
    assert.equal(metric(m.text, 'olp_unauthenticated_requests_total{status="401"}'), 1000);
    assert.equal(metric(m.text, 'olp_unauthenticated_requests_total{status="404"}'), 1000);
    const text = fs.readFileSync(path.join(server.home, 'logs', 'audit.ndjson'), 'utf8');
    const summaries = text.split('\n').filter(Boolean).map((l) => JSON.parse(l)).filter((j) => j.event === 'unauthenticated_summary');
    assert.ok(summaries.length >= 1, text);
    assert.ok(!text.includes('olp_wrong'), 'a token in the audit log');
  });

  it(`authenticated lines rotate past audit.max_bytes, and only ${KEEP} rotated files stay`, async () => {
    // ~300 bytes a line: 1,200 requests are ~5 times max_bytes.
    const all = await flood(1200, 20, () => req(server, '/v1/models', { token: server.token }));
    assert.ok(all.every((r) => r.status === 200));
    const l = logs();
    assert.ok(l.files.length <= KEEP + 1, l.files.join(', '));
    assert.ok(l.files.some((f) => /^audit-\d{4}-\d\d-\d\dT\d{6}(\.\d+)?\.ndjson$/.test(f)), l.files.join(', '));
    // Each file at most a line per worker past the cap; in all about MAX * (KEEP + 1).
    for (const s of l.sizes) assert.ok(s < MAX + 4096, `a file of ${s} bytes`);
    assert.ok(l.total < (KEEP + 1) * (MAX + 4096), `${l.total} bytes of audit log`);
  });
});

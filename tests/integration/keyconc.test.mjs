// A key's quota max_concurrent (ADR 0020, amended) behind a real lighttpd with two
// olp-fcgi worker processes of one thread each: while a guest key with max_concurrent 1
// streams from a slow command provider in one worker, its second request — which lighttpd
// can only hand to the other worker — is refused with 429 concurrency_limit_exceeded and
// Retry-After: 1, another key is served at the same time, and once the first answer is
// over (finished, or dropped by its client) the key is served again. The refusal has its
// ledger row (status 429, start none) and its metric. Slots that cannot be taken refuse
// the key's requests (503): the cap fails closed.
//
// Keys are made with the real olp-keys (OLP_KEYS, set by CTest), as an operator would.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';

import { chatBody, commandProvider, curl, makeHome, olpKeys, startServer, testConfig, testRegistry, waitFor } from './harness.mjs';

const bearer = (t) => `Bearer ${t}`;

// 60 lines 0.2 s apart: about 12 s, far longer than the requests made while it runs.
const SLOW = 'cat >/dev/null; i=0; while [ $i -lt 60 ]; do echo "tick $i"; sleep 0.2; i=$((i+1)); done';

function registry() {
  const r = testRegistry();
  r.providers.slow = commandProvider('slow', ['/bin/sh', '-c', SLOW], { timeout_s: 60 });
  return r;
}

// Which worker process answered each request id: from the workers' own log lines.
function pidOf(server, rid) {
  for (const line of server.errorLog().split('\n')) {
    if (!line.startsWith('{')) continue;
    try {
      const j = JSON.parse(line);
      if (j.event === 'request' && j.request_id === rid) return j.pid;
    } catch {
      /* not ours */
    }
  }
  return undefined;
}

// A streaming request that resolves { started } once its first bytes came, and
// { done } when it ends; abort() drops it.
function stream(server, token, model) {
  const payload = JSON.stringify(chatBody(model, 'slowly', { stream: true }));
  let onStart;
  const started = new Promise((r) => { onStart = r; });
  let req;
  const done = new Promise((resolve, reject) => {
    req = http.request(server.url('/v1/chat/completions'), {
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
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body }));
      res.on('error', () => resolve({ status: res.statusCode, headers: res.headers, body, aborted: true }));
    });
    req.on('error', (e) => (req.destroyed ? resolve({ aborted: true }) : reject(e)));
    req.end(payload);
  });
  return { started, done, abort: () => req.destroy() };
}

// Every concurrency refusal the tests saw, for the ledger and the metric at the end.
let refusals = 0;
const isRefusal = (r) => r.status === 429 && r.json?.error?.code === 'concurrency_limit_exceeded';

function assertRefused(r, n) {
  if (isRefusal(r)) refusals++;
  assert.equal(r.status, 429, r.text);
  assert.equal(r.headers['retry-after'], '1');
  assert.deepEqual(r.json.error, {
    type: 'rate_limit_error',
    code: 'concurrency_limit_exceeded',
    param: null,
    message: `This key is running its limit of ${n} requests at once; retry when one finishes`,
  });
}

describe('quota max_concurrent across 2 workers', () => {
  let server;
  let guest;
  let other;
  let daily;

  before(async () => {
    const dirs = makeHome({ registry: registry(), config: testConfig() });
    guest = olpKeys(dirs.home, 'keygen', '--name=conc guest', '--quota-concurrent=1');
    daily = olpKeys(dirs.home, 'keygen', '--name=daily', '--quota-concurrent=1', '--quota-rpd=3');
    other = olpKeys(dirs.home, 'keygen', '--name=other guest');
    server = await startServer({ dirs, maxProcs: 2, threads: 1 });
    await waitFor(() => server.workerPids().length === 2, { timeoutMs: 15000 });
  });
  after(async () => {
    await server?.stop();
  });

  it('a second request of the key on the other worker gets 429; another key is served meanwhile; then the key is served again', async () => {
    const first = stream(server, guest.token, 'slow');
    const res = await first.started;
    const firstRid = res.headers['x-request-id'];

    const second = await curl(server, { method: 'POST', path: '/v1/chat/completions', auth: bearer(guest.token), body: chatBody('echo', 'again') });
    assertRefused(second, 1);
    const meanwhile = await curl(server, { method: 'POST', path: '/v1/chat/completions', auth: bearer(other.token), body: chatBody('echo', 'mine') });
    assert.equal(meanwhile.status, 200, meanwhile.text);

    const end = await first.done;
    assert.equal(end.status, 200);
    assert.ok(!end.aborted && end.body.includes('tick 59') && end.body.includes('[DONE]'),
      'the first answer ran to its end while the other requests were made');
    // One thread per worker: the refused request cannot have been in the first one's
    // worker, so the cap held across processes.
    await waitFor(() => pidOf(server, firstRid) && pidOf(server, second.headers['x-request-id']), { timeoutMs: 5000 });
    const p1 = pidOf(server, firstRid);
    const p2 = pidOf(server, second.headers['x-request-id']);
    assert.ok(p1 && p2 && p1 !== p2, `the two requests of the key ran in workers ${p1} and ${p2}`);

    // At once after the end of the answer: the slot is free.
    const again = await curl(server, { method: 'POST', path: '/v1/chat/completions', auth: bearer(guest.token), body: chatBody('echo', 'now') });
    assert.equal(again.status, 200, again.text);
    // Several in a row: nothing leaks a slot.
    for (let i = 0; i < 3; i++) {
      const r = await curl(server, { method: 'POST', path: '/v1/chat/completions', auth: bearer(guest.token), body: chatBody('echo', `n${i}`) });
      assert.equal(r.status, 200, r.text);
    }
  });

  it('a first request dropped by its client frees the slot too', async () => {
    const first = stream(server, guest.token, 'slow');
    await first.started;
    const refused = await curl(server, { method: 'POST', path: '/v1/chat/completions', auth: bearer(guest.token), body: chatBody('echo') });
    assertRefused(refused, 1);
    first.abort();
    await first.done;
    // The worker notices the hangup and ends the run; then the key is served.
    let last;
    const ok = await waitFor(async () => {
      last = await curl(server, { method: 'POST', path: '/v1/chat/completions', auth: bearer(guest.token), body: chatBody('echo') });
      if (isRefusal(last)) refusals++;
      return last.status === 200;
    }, { timeoutMs: 20000, stepMs: 250 });
    assert.ok(ok, `the key was not served again: ${last?.status} ${last?.text}`);
  });

  it('a request refused for concurrency does not use up requests_per_day', async () => {
    const first = stream(server, daily.token, 'slow');
    await first.started;
    for (let i = 0; i < 3; i++)
      assertRefused(await curl(server, { method: 'POST', path: '/v1/chat/completions', auth: bearer(daily.token), body: chatBody('echo') }), 1);
    first.abort();
    await first.done;
    // 1 of 3 used: two more are served once the slot is free, the next is over the quota.
    let r;
    await waitFor(async () => {
      r = await curl(server, { method: 'POST', path: '/v1/chat/completions', auth: bearer(daily.token), body: chatBody('echo') });
      if (!isRefusal(r)) return true;
      refusals++;
      return false;
    }, { timeoutMs: 20000, stepMs: 250 });
    assert.equal(r.status, 200, r.text);
    const third = await curl(server, { method: 'POST', path: '/v1/chat/completions', auth: bearer(daily.token), body: chatBody('echo') });
    assert.equal(third.status, 200, third.text);
    const over = await curl(server, { method: 'POST', path: '/v1/chat/completions', auth: bearer(daily.token), body: chatBody('echo') });
    assert.equal(over.status, 429, over.text);
    assert.equal(over.json.error.code, 'quota_exceeded');
  });

  it('set-quota --concurrent=2 applies on the next request: two of the key stream at once', async () => {
    olpKeys(server.home, 'set-quota', `--id=${guest.id}`, '--concurrent=2');
    const a = stream(server, guest.token, 'slow');
    const b = stream(server, guest.token, 'slow');
    await Promise.all([a.started, b.started]);
    a.abort();
    b.abort();
    await Promise.all([a.done, b.done]);
    const u = await curl(server, { method: 'GET', path: '/v1/usage', auth: bearer(guest.token) });
    assert.equal(u.status, 200, u.text);
    const k = u.json.keys.find((x) => x.key_id === guest.id);
    assert.equal(k.quota.max_concurrent, 2);
  });

  it('the refusals are in the ledger (status 429, start none) and the metric', async () => {
    const u = await curl(server, { method: 'GET', path: '/v1/usage?recent=200', auth: bearer(server.token) });
    assert.equal(u.status, 200, u.text);
    // Each refusal seen is counted (in its key's refusal row of the minute, ADR 0026);
    // daily's one quota_exceeded too.
    const refused = u.json.recent.filter((r) => [guest.id, daily.id].includes(r.key_id) && r.status === 429);
    assert.equal(refused.reduce((n, r) => n + r.count, 0), refusals + 1, JSON.stringify(u.json.recent));
    for (const r of refused) {
      assert.equal(r.start, 'none');
      assert.equal(r.provider, null);
    }
    const m = await curl(server, { method: 'GET', path: '/metrics', auth: bearer(server.token) });
    assert.equal(m.status, 200, m.text);
    const n = m.text.match(/^olp_quota_rejections_total\{limit="max_concurrent"\} (\d+)$/m);
    assert.ok(n, m.text);
    assert.equal(Number(n[1]), refusals);
  });
});

describe('quota max_concurrent when its slots cannot be taken', () => {
  let server;
  let capped;
  let free;

  before(async () => {
    const dirs = makeHome({ registry: registry(), config: testConfig() });
    // A file where the slots' directory should be: every slot_take fails (ENOTDIR).
    fs.mkdirSync(dirs.runtimeDir, { mode: 0o700 });
    fs.writeFileSync(path.join(dirs.runtimeDir, 'keyslots'), '', { mode: 0o600 });
    capped = olpKeys(dirs.home, 'keygen', '--name=capped', '--quota-concurrent=4');
    free = olpKeys(dirs.home, 'keygen', '--name=free');
    server = await startServer({ dirs, maxProcs: 1, threads: 2 });
  });
  after(async () => {
    await server?.stop();
  });

  it('fails closed: a key with the limit gets 503, a key without it is served, the worker stays up', async () => {
    const r = await curl(server, { method: 'POST', path: '/v1/chat/completions', auth: bearer(capped.token), body: chatBody('echo') });
    assert.equal(r.status, 503, r.text);
    assert.equal(r.json.error.code, 'concurrency_unavailable');
    const ok = await curl(server, { method: 'POST', path: '/v1/chat/completions', auth: bearer(free.token), body: chatBody('echo') });
    assert.equal(ok.status, 200, ok.text);
  });
});

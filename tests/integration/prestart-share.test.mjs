// Per-key shares of the pre-start pool (issue 22 item 8, ADR 0022 amended) behind the real
// lighttpd: a guest key that churns variants (each request another pre-start key, as a new
// max_tokens is for claude) keeps at most its share of the host's slots (half of 4) and
// never evicts the owner's pre-started process, which the owner's next request takes; a
// key with max_concurrent 1 keeps at most one process started ahead; a key never takes
// another key's. The old pool dropped its oldest, whoever's, up to the host's 4.
//
// Keys are made with the real olp-keys (OLP_KEYS, set by CTest), as an operator would.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import { chatBody, commandProvider, curl, olpKeys, startServer, testRegistry, waitFor } from './harness.mjs';

const VARIANTS = 6;
let srv;
let guest;
let limited;

function registry() {
  const r = testRegistry();
  r.providers['pre-own'] = commandProvider('pre-own', ['/usr/bin/cat'], { prestart: 1 });
  // The same command under another argv each: another pre-start key each.
  for (let v = 1; v <= VARIANTS; v++)
    r.providers[`pre-v${v}`] = commandProvider(`pre-v${v}`, ['/bin/sh', '-c', 'cat', `v${v}`], { prestart: 1 });
  return r;
}

async function health() {
  const r = await curl(srv, { path: '/health' });
  assert.equal(r.status, 200);
  return r.json.prestart;
}

// Pre-started processes made so far (the host's count): a run's successor is started after
// its answer went out, so a test awaits this rather than the answer.
async function ready() {
  const m = await curl(srv, { path: '/metrics' });
  assert.equal(m.status, 200);
  const hit = m.text.match(/^olp_prestart_events_total\{event="ready"\} (\d+)$/m);
  return hit ? Number(hit[1]) : 0;
}

async function chat(model, token) {
  const r = await curl(srv, {
    method: 'POST',
    path: '/v1/chat/completions',
    body: chatBody(model, `hello ${model}`),
    ...(token ? { auth: `Bearer ${token}` } : {}),
  });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.choices[0].message.content, `hello ${model}`);
  return r.headers['x-olp-prestart'];
}

// A chat, then the wait for its successor: every run here makes one (its key evicts its
// own oldest when at its share), after its answer went out. The next request waits for
// it, so that no two runs' successors race each other.
async function chatThenReady(model, token) {
  const r0 = await ready();
  const hdr = await chat(model, token);
  assert.ok(await waitFor(async () => (await ready()) > r0, { timeoutMs: 15000 }), `${model}: its successor`);
  return hdr;
}

before(async () => {
  // One worker process: the old pool's eviction (oldest first, whoever's) was within one
  // process; the shares across processes are unit_sandbox_prestart's.
  srv = await startServer({
    maxProcs: 1,
    threads: 2,
    registry: registry(),
    config: {
      auth: { allow_anonymous: false },
      sandbox: { mode: 'bwrap', warm: true, prestart_max: 4, prestart_idle_s: 120 },
    },
  });
  guest = olpKeys(srv.home, 'keygen', '--name=churning guest');
  limited = olpKeys(srv.home, 'keygen', '--name=limited guest', '--quota-concurrent=1');
});

after(async () => {
  await srv?.stop();
});

describe('per-key shares of pre-started processes', () => {
  it("a guest's churn keeps its share and leaves the owner's process to the owner", async () => {
    assert.equal(await chatThenReady('pre-own'), 'miss');
    assert.equal((await health()).idle, 1);

    // max_concurrent 1: one started ahead at most, whatever it churns (its oldest goes).
    for (let v = 1; v <= 3; v++) assert.equal(await chatThenReady(`pre-v${v}`, limited.token), 'miss');
    assert.equal((await health()).idle, 2, 'the owner 1, the limited key 1');

    // A guest without a limit: half of the host's 4, its own put down to make room.
    for (let v = 1; v <= VARIANTS; v++) assert.equal(await chatThenReady(`pre-v${v}`, guest.token), 'miss');
    const h = await health();
    assert.equal(h.idle, 4, `the owner 1, the limited key 1, the guest 2: ${JSON.stringify(h)}`);

    // The owner's variant asked by the guest: never the owner's process.
    assert.equal(await chatThenReady('pre-own', guest.token), 'miss');
    // The owner's process survived all of it; the limited key's too.
    assert.equal(await chat('pre-own'), 'hit');
    assert.equal(await chat('pre-v3', limited.token), 'hit');
  });
});

// Pre-started provider processes (issue 15, ADR 0022) behind the real lighttpd: a command
// provider with "prestart": 1 answers the same whether its process was started ahead or
// not, says which in X-OLP-Prestart, counts in the owner's /health, and a process that
// died (or whose run fails before any output) while it waited never reaches the client:
// the request is answered cold.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';

import { chatBody, commandProvider, curl, curlStream, startServer, testRegistry, waitFor } from './harness.mjs';

let srv;

const cmd = commandProvider;

function registry() {
  const r = testRegistry();
  // The same command with and without a process started ahead.
  r.providers['pre-echo'] = cmd('pre-echo', ['/usr/bin/cat'], { prestart: 1 });
  r.providers['cold-echo'] = cmd('cold-echo', ['/usr/bin/cat'], { prestart: 0 });
  // Dies when it has waited 2 s for its stdin: a pre-started one is dead by the time a
  // request comes 3 s later.
  r.providers['pre-dies'] = cmd(
    'pre-dies',
    ['/bin/bash', '-c', 'IFS= read -r -t 2 l || [ -n "$l" ] || exit 3; printf "%s" "$l"; cat'],
    { prestart: 1 },
  );
  // Fails with no output once it has waited 2 s (a credential that expired meanwhile):
  // the pre-started run fails before any output, the cold one answers.
  r.providers['pre-stale'] = cmd(
    'pre-stale',
    ['/bin/bash', '-c', 's=$SECONDS; l=$(cat); (( SECONDS - s >= 2 )) && exit 1; printf "%s" "$l"'],
    { prestart: 1 },
  );
  return r;
}

async function health() {
  const r = await curl(srv, { path: '/health' });
  assert.equal(r.status, 200);
  return r.json.prestart;
}

async function chat(model, content, stream = false) {
  const body = chatBody(model, content, stream ? { stream: true } : {});
  const r = stream
    ? await curlStream(srv, { method: 'POST', path: '/v1/chat/completions', body })
    : await curl(srv, { method: 'POST', path: '/v1/chat/completions', body });
  assert.equal(r.status, 200, r.text);
  const text = stream
    ? r.events
        .filter((e) => e.data !== '[DONE]')
        .map((e) => JSON.parse(e.data).choices?.[0]?.delta?.content ?? '')
        .join('')
    : r.json.choices[0].message.content;
  return { r, text };
}

before(async () => {
  // One worker process: the counts in /health are that process's, and a request must
  // find the process its predecessor left.
  srv = await startServer({
    maxProcs: 1,
    threads: 2,
    registry: registry(),
    config: {
      auth: { allow_anonymous: false },
      sandbox: { mode: 'bwrap', warm: true, prestart_max: 4, prestart_idle_s: 60 },
    },
  });
});

after(async () => {
  await srv?.stop();
});

describe('pre-started processes', () => {
  it('the first request misses, the next hits, with the same answer as cold', async () => {
    const h0 = await health();
    const first = await chat('pre-echo', 'hello one');
    assert.equal(first.r.headers['x-olp-prestart'], 'miss');
    assert.equal(first.text, 'hello one');
    assert.ok(await waitFor(async () => (await health()).idle >= 1, { timeoutMs: 15000 }));
    await sleep(300);
    const second = await chat('pre-echo', 'hello two');
    assert.equal(second.r.headers['x-olp-prestart'], 'hit');
    const cold = await chat('cold-echo', 'hello two');
    assert.equal(cold.r.headers['x-olp-prestart'], undefined, 'no header without prestart');
    assert.equal(second.text, cold.text);
    assert.deepEqual(second.r.json.usage, cold.r.json.usage);
    assert.equal(second.r.json.choices[0].finish_reason, cold.r.json.choices[0].finish_reason);
    // Streaming, through another pre-started process: never the one used before.
    assert.ok(await waitFor(async () => (await health()).idle >= 1, { timeoutMs: 15000 }));
    await sleep(300);
    const streamed = await chat('pre-echo', 'hello three', true);
    assert.equal(streamed.r.headers['x-olp-prestart'], 'hit');
    assert.equal(streamed.text, 'hello three');
    const h1 = await health();
    // The host's counts (the pool's shared metrics), whichever worker answers.
    assert.equal(h1.scope, 'host');
    assert.ok(h1.hit - h0.hit >= 2, JSON.stringify(h1));
    assert.ok(h1.miss - h0.miss >= 1, JSON.stringify(h1));
  });

  it('/health has the counts for the owner only', async () => {
    const anon = await curl(srv, { path: '/health', auth: false });
    assert.equal(anon.json.prestart, undefined);
    const h = await health();
    for (const k of ['hit', 'miss', 'expired', 'died', 'idle']) assert.equal(typeof h[k], 'number', k);
    // The same counts are in the Prometheus scrape.
    const m = await curl(srv, { path: '/metrics' });
    assert.equal(m.status, 200);
    const hit = m.text.match(/^olp_prestart_events_total\{event="hit"\} (\d+)$/m);
    assert.ok(hit, 'olp_prestart_events_total{event="hit"} in /metrics');
    assert.ok(Number(hit[1]) >= h.hit, `${hit[1]} >= ${h.hit}`);
    assert.match(m.text, /^olp_prestart_idle \d+$/m);
  });

  it('a process that died while it waited: the request is answered cold', async () => {
    const first = await chat('pre-dies', 'alive');
    assert.equal(first.text, 'alive');
    const h0 = await health();
    await sleep(3500);
    const second = await chat('pre-dies', 'still answered');
    assert.equal(second.text, 'still answered');
    assert.equal(second.r.headers['x-olp-prestart'], 'miss');
    assert.ok(await waitFor(async () => (await health()).died > h0.died, { timeoutMs: 5000 }));
  });

  it('a pre-started run that fails before any output is run again cold, unseen', async () => {
    const first = await chat('pre-stale', 'fresh');
    assert.equal(first.text, 'fresh');
    assert.ok(await waitFor(async () => (await health()).idle >= 1, { timeoutMs: 15000 }));
    await sleep(2500);
    const h0 = await health();
    const second = await chat('pre-stale', 'answered cold');
    assert.equal(second.text, 'answered cold');
    assert.equal(second.r.headers['x-olp-prestart'], 'miss');
    const h1 = await health();
    assert.equal(h1.hit, h0.hit + 1, 'it took the pre-started one first');
    assert.match(srv.errorLog(), /pre-started process failed before any output/);
  });
});

// The request path end to end, through a real lighttpd with lighttpd/olp.conf,
// driven by real curl: routes, JSON and SSE answers, incremental streaming,
// provider failures, timeouts, the child's fds, client disconnects.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { after, before, describe, it } from 'node:test';

import { MODELS, cfg, chatBody, curl, curlStream, startServer, waitFor } from './harness.mjs';

let srv;
let initialWorkers;

before(async () => {
  srv = await startServer();
  initialWorkers = srv.workerPids();
});

after(async () => {
  await srv?.stop();
});

function assertRequestId(res) {
  assert.ok(res.headers['x-request-id'], `X-Request-Id missing; headers:\n${res.head}`);
}

function assertError(res, status, type) {
  assert.equal(res.status, status, `expected ${status}, got ${res.status}: ${res.text}`);
  assert.match(res.headers['content-type'] ?? '', /^application\/json/);
  assert.ok(res.json?.error, `no error object: ${res.text}`);
  assert.equal(typeof res.json.error.message, 'string');
  if (type) assert.equal(res.json.error.type, type, res.text);
  assertRequestId(res);
}

// Checks the shape of a whole chat.completion.chunk stream and returns its text.
function checkStream(res, { model, finish = 'stop', usage = false } = {}) {
  assert.equal(res.status, 200, res.text);
  assert.match(res.headers['content-type'] ?? '', /^text\/event-stream/);
  assert.match(res.headers['cache-control'] ?? '', /no-cache/);
  assert.equal(res.headers['x-accel-buffering'], 'no');
  assertRequestId(res);
  const ev = res.events.map((e) => e.data);
  assert.ok(ev.length >= 3, `too few events: ${res.text}`);
  assert.equal(ev.at(-1), '[DONE]', 'the stream must end with data: [DONE]');
  assert.equal(ev.filter((d) => d === '[DONE]').length, 1);
  const chunks = ev.slice(0, -1).map((d) => JSON.parse(d));
  const id = chunks[0].id;
  assert.match(id, /^chatcmpl-/);
  for (const c of chunks) {
    assert.equal(c.object, 'chat.completion.chunk');
    assert.equal(c.id, id, 'every chunk carries the same id');
    assert.equal(typeof c.created, 'number');
    if (model) assert.equal(c.model, model);
  }
  let withChoices = chunks;
  if (usage) {
    const last = chunks.at(-1);
    assert.ok(last.usage && typeof last.usage === 'object', `usage chunk expected last: ${JSON.stringify(last)}`);
    assert.deepEqual(last.choices, []);
    withChoices = chunks.slice(0, -1);
  } else {
    assert.ok(chunks.every((c) => !c.usage), 'no usage chunk unless stream_options.include_usage');
  }
  assert.equal(withChoices[0].choices[0].delta.role, 'assistant', 'role on the first chunk');
  for (const c of withChoices.slice(1)) assert.equal(c.choices[0].delta.role, undefined, 'role on the first chunk only');
  const finishes = withChoices.map((c) => c.choices[0].finish_reason ?? null);
  assert.deepEqual(
    finishes.filter((f) => f !== null),
    [finish],
    `exactly one finish_reason ${finish}: ${JSON.stringify(finishes)}`,
  );
  assert.notEqual(finishes.at(-1), null, 'the finish_reason chunk is the last chunk with choices');
  return withChoices.map((c) => c.choices[0].delta.content ?? '').join('');
}

describe('routes', () => {
  it('GET /health answers anonymously with ok and version only', async () => {
    const r = await curl(srv, { path: '/health', auth: false });
    assert.equal(r.status, 200, r.text);
    assert.match(r.headers['content-type'], /^application\/json/);
    assert.equal(r.json.ok, true);
    assert.equal(typeof r.json.version, 'string');
    assert.equal(r.json.providers, undefined, 'providers are for the owner only');
    assertRequestId(r);
  });

  it('GET /health as the owner adds providers and sandbox', async () => {
    const r = await curl(srv, { path: '/health' });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.ok, true);
    assert.ok(r.json.providers, `providers missing: ${r.text}`);
    assert.ok(r.json.sandbox, `sandbox missing: ${r.text}`);
    // Resource control: a cgroup v2 per run, or rlimits and the reason why not.
    assert.ok(['cgroup2', 'rlimits'].includes(r.json.sandbox.cgroup), r.text);
    assert.equal(typeof r.json.sandbox.cgroup_detail, 'string');
    assert.ok(r.json.sandbox.cgroup_detail.length > 0, r.text);
    // Every run is a host uid of its own (ADR 0014), and the range is named.
    assert.equal(r.json.sandbox.identity, 'per_run', r.text);
    assert.match(r.json.sandbox.identity_detail, /one host uid per run from \d+-\d+/);
  });

  it('routes on the path, never on the query string', async () => {
    const r = await curl(srv, { path: '/health?x=/v1/models' });
    assert.equal(r.status, 200);
    assert.equal(r.json.ok, true);
    const n = await curl(srv, { path: '/x?y=/health' });
    assertError(n, 404, 'not_found');
    assert.equal(n.json.error.message, 'Route GET /x not found');
  });

  it('GET /v1/models lists the registry', async () => {
    const r = await curl(srv, { path: '/v1/models' });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.object, 'list');
    const ids = r.json.data.map((m) => m.id);
    for (const id of MODELS) assert.ok(ids.includes(id), `model ${id} missing from ${ids}`);
    for (const m of r.json.data) {
      assert.equal(m.object, 'model');
      assert.equal(typeof m.created, 'number');
      assert.equal(typeof m.owned_by, 'string');
    }
    assert.equal(r.json.data.find((m) => m.id === 'echo').created, 1700000000);
  });

  it('unknown routes are 404 not_found', async () => {
    for (const [method, p] of [
      ['GET', '/x'],
      ['POST', '/v1/completions'],
      ['GET', '/v1'],
      ['GET', '/'],
      ['PUT', '/v1/chat/completions/extra'],
    ]) {
      const r = await curl(srv, { method, path: p });
      assertError(r, 404, 'not_found');
      assert.equal(r.json.error.message, `Route ${method} ${p} not found`);
    }
  });

  it('a known path with the wrong method is 405 with Allow', async () => {
    for (const [method, p, allow] of [
      ['GET', '/v1/chat/completions', 'POST'],
      ['PUT', '/v1/chat/completions', 'POST'],
      ['POST', '/health', 'GET'],
      ['DELETE', '/v1/models', 'GET'],
    ]) {
      const r = await curl(srv, { method, path: p });
      assert.equal(r.status, 405, `${method} ${p}: ${r.text}`);
      assert.ok(r.headers.allow, `${method} ${p}: no Allow header:\n${r.head}`);
      assert.ok(r.headers.allow.split(/,\s*/).includes(allow), `Allow: ${r.headers.allow}`);
      assert.ok(r.json?.error?.type, r.text);
      assertRequestId(r);
    }
  });
});

describe('chat completions, JSON', () => {
  it('echo round trip', async () => {
    const r = await curl(srv, { method: 'POST', path: '/v1/chat/completions', body: chatBody('echo', 'hello there') });
    assert.equal(r.status, 200, r.text);
    assert.match(r.headers['content-type'], /^application\/json/);
    assertRequestId(r);
    const j = r.json;
    assert.equal(j.object, 'chat.completion');
    assert.match(j.id, /^chatcmpl-/);
    assert.equal(typeof j.created, 'number');
    assert.equal(j.model, 'echo');
    assert.equal(j.choices.length, 1);
    assert.equal(j.choices[0].index, 0);
    assert.equal(j.choices[0].message.role, 'assistant');
    assert.equal(j.choices[0].message.content, 'hello there');
    assert.equal(j.choices[0].finish_reason, 'stop');
  });

  it('flattens system, assistant and user messages as the Node OLP does', async () => {
    const body = {
      model: 'echo',
      messages: [
        { role: 'system', content: 'be brief' },
        { role: 'user', content: 'hi' },
        { role: 'assistant', content: 'hello' },
        { role: 'user', content: [{ type: 'text', text: 'again' }] },
      ],
    };
    const r = await curl(srv, { method: 'POST', path: '/v1/chat/completions', body });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.choices[0].message.content, '[System] be brief\n\nhi\n\n[Assistant] hello\n\nagain');
  });

  it('an alias answers with the model name as requested', async () => {
    const r = await curl(srv, { method: 'POST', path: '/v1/chat/completions', body: chatBody('echo-alias', 'x') });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.model, 'echo-alias');
    assert.equal(r.json.choices[0].message.content, 'x');
  });

  it('a 1 MiB prompt is echoed back intact (no pipe deadlock)', async () => {
    const big = 'abcdefghijklmnopqrstuvwxyz012345'.repeat(32768);
    const r = await curl(srv, { method: 'POST', path: '/v1/chat/completions', body: chatBody('echo', big) });
    assert.equal(r.status, 200, r.text.slice(0, 300));
    assert.equal(r.json.choices[0].message.content.length, big.length);
    assert.equal(r.json.choices[0].message.content, big);
  });

  it('a 1.2 MB reply arrives whole', async () => {
    const r = await curl(srv, { method: 'POST', path: '/v1/chat/completions', body: chatBody('bigout') });
    assert.equal(r.status, 200, r.text.slice(0, 300));
    const want = Array.from({ length: 200000 }, (_, i) => `${i + 1}\n`).join('');
    const got = r.json.choices[0].message.content;
    assert.equal(got.length, want.length);
    assert.ok(got === want || got === want.trimEnd(), 'bigout content differs');
  });

  it('a command that exits 3 before any output is 502', async () => {
    const r = await curl(srv, { method: 'POST', path: '/v1/chat/completions', body: chatBody('fail3') });
    assertError(r, 502);
  });

  it('a command that exits 3 before any output is 502 in stream mode too', async () => {
    const r = await curl(srv, {
      method: 'POST',
      path: '/v1/chat/completions',
      body: chatBody('fail3', 'x', { stream: true }),
    });
    assertError(r, 502);
  });

  it('a command past its timeout is 504, and its process tree is gone', async () => {
    const t0 = Date.now();
    const r = await curl(srv, { method: 'POST', path: '/v1/chat/completions', body: chatBody('sleeper') });
    const ms = Date.now() - t0;
    assertError(r, 504);
    assert.ok(ms >= 900 && ms < 10000, `504 after ${ms} ms (timeout_s 1)`);
    const left = await srv.waitIdle(3000);
    assert.deepEqual(left, [], 'sleeper processes left behind');
  });

  it('the provider child holds exactly fds 0, 1, 2 and fd 0 is not a socket', async () => {
    const r = await curl(srv, { method: 'POST', path: '/v1/chat/completions', body: chatBody('fdcheck') });
    assert.equal(r.status, 200, r.text);
    const report = JSON.parse(r.json.choices[0].message.content.trim());
    assert.deepEqual(report.fds, [0, 1, 2], `child fds: ${JSON.stringify(report)}`);
    assert.equal(report.fd0_socket, false, `fd 0 is a socket: ${JSON.stringify(report)}`);
  });
});

describe('chat completions, SSE', () => {
  it('echo stream: chunk order, role once, finish_reason, [DONE], headers', async () => {
    const r = await curlStream(srv, {
      method: 'POST',
      path: '/v1/chat/completions',
      body: chatBody('echo', 'stream me', { stream: true }),
    });
    const text = checkStream(r, { model: 'echo' });
    assert.equal(text, 'stream me');
  });

  it('stream_options.include_usage adds a usage chunk before [DONE]', async () => {
    const r = await curlStream(srv, {
      method: 'POST',
      path: '/v1/chat/completions',
      body: chatBody('echo', 'with usage', { stream: true, stream_options: { include_usage: true } }),
    });
    const text = checkStream(r, { model: 'echo', usage: true });
    assert.equal(text, 'with usage');
  });

  it('decides streaming from the body, not the Accept header', async () => {
    const r = await curl(srv, {
      method: 'POST',
      path: '/v1/chat/completions',
      headers: { Accept: 'text/event-stream' },
      body: chatBody('echo', 'json please'),
    });
    assert.equal(r.status, 200);
    assert.match(r.headers['content-type'], /^application\/json/);
    assert.equal(r.json.choices[0].message.content, 'json please');
  });

  it('ticker deltas arrive incrementally, not all at the end', async () => {
    const r = await curlStream(srv, {
      method: 'POST',
      path: '/v1/chat/completions',
      body: chatBody('ticker', 'go', { stream: true }),
    });
    const text = checkStream(r, { model: 'ticker' });
    assert.equal(text, 'tick 1\ntick 2\ntick 3\ntick 4\ntick 5\n');
    const withText = r.events.filter((e) => e.data !== '[DONE]' && /tick \d/.test(e.data));
    const first = withText[0].t;
    const last = withText.at(-1).t;
    const times = withText.map((e) => Math.round(e.t));
    assert.ok(last - first >= 250, `tick chunks arrived within ${Math.round(last - first)} ms: ${times}`);
    assert.ok(new Set(times.map((t) => Math.floor(t / 50))).size >= 3, `arrival times not spread: ${times}`);
  });

  it('an error after output ends the stream with a final chunk and [DONE]', async () => {
    const r = await curlStream(srv, {
      method: 'POST',
      path: '/v1/chat/completions',
      body: chatBody('partial-fail', 'x', { stream: true }),
    });
    assert.equal(r.status, 200, r.text);
    const ev = r.events.map((e) => e.data);
    assert.equal(ev.at(-1), '[DONE]', `no [DONE]: ${r.text}`);
    const chunks = ev.slice(0, -1).map((d) => JSON.parse(d));
    const text = chunks.map((c) => c.choices?.[0]?.delta?.content ?? '').join('');
    assert.equal(text, 'partial reply\n');
    const fin = chunks.filter((c) => c.choices?.[0]?.finish_reason);
    assert.equal(fin.length, 1, `one final chunk: ${r.text}`);
    assert.equal(fin[0].choices[0].finish_reason, 'error');
  });

  it('a large streamed reply arrives whole', async () => {
    const r = await curlStream(srv, {
      method: 'POST',
      path: '/v1/chat/completions',
      body: chatBody('bigout', 'x', { stream: true }),
    });
    const text = checkStream(r, { model: 'bigout' });
    assert.equal(text.length, 1288895);
    assert.ok(text.startsWith('1\n2\n3\n') && text.endsWith('199999\n200000\n'));
  });

  it('a client that goes away mid-stream gets its provider killed', async () => {
    const args = [
      '-sS',
      '-N',
      '--http1.1',
      '-H',
      `Authorization: Bearer ${srv.token}`,
      '-H',
      'Content-Type: application/json',
      '--data-binary',
      JSON.stringify(chatBody('forever', 'x', { stream: true })),
      srv.url('/v1/chat/completions'),
    ];
    const child = spawn(cfg.curl, args, { stdio: ['ignore', 'pipe', 'ignore'] });
    let got = '';
    await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('no stream data within 10 s')), 10000);
      child.stdout.on('data', (d) => {
        got += d;
        if (got.includes('line 2')) {
          clearTimeout(timer);
          resolve();
        }
      });
    });
    const running = srv.workerChildren();
    assert.ok(
      running.some((p) => p.cmdline.includes('forever.sh')),
      `forever.sh not running: ${JSON.stringify(running)}`,
    );
    child.kill('SIGKILL');
    const gone = await waitFor(() => !srv.workerChildren().some((p) => p.cmdline.includes('forever.sh')), {
      timeoutMs: 5000,
    });
    assert.ok(gone, `provider still running 5 s after the client left: ${JSON.stringify(srv.workerChildren())}`);
    assert.deepEqual(await srv.waitIdle(3000), []);
  });

  it('logs one JSON line per request with its id, status and latency; never a token or a prompt', async () => {
    const tag = Math.random().toString(36).slice(2);
    const canary = `PROMPT-CANARY-${tag}`;
    const badToken = `olp_BADTOKEN_CANARY_${tag}`;
    const r = await curl(srv, { method: 'POST', path: '/v1/chat/completions', body: chatBody('echo', canary) });
    assert.equal(r.status, 200);
    const bad = await curl(srv, {
      method: 'POST',
      path: '/v1/chat/completions',
      body: chatBody('echo', canary),
      auth: `Bearer ${badToken}`,
    });
    assert.equal(bad.status, 401);
    const rid = r.headers['x-request-id'];
    const found = await waitFor(() => srv.errorLog().includes(rid), { timeoutMs: 3000 });
    assert.ok(found, `request id ${rid} not in the workers' log`);
    const log = srv.errorLog();
    const line = log.split('\n').find((l) => l.includes(rid) && l.trim().startsWith('{'));
    assert.ok(line, `no JSON log line for ${rid}`);
    const entry = JSON.parse(line);
    assert.equal(entry.status, 200, line);
    assert.ok(Object.keys(entry).some((k) => /latency/.test(k)), `no latency in ${line}`);
    assert.ok(!log.includes(canary), 'a prompt was logged');
    assert.ok(!log.includes(srv.token), 'the owner token was logged');
    assert.ok(!log.includes(badToken), 'a presented (wrong) token was logged');
  });

  it('workers still answer after all of the above, and none was restarted', async () => {
    const r = await curl(srv, { method: 'POST', path: '/v1/chat/completions', body: chatBody('echo', 'still here') });
    assert.equal(r.status, 200);
    assert.equal(r.json.choices[0].message.content, 'still here');
    assert.deepEqual(srv.workerPids(), initialWorkers, 'a worker died and lighttpd restarted it');
    assert.deepEqual(srv.zombies(), []);
  });
});

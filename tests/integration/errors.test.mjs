// Every bad input of the request path, through real lighttpd and curl:
// status, error type and the field named; the checks' order; and after each
// one, the worker still answers the next request.

import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import { chatBody, curl, startServer } from './harness.mjs';

let srv;
let initialWorkers;

before(async () => {
  // lighttpd's own limit a little above the worker's, so that the worker's checks (its
  // JSON 413 among them) are what this file sees; the shipped limit (the same as the
  // worker's, refused unread: ADR 0029) is core.test.mjs's.
  srv = await startServer({ env: { OLP_MAX_BODY_KB: '6144' } });
  initialWorkers = srv.workerPids();
});

after(async () => {
  await srv?.stop();
});

const PATH = '/v1/chat/completions';

function post(body, { headers = { 'Content-Type': 'application/json' }, auth = true } = {}) {
  return curl(srv, { method: 'POST', path: PATH, body, headers, auth });
}

async function expectError(res, status, type, field) {
  const what = `${status} ${type ?? ''} ${field ?? ''}`;
  assert.equal(res.status, status, `expected ${what}, got ${res.status}: ${res.text}`);
  assert.match(res.headers['content-type'] ?? '', /^application\/json/, `${what}: content-type`);
  assert.ok(res.json?.error, `${what}: no {"error":…} object: ${res.text}`);
  assert.equal(typeof res.json.error.message, 'string');
  assert.ok(res.json.error.message.length > 0);
  assert.equal(typeof res.json.error.type, 'string', res.text);
  if (type) assert.equal(res.json.error.type, type, `${what}: ${res.text}`);
  if (field) assert.ok(res.json.error.message.includes(field), `message should name "${field}": ${res.text}`);
  assert.ok(res.headers['x-request-id'], 'X-Request-Id');
  // The worker still answers the next request.
  const next = await post(JSON.stringify(chatBody('echo', 'next')));
  assert.equal(next.status, 200, `request after ${what} failed: ${next.status} ${next.text}`);
  assert.equal(next.json.choices[0].message.content, 'next');
}

const good = JSON.stringify(chatBody('echo', 'ok'));

describe('auth', () => {
  it('no credentials: 401 auth_required', async () => {
    await expectError(await post(good, { auth: false }), 401, 'auth_required');
  });
  it('a wrong bearer token: 401 invalid_or_revoked_key', async () => {
    await expectError(await post(good, { auth: 'Bearer olp_wrong' }), 401, 'invalid_or_revoked_key');
  });
  it('the owner token with one character changed: 401 invalid_or_revoked_key', async () => {
    const t = srv.token;
    const bad = t.slice(0, -1) + (t.at(-1) === 'A' ? 'B' : 'A');
    await expectError(await post(good, { auth: `Bearer ${bad}` }), 401, 'invalid_or_revoked_key');
  });
  it('a non-bearer Authorization header: 401', async () => {
    await expectError(await post(good, { auth: 'Basic dXNlcjpwYXNz' }), 401);
  });
  it('auth comes before everything else', async () => {
    await expectError(
      await post('{not json', { auth: false, headers: { 'Content-Type': 'text/plain' } }),
      401,
      'auth_required',
    );
  });
});

describe('content type', () => {
  it('text/plain: 415', async () => {
    await expectError(await post(good, { headers: { 'Content-Type': 'text/plain' } }), 415);
  });
  it('curl’s default form encoding: 415', async () => {
    await expectError(await post(good, { headers: {} }), 415);
  });
  it('no Content-Type at all: 415', async () => {
    await expectError(await post(good, { headers: { 'Content-Type': null } }), 415);
  });
  it('application/json; charset=utf-8 is accepted', async () => {
    const r = await post(good, { headers: { 'Content-Type': 'application/json; charset=utf-8' } });
    assert.equal(r.status, 200, r.text);
  });
  it('415 comes before the body checks', async () => {
    await expectError(await post('{not json', { headers: { 'Content-Type': 'text/plain' } }), 415);
  });
});

describe('body size', () => {
  it('a body over 5 MiB (5242881 bytes): 413', async () => {
    const pad = 5242881 - JSON.stringify(chatBody('echo', '')).length;
    const body = JSON.stringify(chatBody('echo', 'x'.repeat(pad)));
    assert.equal(body.length, 5242881);
    await expectError(await post(body), 413);
  });
  it('413 comes before JSON parsing', async () => {
    await expectError(await post('{'.repeat(5242881)), 413);
  });
});

describe('JSON', () => {
  for (const [name, body] of [
    ['truncated', '{"model":"echo","messages":['],
    ['empty body', ''],
    ['garbage', 'hello'],
    ['trailing garbage', good + 'x'],
    ['invalid UTF-8', Buffer.concat([Buffer.from('{"model":"echo","messages":[{"role":"user","content":"'), Buffer.from([0xff, 0xfe]), Buffer.from('"}]}')])],
  ]) {
    it(`${name}: 400 invalid_request_error`, async () => {
      await expectError(await post(body), 400, 'invalid_request_error');
    });
  }
  for (const [name, body] of [
    ['an array', '[]'],
    ['a string', '"x"'],
    ['a number', '42'],
    ['null', 'null'],
  ]) {
    it(`top level ${name}: 400 invalid_request_error`, async () => {
      await expectError(await post(body), 400, 'invalid_request_error');
    });
  }
  it('deeply nested JSON does not crash a worker', async () => {
    const r = await post('{"model":"echo","messages":' + '['.repeat(100000) + ']'.repeat(100000) + '}');
    assert.equal(r.status, 400, r.text.slice(0, 200));
  });
});

describe('validation', () => {
  const msgs = [{ role: 'user', content: 'hi' }];
  const cases = [
    ['model missing', { messages: msgs }, 'model'],
    ['model empty', { model: '', messages: msgs }, 'model'],
    ['model not a string', { model: 7, messages: msgs }, 'model'],
    ['messages missing', { model: 'echo' }, 'messages'],
    ['messages empty', { model: 'echo', messages: [] }, 'messages'],
    ['messages not an array', { model: 'echo', messages: 'hi' }, 'messages'],
    ['a message not an object', { model: 'echo', messages: ['hi'] }, 'messages'],
    ['role missing', { model: 'echo', messages: [{ content: 'hi' }] }, 'role'],
    ['role unknown', { model: 'echo', messages: [{ role: 'robot', content: 'hi' }] }, 'role'],
    ['content a number', { model: 'echo', messages: [{ role: 'user', content: 5 }] }, 'content'],
    ['content an object', { model: 'echo', messages: [{ role: 'user', content: { text: 'x' } }] }, 'content'],
    ['max_tokens 0', { model: 'echo', messages: msgs, max_tokens: 0 }, 'max_tokens'],
    ['max_tokens negative', { model: 'echo', messages: msgs, max_tokens: -5 }, 'max_tokens'],
    ['max_tokens fractional', { model: 'echo', messages: msgs, max_tokens: 1.5 }, 'max_tokens'],
    ['max_tokens a string', { model: 'echo', messages: msgs, max_tokens: '10' }, 'max_tokens'],
    ['temperature above 2', { model: 'echo', messages: msgs, temperature: 2.5 }, 'temperature'],
    ['temperature below 0', { model: 'echo', messages: msgs, temperature: -0.1 }, 'temperature'],
    ['temperature a string', { model: 'echo', messages: msgs, temperature: '1' }, 'temperature'],
    ['top_p above 1', { model: 'echo', messages: msgs, top_p: 1.5 }, 'top_p'],
    ['top_p below 0', { model: 'echo', messages: msgs, top_p: -1 }, 'top_p'],
    ['stop a number', { model: 'echo', messages: msgs, stop: 5 }, 'stop'],
    ['stream a string', { model: 'echo', messages: msgs, stream: 'yes' }, 'stream'],
    [
      'stream_options.include_usage a string',
      { model: 'echo', messages: msgs, stream: true, stream_options: { include_usage: 'yes' } },
      'include_usage',
    ],
    // Validation comes before the model lookup.
    ['bad temperature with an unknown model', { model: 'nope', messages: msgs, temperature: 9 }, 'temperature'],
  ];
  for (const [name, body, field] of cases) {
    it(`${name}: 400 invalid_request_error naming ${field}`, async () => {
      await expectError(await post(JSON.stringify(body)), 400, 'invalid_request_error', field);
    });
  }

  const valid = [
    ['content null', { model: 'echo', messages: [{ role: 'user', content: null }, { role: 'user', content: 'x' }] }],
    ['content an array of text parts', { model: 'echo', messages: [{ role: 'user', content: [{ type: 'text', text: 'x' }] }] }],
    ['every role', {
      model: 'echo',
      messages: ['system', 'developer', 'user', 'assistant', 'tool', 'function'].map((role) => ({ role, content: 'x', ...(role === 'tool' ? { tool_call_id: 't1' } : {}), ...(role === 'function' ? { name: 'f' } : {}) })),
    }],
    ['limits at their edges', { model: 'echo', messages: msgs, max_tokens: 1, temperature: 2, top_p: 0 }],
    ['temperature 0 and top_p 1', { model: 'echo', messages: msgs, temperature: 0, top_p: 1 }],
    ['stop as a string', { model: 'echo', messages: msgs, stop: 'END' }],
    ['stop as an array', { model: 'echo', messages: msgs, stop: ['END', 'STOP'] }],
    ['stream false', { model: 'echo', messages: msgs, stream: false }],
    ['fields ignored on purpose', { model: 'echo', messages: msgs, user: 'u1', n: 1, seed: 3 }],
  ];
  for (const [name, body] of valid) {
    it(`valid: ${name}`, async () => {
      const r = await post(JSON.stringify(body));
      assert.equal(r.status, 200, `${name}: ${r.text}`);
      assert.equal(r.json.object, 'chat.completion');
    });
  }
});

describe('model', () => {
  it('an unknown model: 404 model_not_found', async () => {
    await expectError(await post(JSON.stringify(chatBody('no-such-model'))), 404, 'model_not_found', 'no-such-model');
  });
  it('an unknown model in stream mode: 404 model_not_found as JSON', async () => {
    await expectError(
      await post(JSON.stringify(chatBody('no-such-model', 'x', { stream: true }))),
      404,
      'model_not_found',
    );
  });
});

describe('afterwards', () => {
  it('no worker died along the way', async () => {
    assert.deepEqual(srv.workerPids(), initialWorkers, 'a worker was restarted by lighttpd');
    assert.deepEqual(srv.zombies(), []);
  });
});

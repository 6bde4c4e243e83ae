// The official openai npm package (pinned in package.json, installed by
// `npm ci`) against a real lighttpd + olp-fcgi: what a user's own code does.

import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import { MODELS, startServer } from './harness.mjs';

let OpenAI;
try {
  ({ default: OpenAI } = await import('openai'));
} catch (e) {
  throw new Error(`the openai package is missing: run "npm ci" in tests/integration (${e.message})`);
}

let srv;
let client;

before(async () => {
  srv = await startServer();
  client = new OpenAI({ baseURL: srv.url('/v1'), apiKey: srv.token, maxRetries: 0, timeout: 30000 });
});

after(async () => {
  await srv?.stop();
});

describe('openai SDK', () => {
  it('models.list', async () => {
    const ids = [];
    for await (const m of client.models.list()) ids.push(m.id);
    for (const id of MODELS) assert.ok(ids.includes(id), `${id} not in ${ids}`);
  });

  it('chat.completions.create without stream', async () => {
    const c = await client.chat.completions.create({
      model: 'echo',
      messages: [{ role: 'user', content: 'hello from the sdk' }],
    });
    assert.equal(c.object, 'chat.completion');
    assert.match(c.id, /^chatcmpl-/);
    assert.equal(c.model, 'echo');
    assert.equal(c.choices[0].message.role, 'assistant');
    assert.equal(c.choices[0].message.content, 'hello from the sdk');
    assert.equal(c.choices[0].finish_reason, 'stop');
  });

  it('withResponse exposes X-Request-Id', async () => {
    const { response } = await client.chat.completions
      .create({ model: 'echo', messages: [{ role: 'user', content: 'x' }] })
      .withResponse();
    assert.ok(response.headers.get('x-request-id'));
  });

  it('chat.completions.create with stream', async () => {
    const stream = await client.chat.completions.create({
      model: 'echo',
      messages: [{ role: 'user', content: 'streamed via sdk' }],
      stream: true,
    });
    const chunks = [];
    for await (const c of stream) chunks.push(c);
    assert.ok(chunks.length >= 2);
    assert.equal(chunks[0].choices[0].delta.role, 'assistant');
    assert.ok(chunks.slice(1).every((c) => c.choices[0]?.delta?.role === undefined), 'role only on the first chunk');
    assert.equal(chunks.map((c) => c.choices[0]?.delta?.content ?? '').join(''), 'streamed via sdk');
    assert.equal(chunks.at(-1).choices[0].finish_reason, 'stop');
    assert.ok(chunks.every((c) => !c.usage));
  });

  it('stream with stream_options.include_usage ends with a usage chunk', async () => {
    const stream = await client.chat.completions.create({
      model: 'echo',
      messages: [{ role: 'user', content: 'count me' }],
      stream: true,
      stream_options: { include_usage: true },
    });
    const chunks = [];
    for await (const c of stream) chunks.push(c);
    const last = chunks.at(-1);
    assert.ok(last.usage, `no usage chunk: ${JSON.stringify(last)}`);
    assert.deepEqual(last.choices, []);
    for (const k of ['prompt_tokens', 'completion_tokens', 'total_tokens'])
      assert.equal(typeof last.usage[k], 'number', `usage.${k}: ${JSON.stringify(last.usage)}`);
    assert.equal(chunks.at(-2).choices[0].finish_reason, 'stop');
    assert.equal(chunks.map((c) => c.choices[0]?.delta?.content ?? '').join(''), 'count me');
  });

  it('ticker deltas reach the SDK one by one', async () => {
    const t0 = performance.now();
    const stream = await client.chat.completions.create({
      model: 'ticker',
      messages: [{ role: 'user', content: 'go' }],
      stream: true,
    });
    const seen = [];
    for await (const c of stream) {
      const d = c.choices[0]?.delta?.content;
      if (d) seen.push({ d, t: performance.now() - t0 });
    }
    assert.equal(seen.map((s) => s.d).join(''), 'tick 1\ntick 2\ntick 3\ntick 4\ntick 5\n');
    const spread = seen.at(-1).t - seen[0].t;
    assert.ok(spread >= 250, `deltas arrived within ${Math.round(spread)} ms: ${seen.map((s) => Math.round(s.t))}`);
  });

  it('a stream that fails after output ends with finish_reason error', async () => {
    const stream = await client.chat.completions.create({
      model: 'partial-fail',
      messages: [{ role: 'user', content: 'x' }],
      stream: true,
    });
    const chunks = [];
    for await (const c of stream) chunks.push(c);
    assert.equal(chunks.map((c) => c.choices[0]?.delta?.content ?? '').join(''), 'partial reply\n');
    assert.equal(chunks.at(-1).choices[0].finish_reason, 'error');
  });

  it('errors surface as APIError with the status and type', async () => {
    const cases = [
      [() => client.chat.completions.create({ model: 'no-such', messages: [{ role: 'user', content: 'x' }] }), 404, 'model_not_found'],
      [() => client.chat.completions.create({ model: 'echo', messages: [] }), 400, 'invalid_request_error'],
      [() => client.chat.completions.create({ model: 'fail3', messages: [{ role: 'user', content: 'x' }] }), 502, undefined],
      [() => client.chat.completions.create({ model: 'sleeper', messages: [{ role: 'user', content: 'x' }] }), 504, undefined],
      [
        () =>
          new OpenAI({ baseURL: srv.url('/v1'), apiKey: 'olp_wrong', maxRetries: 0 }).chat.completions.create({
            model: 'echo',
            messages: [{ role: 'user', content: 'x' }],
          }),
        401,
        'invalid_or_revoked_key',
      ],
    ];
    for (const [call, status, type] of cases) {
      await assert.rejects(call, (e) => {
        assert.ok(e instanceof OpenAI.APIError, `not an APIError: ${e}`);
        assert.equal(e.status, status, `${e.status} ${e.message}`);
        if (type) assert.equal(e.type, type, JSON.stringify(e.error));
        return true;
      });
    }
  });
});

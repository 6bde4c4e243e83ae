// The whole OpenAI request through the REAL claude CLI (issue 16): images as content
// blocks on stream-json input, response_format's instruction, and the refusals for the
// providers that cannot take what was asked. curl → lighttpd → olp-fcgi → bubblewrap →
// claude (tests/provider-clis) → tests/upstream/fake-anthropic.mjs on 127.0.0.1.
//
// Env (CTest): what harness.mjs needs, plus OLP_PCLI_DIR (tests/provider-clis, whose
// node_modules hold the CLIs).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';

import { startServer, curl, curlStream, chatBody, olpKeys, testRegistry, waitFor } from './harness.mjs';
import { startUpstream as startUpstreamIn } from '../upstream/procs.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const pcliDir = process.env.OLP_PCLI_DIR ?? path.join(here, '..', 'provider-clis');
const claudeBin = path.join(pcliDir, 'node_modules/@anthropic-ai/claude-code/bin/claude.exe');

let anthropic, server;
const children = new Set();

const startUpstream = (file, env = {}) => startUpstreamIn(file, env, children);

before(async () => {
  anthropic = await startUpstream('fake-anthropic.mjs');
  const registry = testRegistry();
  registry.providers.anthropic = { type: 'claude', displayName: 'Claude (fake upstream)',
    models: [{ id: 'claude-fake', created: 1700000000 }] };
  server = await startServer({
    registry,
    // The web server refuses a body above its own limit unread (ADR 0029): raised with
    // max_body_bytes, as docs/deploy.md says to.
    env: { OLP_MAX_BODY_KB: String(16 * 1024) },
    config: {
      auth: { allow_anonymous: false },
      // Warm sandboxes on, as deployed: tool-list files are bound into them too.
      sandbox: { mode: 'bwrap' },
      // Room for an image above the 5 MiB cap (base64: 4/3 of it) in one body.
      server: { max_body_bytes: 16 * 1024 * 1024 },
      providers: {
        anthropic: { bin: claudeBin, timeout_s: 60, credentials: [],
          env: { ANTHROPIC_BASE_URL: anthropic.url, ANTHROPIC_API_KEY: 'sk-ant-fake-key' } },
      },
    },
  });
});

after(async () => {
  await server?.stop();
  for (const c of children) c.kill('SIGTERM');
});

const post = (body) => curl(server, { method: 'POST', path: '/v1/chat/completions', auth: true,
  headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });

// Smallest valid images of each type (a 1x1 PNG; the others are their magic bytes).
const PNG = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==';
const GIF = 'R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7';
const image = (mt, data) => ({ type: 'image_url', image_url: { url: `data:${mt};base64,${data}` } });
const withImages = (...parts) => [{ role: 'user', content: [{ type: 'text', text: 'What is in these?' }, ...parts] }];

test('an image data URL reaches claude as an image block', async () => {
  const r = await post({ model: 'claude-fake', messages: withImages(image('image/png', PNG)) });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.choices[0].message.content, 'I see 1 image(s): image/png.');
  assert.equal(r.json.choices[0].finish_reason, 'stop');
});

test('several images, streamed, in their order', async () => {
  const res = await curlStream(server, { method: 'POST', path: '/v1/chat/completions', auth: true,
    body: { model: 'claude-fake', stream: true, messages: withImages(image('image/gif', GIF), image('image/png', PNG)) } });
  assert.equal(res.status, 200, res.text);
  const text = res.events.filter((e) => e.data !== '[DONE]')
    .map((e) => JSON.parse(e.data).choices[0]?.delta?.content ?? '').join('');
  assert.equal(text, 'I see 2 image(s): image/gif, image/png.');
});

test('text only still goes as before', async () => {
  const r = await post(chatBody('claude-fake', 'hello'));
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.choices[0].message.content, 'Hello from the fake Anthropic server!');
});

test('a remote image URL: 400 naming the param, nothing fetched', async () => {
  const r = await post({ model: 'claude-fake',
    messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: `${anthropic.url}/cat.png` } }] }] });
  assert.equal(r.status, 400, r.text);
  assert.equal(r.json.error.param, 'messages[0].content[0].image_url.url');
  assert.match(r.json.error.message, /data: URL/);
});

test('a provider that takes no images: 400 naming the param', async () => {
  const r = await post({ model: 'echo', messages: withImages(image('image/png', PNG)) });
  assert.equal(r.status, 400, r.text);
  assert.equal(r.json.error.param, 'messages[0].content[1].image_url.url');
  assert.match(r.json.error.message, /takes no images/);
});

test('an image above the cap: 413 naming the param', async () => {
  const big = PNG.slice(0, 12) + 'A'.repeat(Math.ceil((5 * 1024 * 1024 + 1) / 3) * 4 - 12);
  const r = await post({ model: 'claude-fake', messages: withImages(image('image/png', big)) });
  assert.equal(r.status, 413, r.text);
  assert.equal(r.json.error.param, 'messages[0].content[1].image_url.url');
});

test('response_format json_object with claude: the answer is checked', async () => {
  // The fake upstream answers prose: the warning says so, the answer is kept.
  const r = await post(chatBody('claude-fake', 'data please', { response_format: { type: 'json_object' } }));
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.choices[0].message.content, 'Hello from the fake Anthropic server!');
  assert.match(r.headers['x-olp-warning'] ?? '', /not a JSON object/);
});

// ---- tools (function calling): declared through olp-mcp-tools, never run -------------------

const weather = { type: 'function', function: { name: 'get_weather', description: 'The weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } };
const clock = { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {} } } };
const toolBody = (content, extra = {}) => chatBody('claude-fake', content, { tools: [weather, clock], ...extra });
const streamChunks = async (body) => {
  const res = await curlStream(server, { method: 'POST', path: '/v1/chat/completions', auth: true,
    body: { ...body, stream: true } });
  assert.equal(res.status, 200, res.text);
  assert.equal(res.events.at(-1).data, '[DONE]');
  return res.events.slice(0, -1).map((e) => JSON.parse(e.data));
};

test('tools: one call comes back as tool_calls, finish_reason tool_calls', async () => {
  const r = await post(toolBody('What is the weather? call:get_weather'));
  assert.equal(r.status, 200, r.text);
  const choice = r.json.choices[0];
  assert.equal(choice.finish_reason, 'tool_calls');
  assert.equal(choice.message.content, null);
  assert.equal(choice.message.tool_calls.length, 1);
  const call = choice.message.tool_calls[0];
  assert.equal(call.type, 'function');
  assert.match(call.id, /^toolu_fake_/);
  assert.equal(call.function.name, 'get_weather'); // the mcp__olp__ prefix is gone
  assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris' });
  assert.ok(r.json.usage.total_tokens > 0, r.text);
});

test('tools: several calls in one turn', async () => {
  const r = await post(toolBody('call:get_weather,get_time'));
  assert.equal(r.status, 200, r.text);
  const calls = r.json.choices[0].message.tool_calls;
  assert.deepEqual(calls.map((c) => c.function.name), ['get_weather', 'get_time']);
  assert.deepEqual(calls.map((c) => JSON.parse(c.function.arguments)), [{ city: 'Paris' }, { n: 1 }]);
  assert.notEqual(calls[0].id, calls[1].id);
});

test('tools: streamed as tool_calls deltas that assemble into the calls', async () => {
  const cs = await streamChunks(toolBody('call:get_weather,get_time'));
  const calls = [];
  for (const c of cs) {
    for (const d of c.choices[0]?.delta?.tool_calls ?? []) {
      calls[d.index] ??= { id: '', name: '', args: '' };
      if (d.id) calls[d.index].id = d.id;
      if (d.function?.name) calls[d.index].name = d.function.name;
      calls[d.index].args += d.function?.arguments ?? '';
    }
  }
  assert.equal(cs[0].choices[0].delta.role, 'assistant');
  assert.deepEqual(calls.map((c) => c.name), ['get_weather', 'get_time']);
  assert.deepEqual(JSON.parse(calls[0].args), { city: 'Paris' });
  assert.deepEqual(JSON.parse(calls[1].args), { n: 1 });
  assert.ok(calls.every((c) => c.id.startsWith('toolu_fake_')));
  const finishes = cs.map((c) => c.choices[0]?.finish_reason).filter(Boolean);
  assert.deepEqual(finishes, ['tool_calls']);
});

test('tools: an answer without a call is still text', async () => {
  const r = await post(toolBody('just say hello'));
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.choices[0].message.content, 'Hello from the fake Anthropic server!');
  assert.equal(r.json.choices[0].message.tool_calls, undefined);
  assert.equal(r.json.choices[0].finish_reason, 'stop');
});

test('tools: a tool result turn reaches the model as text it answers', async () => {
  const r = await post({ model: 'claude-fake', tools: [weather], messages: [
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
      function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '22 C and sunny' },
  ] });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.choices[0].message.content, 'Tool said: 22 C and sunny');
  assert.equal(r.json.choices[0].finish_reason, 'stop');
});

test('tool_choice required: the model is told to call one', async () => {
  const r = await post(toolBody('no call asked here', { tool_choice: 'required' }));
  assert.equal(r.json.choices[0].finish_reason, 'tool_calls', r.text);
  // The fake model calls the first tool claude lists (claude orders them its own way).
  assert.ok(['get_weather', 'get_time'].includes(r.json.choices[0].message.tool_calls[0].function.name), r.text);
});

test('tool_choice named: the model is told which', async () => {
  const r = await post(toolBody('no call asked here', { tool_choice: { type: 'function', function: { name: 'get_time' } } }));
  assert.equal(r.json.choices[0].finish_reason, 'tool_calls', r.text);
  assert.deepEqual(r.json.choices[0].message.tool_calls.map((c) => c.function.name), ['get_time']);
});

test('tool_choice none: no tools are declared, the answer is text', async () => {
  const r = await post(toolBody('call:get_weather', { tool_choice: 'none' }));
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.choices[0].message.tool_calls, undefined);
  assert.equal(r.json.choices[0].message.content, 'Hello from the fake Anthropic server!');
});

test('tools on a provider that cannot take them: 400 naming tools', async () => {
  const r = await post({ model: 'echo', tools: [weather], messages: [{ role: 'user', content: 'x' }] });
  assert.equal(r.status, 400, r.text);
  assert.equal(r.json.error.param, 'tools');
  assert.match(r.json.error.message, /cannot take tools/);
});

test('the official openai SDK: a whole tool round trip, and a streamed call from deltas', async () => {
  const client = new OpenAI({ baseURL: server.url('/v1'), apiKey: server.token, maxRetries: 0, timeout: 60000 });
  const messages = [{ role: 'user', content: 'Weather in Paris? call:get_weather' }];
  const first = await client.chat.completions.create({ model: 'claude-fake', messages, tools: [weather] });
  assert.equal(first.choices[0].finish_reason, 'tool_calls');
  const call = first.choices[0].message.tool_calls[0];
  assert.equal(call.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris' });
  messages.push(first.choices[0].message, { role: 'tool', tool_call_id: call.id, content: 'sunny, 24 C' });
  const second = await client.chat.completions.create({ model: 'claude-fake', messages, tools: [weather] });
  assert.equal(second.choices[0].finish_reason, 'stop');
  assert.equal(second.choices[0].message.content, 'Tool said: sunny, 24 C');

  // Streamed, assembled by the SDK's own helper.
  const runner = client.chat.completions.stream({ model: 'claude-fake', tools: [weather, clock],
    messages: [{ role: 'user', content: 'call:get_weather,get_time' }] });
  const done = await runner.finalChatCompletion();
  assert.equal(done.choices[0].finish_reason, 'tool_calls');
  assert.deepEqual(done.choices[0].message.tool_calls.map((c) => [c.function.name, JSON.parse(c.function.arguments)]),
    [['get_weather', { city: 'Paris' }], ['get_time', { n: 1 }]]);
});

// A stop sequence that ends the answer at once (OLP ends the run there, before claude's
// result line) still counts: without it, a key's tokens_per_day could be dodged with a
// stop that always matches. The prompt's count is claude's own (its message_start), the
// answer's an estimate of what was written; the ledger row has both.
test('a run cut at a stop sequence still counts its tokens, in the answer and the ledger', async () => {
  // A key of its own, so that its row is told apart from the rows of the tests before,
  // which may still be landing (a row is written once its answer is out).
  const k = olpKeys(server.home, 'keygen', '--name=stop sequence', '--tier=owner');
  const mine = async () =>
    (await curl(server, { path: '/v1/usage?recent=200', auth: true })).json.recent.filter((row) => row.key_id === k.id);
  const r = await curl(server, { method: 'POST', path: '/v1/chat/completions', auth: `Bearer ${k.token}`,
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: 'claude-fake', stop: ['from'], messages: [{ role: 'user', content: 'Say hello' }] }) });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.choices[0].message.content, 'Hello ');
  assert.equal(r.json.choices[0].finish_reason, 'stop');
  assert.equal(r.json.usage.prompt_tokens, 10, r.text); // the fake upstream's input_tokens
  assert.ok(r.json.usage.completion_tokens >= 1, r.text);
  assert.equal(r.json.usage.total_tokens, r.json.usage.prompt_tokens + r.json.usage.completion_tokens);
  let rows;
  assert.ok(await waitFor(async () => (rows = await mine()).length > 0, { timeoutMs: 10000, stepMs: 100 }), 'no ledger row');
  assert.equal(rows.length, 1, JSON.stringify(rows));
  const row = rows[0];
  assert.equal(row.status, 200, JSON.stringify(row));
  assert.equal(row.prompt_tokens, 10, JSON.stringify(row));
  assert.equal(row.completion_tokens, r.json.usage.completion_tokens, JSON.stringify(row));
});

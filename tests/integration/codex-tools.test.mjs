// A client's function tools through the REAL codex CLI (ADR 0019, "codex"; issue 24 item
// 4): curl → lighttpd → olp-fcgi → bubblewrap → codex (tests/provider-clis) → the worker's
// forwarder → tests/upstream/fake-openai.mjs on 127.0.0.1. The tools are declared to
// codex through olp-mcp-tools; the model's calls come back as tool_calls, and codex is
// stopped before it asks the model again: one upstream request per answer.
//
// Env (CTest): what harness.mjs needs, plus OLP_PCLI_DIR (tests/provider-clis, whose
// node_modules hold the CLIs).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';

import { startServer, curl, curlStream, chatBody, testRegistry } from './harness.mjs';
import { startUpstream as startUpstreamIn } from '../upstream/procs.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const pcliDir = process.env.OLP_PCLI_DIR ?? path.join(here, '..', 'provider-clis');
const codexJs = path.join(pcliDir, 'node_modules/@openai/codex/bin/codex.js');
const CODEX_TEXT = 'Hello from the fake OpenAI server!';
const MODELS = ['gpt-t-one', 'gpt-t-two', 'gpt-t-stream', 'gpt-t-none', 'gpt-t-result', 'gpt-t-choice',
  'gpt-t-shell', 'gpt-t-sdk'];

let openai, server, work;
const children = new Set();

before(async () => {
  assert.ok(fs.existsSync(codexJs), 'run `npm ci` in tests/provider-clis first');
  work = fs.mkdtempSync(path.join(os.tmpdir(), 'olp-codex-tools-'));
  openai = await startUpstreamIn('fake-openai.mjs', {}, children);
  const toml = path.join(work, 'codex-config.toml');
  fs.writeFileSync(toml, ['model_provider = "fake"', '', '[model_providers.fake]', 'name = "fake"',
    `base_url = "${openai.url}/v1"`, 'wire_api = "responses"', 'env_key = "OPENAI_API_KEY"', '',
    '[analytics]', 'enabled = false', ''].join('\n'));
  const registry = testRegistry();
  registry.providers.openai = { type: 'codex', displayName: 'Codex (fake upstream)',
    models: MODELS.map((id) => ({ id, created: 1700000000 })) };
  server = await startServer({
    registry,
    config: {
      auth: { allow_anonymous: false },
      // Warm sandboxes on, as deployed: tool-list files are bound into them too.
      sandbox: { mode: 'bwrap' },
      providers: {
        // Upstream mode, the default: the run reaches the fake upstream only through the
        // worker's forwarder, which counts every request it carries.
        openai: { bin: codexJs, timeout_s: 60, credentials: [], config_toml: toml, model_provider: 'fake',
          network: { upstream: `${openai.url}/v1` }, env: { OPENAI_API_KEY: 'sk-fake-key' } },
      },
    },
  });
});

after(async () => {
  await server?.stop();
  for (const c of children) c.kill('SIGTERM');
  if (work) fs.rmSync(work, { recursive: true, force: true });
});

const post = (body) => curl(server, { method: 'POST', path: '/v1/chat/completions', auth: true,
  headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
const upstreamFor = async (model) =>
  (await (await fetch(`${openai.url}/_requests`)).json()).filter((q) => q.model === model);

const weather = { type: 'function', function: { name: 'get_weather', description: 'The weather of a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } };
const clock = { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {} } } };
const byName = (a, b) => a.function.name.localeCompare(b.function.name);
const toolBody = (model, content, extra = {}) => chatBody(model, content, { tools: [weather, clock], ...extra });

test('codex tools: one call comes back as tool_calls, finish_reason tool_calls, one upstream request', async () => {
  const r = await post(toolBody('gpt-t-one', 'What is the weather? call:get_weather'));
  assert.equal(r.status, 200, r.text);
  const choice = r.json.choices[0];
  assert.equal(choice.finish_reason, 'tool_calls');
  assert.equal(choice.message.content, null);
  assert.equal(choice.message.tool_calls.length, 1);
  const call = choice.message.tool_calls[0];
  assert.equal(call.type, 'function');
  assert.match(call.id, /^call_[0-9a-f]+_0$/);
  assert.equal(call.function.name, 'get_weather'); // codex's namespace is not the client's
  assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris' });
  assert.ok(r.json.usage.total_tokens > 0, r.text);
  assert.equal((await upstreamFor('gpt-t-one')).length, 1, 'codex asked the model again');
});

test('codex tools: several calls in one turn', async () => {
  const r = await post(toolBody('gpt-t-two', 'call:get_weather,get_time'));
  assert.equal(r.status, 200, r.text);
  // In the order codex starts them, which for calls of one answer is not always the
  // model's: compared by name.
  const calls = [...r.json.choices[0].message.tool_calls].sort(byName);
  assert.deepEqual(calls.map((c) => c.function.name), ['get_time', 'get_weather']);
  assert.deepEqual(calls.map((c) => JSON.parse(c.function.arguments)), [{ n: 1 }, { city: 'Paris' }]);
  assert.notEqual(calls[0].id, calls[1].id);
  assert.equal((await upstreamFor('gpt-t-two')).length, 1);
});

test('codex tools: streamed as tool_calls deltas that assemble into the calls', async () => {
  const res = await curlStream(server, { method: 'POST', path: '/v1/chat/completions', auth: true,
    body: { ...toolBody('gpt-t-stream', 'call:get_weather,get_time'), stream: true } });
  assert.equal(res.status, 200, res.text);
  assert.equal(res.events.at(-1).data, '[DONE]');
  const cs = res.events.slice(0, -1).map((e) => JSON.parse(e.data));
  const calls = [];
  for (const c of cs) {
    for (const d of c.choices[0]?.delta?.tool_calls ?? []) {
      calls[d.index] ??= { id: '', name: '', args: '', type: '' };
      if (d.id) calls[d.index].id = d.id;
      if (d.type) calls[d.index].type = d.type;
      if (d.function?.name) calls[d.index].name = d.function.name;
      calls[d.index].args += d.function?.arguments ?? '';
    }
  }
  assert.equal(cs[0].choices[0].delta.role, 'assistant');
  assert.equal(calls.length, 2);
  const byCall = Object.fromEntries(calls.map((c) => [c.name, c]));
  assert.deepEqual(Object.keys(byCall).sort(), ['get_time', 'get_weather']);
  assert.deepEqual(calls.map((c) => c.type), ['function', 'function']);
  assert.deepEqual(JSON.parse(byCall.get_weather.args), { city: 'Paris' });
  assert.deepEqual(JSON.parse(byCall.get_time.args), { n: 1 });
  assert.ok(calls.every((c) => /^call_[0-9a-f]+_\d$/.test(c.id)), JSON.stringify(calls));
  const finishes = cs.map((c) => c.choices[0]?.finish_reason).filter(Boolean);
  assert.deepEqual(finishes, ['tool_calls']);
  assert.equal((await upstreamFor('gpt-t-stream')).length, 1);
});

test('codex tools: an answer without a call is still text', async () => {
  const r = await post(toolBody('gpt-t-none', 'just say hello'));
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.choices[0].message.content, CODEX_TEXT);
  assert.equal(r.json.choices[0].message.tool_calls, undefined);
  assert.equal(r.json.choices[0].finish_reason, 'stop');
});

test('codex tools: a tool result turn reaches the model as text it answers', async () => {
  const r = await post({ model: 'gpt-t-result', tools: [weather], messages: [
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
      function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '22 C and sunny' },
  ] });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.choices[0].message.content, 'Tool said: 22 C and sunny');
  assert.equal(r.json.choices[0].finish_reason, 'stop');
});

test('codex tools: tool_choice named and required are told to the model; none declares nothing', async () => {
  let r = await post(toolBody('gpt-t-choice', 'no call asked here',
    { tool_choice: { type: 'function', function: { name: 'get_time' } } }));
  assert.equal(r.json.choices[0].finish_reason, 'tool_calls', r.text);
  assert.deepEqual(r.json.choices[0].message.tool_calls.map((c) => c.function.name), ['get_time']);
  r = await post(toolBody('gpt-t-choice', 'no call asked here', { tool_choice: 'required' }));
  assert.equal(r.json.choices[0].finish_reason, 'tool_calls', r.text);
  assert.equal(r.json.choices[0].message.tool_calls.length, 1);
  r = await post(toolBody('gpt-t-choice', 'call:get_weather', { tool_choice: 'none' }));
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.choices[0].message.tool_calls, undefined);
  assert.equal(r.json.choices[0].message.content, CODEX_TEXT);
});

test('codex tools: a call of a tool named like a shell runs nothing', async () => {
  // The client declares "exec_command" (codex's own shell tool's name) and the model asks
  // it to send a request for this model upstream, through the run's forwarder: had
  // anything run it, the upstream would count a second request. The call comes back to
  // the client as it is, and the upstream saw one request.
  const body = `'{"model":"gpt-t-shell","input":"pwned"}'`;
  const cmd = `curl -s -X POST -H 'content-type: application/json' -d ${body} http://127.0.0.1:4180/responses`;
  const args = Buffer.from(JSON.stringify({ cmd })).toString('base64url');
  const shell = { type: 'function', function: { name: 'exec_command', description: 'Run a shell command',
    parameters: { type: 'object', properties: { cmd: { type: 'string' } } } } };
  const r = await post(chatBody('gpt-t-shell', `call:exec_command=${args}`, { tools: [shell] }));
  assert.equal(r.status, 200, r.text);
  const calls = r.json.choices[0].message.tool_calls;
  assert.deepEqual(calls.map((c) => c.function.name), ['exec_command']);
  assert.deepEqual(JSON.parse(calls[0].function.arguments), { cmd });
  assert.equal((await upstreamFor('gpt-t-shell')).length, 1, 'something ran the command');
});

test('the official openai SDK: a whole tool round trip through codex', async () => {
  const client = new OpenAI({ baseURL: server.url('/v1'), apiKey: server.token, maxRetries: 0, timeout: 60000 });
  const messages = [{ role: 'user', content: 'Weather in Paris? call:get_weather' }];
  const first = await client.chat.completions.create({ model: 'gpt-t-sdk', messages, tools: [weather] });
  assert.equal(first.choices[0].finish_reason, 'tool_calls');
  const call = first.choices[0].message.tool_calls[0];
  assert.equal(call.function.name, 'get_weather');
  messages.push(first.choices[0].message, { role: 'tool', tool_call_id: call.id, content: 'sunny, 24 C' });
  const second = await client.chat.completions.create({ model: 'gpt-t-sdk', messages, tools: [weather] });
  assert.equal(second.choices[0].finish_reason, 'stop');
  assert.equal(second.choices[0].message.content, 'Tool said: sunny, 24 C');
});

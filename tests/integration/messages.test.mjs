// The Anthropic Messages API (issue 24): POST /v1/messages and /v1/messages/count_tokens
// behind a real lighttpd, driven by the official @anthropic-ai/sdk, by curl (each event of a
// stream against Anthropic's published order, every refusal in Anthropic's error shape)
// and by the real Claude Code as the CLIENT (ANTHROPIC_BASE_URL pointed at OLP), answered
// by a command provider and by OLP's claude provider against tests/upstream/fake-anthropic.mjs.
//
// Env (CTest): what harness.mjs needs, OLP_KEYS (olp-keys), and OLP_PCLI_DIR
// (tests/provider-clis, whose node_modules hold the claude CLI). Without the CLI the tests
// that need it skip, saying why.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import Anthropic from '@anthropic-ai/sdk';

import { startServer, curl, curlStream, makeHome, olpKeys, testRegistry, waitFor } from './harness.mjs';
import { startUpstream as startUpstreamIn } from '../upstream/procs.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const pcliDir = process.env.OLP_PCLI_DIR ?? path.join(here, '..', 'provider-clis');
const claudeBin = path.join(pcliDir, 'node_modules/@anthropic-ai/claude-code/bin/claude.exe');
const haveClaude = fs.existsSync(claudeBin);
const noClaude = haveClaude ? false : `the claude CLI is not installed (${claudeBin}: npm ci in tests/provider-clis)`;

let upstream, server, guest, sdk;
const children = new Set();

const HELLO = 'Hello from the fake Anthropic server!';

before(async () => {
  upstream = await startUpstreamIn('fake-anthropic.mjs', {}, children);
  const registry = testRegistry();
  // Claude Code's own model ids reach the fake model through alias patterns, as the
  // default registry's "claude-opus-*" do.
  registry.providers.anthropic = {
    type: 'claude', displayName: 'Claude (fake upstream)',
    models: [{ id: 'claude-fake', created: 1700000000 }, { id: 'claude-fake-maxtok', created: 1700000000 }],
    aliases: { 'claude-opus-*': 'claude-fake', 'claude-sonnet-*': 'claude-fake', 'claude-haiku-*': 'claude-fake' },
  };
  // Silent for 1.2 s, then one word: heartbeats (pings) come first.
  registry.providers.thinker = { type: 'command', displayName: 'thinker', timeout_s: 20, network: false,
    argv: ['/bin/sh', '-c', 'cat >/dev/null; sleep 1.2; printf late'], models: [{ id: 'thinker', created: 1700000000 }] };
  const dirs = makeHome({
    registry,
    config: {
      auth: { allow_anonymous: false },
      sandbox: { mode: 'bwrap', warm: false },
      streaming: { heartbeat_interval_ms: 300 },
      providers: {
        anthropic: { bin: claudeBin, timeout_s: 60, credentials: [],
          env: { ANTHROPIC_BASE_URL: upstream.url, ANTHROPIC_API_KEY: 'sk-ant-fake-key' } },
      },
    },
  });
  guest = olpKeys(dirs.home, 'keygen', '--name=messages guest', '--quota-rpd=1');
  server = await startServer({ dirs });
  sdk = new Anthropic({ baseURL: server.url(''), apiKey: server.token, maxRetries: 0 });
});

after(async () => {
  await server?.stop();
  for (const c of children) c.kill('SIGTERM');
});

const post = (body, { p = '/v1/messages', headers = {}, auth = true } = {}) =>
  curl(server, { method: 'POST', path: p, auth, headers: { 'Content-Type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body) });

const msg = (model, content, extra = {}) => ({ model, max_tokens: 256, messages: [{ role: 'user', content }], ...extra });

// A stream's events as [{event, data}], the event name checked against data.type.
async function events(body, opts = {}) {
  const res = await curlStream(server, { method: 'POST', path: opts.path ?? '/v1/messages', auth: opts.auth ?? true,
    headers: opts.headers ?? {}, body: { ...body, stream: true } });
  assert.equal(res.status, 200, res.text);
  assert.match(res.headers['content-type'], /^text\/event-stream/);
  const out = [];
  for (const block of res.text.split('\n\n').filter((b) => b.trim())) {
    const lines = block.split('\n');
    const ev = lines.find((l) => l.startsWith('event: '))?.slice(7);
    const data = JSON.parse(lines.filter((l) => l.startsWith('data: ')).map((l) => l.slice(6)).join('\n'));
    assert.equal(ev, data.type, `event ${ev} carries type ${data.type}`);
    out.push({ event: ev, data });
  }
  return out;
}

// Anthropic's published order: message_start, ping?, then per block start → delta* → stop,
// message_delta, message_stop. Checked event by event; returns the blocks, assembled.
function checkOrder(evs) {
  const names = evs.map((e) => e.event);
  assert.equal(names[0], 'message_start', names.join(' '));
  const m = evs[0].data.message;
  assert.match(m.id, /^msg_/);
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.deepEqual(m.content, []);
  assert.equal(m.stop_reason, null);
  const blocks = [];
  let open = null;
  let i = 1;
  for (; i < evs.length && evs[i].event !== 'message_delta'; i++) {
    const { event, data } = evs[i];
    if (event === 'ping') continue;
    if (event === 'content_block_start') {
      assert.equal(open, null, `block ${data.index} starts inside block ${open}`);
      assert.equal(data.index, blocks.length, 'blocks are numbered 0, 1, …');
      open = data.index;
      blocks.push({ ...data.content_block, json: '' });
    } else if (event === 'content_block_delta') {
      assert.equal(data.index, open, 'a delta belongs to the open block');
      const b = blocks[open];
      if (b.type === 'text') {
        assert.equal(data.delta.type, 'text_delta');
        b.text += data.delta.text;
      } else {
        assert.equal(data.delta.type, 'input_json_delta');
        b.json += data.delta.partial_json;
      }
    } else if (event === 'content_block_stop') {
      assert.equal(data.index, open);
      open = null;
    } else {
      assert.fail(`unexpected ${event} before message_delta: ${names.join(' ')}`);
    }
  }
  assert.equal(open, null, 'every block stopped before message_delta');
  assert.deepEqual(names.slice(i), ['message_delta', 'message_stop'], names.join(' '));
  const delta = evs[i].data;
  for (const k of ['input_tokens', 'output_tokens']) assert.equal(typeof delta.usage[k], 'number');
  return { blocks, delta: delta.delta, usage: delta.usage };
}

// ---- the official SDK, unchanged ------------------------------------------------------------

test('SDK messages.create: a command provider answers a Message', async () => {
  const m = await sdk.messages.create(msg('echo', 'hello there'));
  assert.match(m.id, /^msg_/);
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.equal(m.model, 'echo');
  assert.deepEqual(m.content, [{ type: 'text', text: 'hello there' }]);
  assert.equal(m.stop_reason, 'end_turn');
  assert.equal(m.stop_sequence, null);
  assert.equal(typeof m.usage.input_tokens, 'number');
  assert.equal(typeof m.usage.output_tokens, 'number');
});

test('SDK messages.stream: the text arrives as deltas, the final message whole', async () => {
  const stream = sdk.messages.stream(msg('ticker', 'go'));
  const deltas = [];
  stream.on('text', (t) => deltas.push(t));
  const m = await stream.finalMessage();
  assert.ok(deltas.length >= 2, `deltas: ${JSON.stringify(deltas)}`);
  assert.equal(m.content[0].type, 'text');
  assert.equal(m.content[0].text, deltas.join(''));
  assert.match(m.content[0].text, /^tick 1\ntick 2\n.*tick 5\n?$/s);
  assert.equal(m.stop_reason, 'end_turn');
});

test('SDK against the claude provider: create and stream', async () => {
  const m = await sdk.messages.create(msg('claude-fake', 'hello'));
  assert.deepEqual(m.content, [{ type: 'text', text: HELLO }]);
  assert.equal(m.usage.input_tokens, 10);
  assert.equal(m.usage.output_tokens, 6);
  const s = await sdk.messages.stream(msg('claude-fake', 'hello')).finalMessage();
  assert.equal(s.content[0].text, HELLO);
  assert.equal(s.stop_reason, 'end_turn');
});

test('SDK: a Claude Code model id (claude-opus-5-5) reaches the registry model by its pattern', async () => {
  const m = await sdk.messages.create(msg('claude-opus-5-5', 'hello'));
  assert.equal(m.model, 'claude-opus-5-5'); // the model as asked
  assert.equal(m.content[0].text, HELLO);
});

// ---- tools -------------------------------------------------------------------------------------

const weather = { name: 'get_weather', description: 'The weather in a city',
  input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } };
const clock = { name: 'get_time', input_schema: { type: 'object', properties: {} } };

test('tools: calls come back as tool_use blocks, stop_reason tool_use (create)', async () => {
  const m = await sdk.messages.create(msg('claude-fake', 'call:get_weather,get_time', { tools: [weather, clock] }));
  assert.equal(m.stop_reason, 'tool_use');
  assert.deepEqual(m.content.map((b) => [b.type, b.name]), [['tool_use', 'get_weather'], ['tool_use', 'get_time']]);
  assert.deepEqual(m.content.map((b) => b.input), [{ city: 'Paris' }, { n: 1 }]);
  assert.ok(m.content.every((b) => /^toolu_fake_/.test(b.id)), JSON.stringify(m.content));
});

test('tools streamed: each call its own tool_use block of input_json_delta pieces, in order', async () => {
  const evs = await events(msg('claude-fake', 'call:get_weather,get_time', { tools: [weather, clock] }));
  const { blocks, delta } = checkOrder(evs);
  assert.deepEqual(blocks.map((b) => [b.type, b.name]), [['tool_use', 'get_weather'], ['tool_use', 'get_time']]);
  assert.deepEqual(blocks.map((b) => b.input), [{}, {}]);
  assert.deepEqual(blocks.map((b) => JSON.parse(b.json)), [{ city: 'Paris' }, { n: 1 }]);
  assert.deepEqual(delta, { stop_reason: 'tool_use', stop_sequence: null });
  const s = await sdk.messages.stream(msg('claude-fake', 'call:get_weather', { tools: [weather] })).finalMessage();
  assert.deepEqual(s.content.map((b) => [b.type, b.name, b.input]), [['tool_use', 'get_weather', { city: 'Paris' }]]);
});

test('tools: the tool_result turn reaches the model, which answers it', async () => {
  const m = await sdk.messages.create({ model: 'claude-fake', max_tokens: 256, tools: [weather], messages: [
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: [{ type: 'text', text: 'Let me look.' },
      { type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: { city: 'Paris' } }] },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: [{ type: 'text', text: '22 C and sunny' }] }] },
  ] });
  assert.deepEqual(m.content, [{ type: 'text', text: 'Tool said: 22 C and sunny' }]);
  assert.equal(m.stop_reason, 'end_turn');
});

test('tool_choice any: the model is told to call one', async () => {
  const m = await sdk.messages.create(msg('claude-fake', 'no call asked', { tools: [weather], tool_choice: { type: 'any' } }));
  assert.equal(m.stop_reason, 'tool_use', JSON.stringify(m));
  assert.equal(m.content[0].name, 'get_weather');
});

// ---- the event order, event by event -----------------------------------------------------------

test('a streamed text answer, event by event', async () => {
  const evs = await events(msg('echo', 'hello stream'));
  assert.equal(evs[1].event, 'ping', 'a ping follows message_start');
  const { blocks, delta, usage } = checkOrder(evs);
  assert.deepEqual(blocks, [{ type: 'text', text: 'hello stream', json: '' }]);
  assert.deepEqual(delta, { stop_reason: 'end_turn', stop_sequence: null });
  assert.equal(usage.output_tokens, 0); // a local command spends no upstream tokens
});

test('heartbeats are pings, after message_start, before the answer', async () => {
  const evs = await events(msg('thinker', 'x'));
  const names = evs.map((e) => e.event);
  assert.equal(names[0], 'message_start');
  assert.ok(names.filter((n) => n === 'ping').length >= 2, names.join(' '));
  const { blocks } = checkOrder(evs);
  assert.equal(blocks[0].text, 'late');
});

test('stop_sequences: the answer ends before the sequence, stop_reason stop_sequence', async () => {
  const body = msg('echo', 'one two STOP three', { stop_sequences: ['STOP'] });
  const m = await sdk.messages.create(body);
  assert.deepEqual(m.content, [{ type: 'text', text: 'one two ' }]);
  assert.equal(m.stop_reason, 'stop_sequence');
  assert.equal(m.stop_sequence, 'STOP');
  const { blocks, delta } = checkOrder(await events(body));
  assert.equal(blocks[0].text, 'one two ');
  assert.deepEqual(delta, { stop_reason: 'stop_sequence', stop_sequence: 'STOP' });
});

test('max_tokens reached upstream: stop_reason max_tokens', async () => {
  const m = await sdk.messages.create(msg('claude-fake-maxtok', 'hello'));
  assert.equal(m.stop_reason, 'max_tokens');
});

test('a failure after the stream began: an error event, nothing after it', async () => {
  const evs = await events(msg('partial-fail', 'x'));
  const names = evs.map((e) => e.event);
  assert.equal(names[0], 'message_start');
  assert.equal(names.at(-1), 'error', names.join(' '));
  assert.ok(!names.includes('message_stop'), names.join(' '));
  const err = evs.at(-1).data;
  assert.equal(err.type, 'error');
  assert.equal(err.error.type, 'api_error');
  assert.match(err.error.message, /\S/);
});

test('an image (base64 source) reaches claude as an image block', async () => {
  const PNG = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==';
  const m = await sdk.messages.create(msg('claude-fake', [{ type: 'text', text: 'What is this?' },
    { type: 'image', source: { type: 'base64', media_type: 'image/png', data: PNG } }]));
  assert.equal(m.content[0].text, 'I see 1 image(s): image/png.');
});

// ---- refusals, in Anthropic's shape ---------------------------------------------------------------

const isAnthropicError = (r, status, type) => {
  assert.equal(r.status, status, r.text);
  assert.deepEqual(Object.keys(r.json).sort(), ['error', 'type']);
  assert.equal(r.json.type, 'error');
  assert.equal(r.json.error.type, type, r.text);
  assert.equal(typeof r.json.error.message, 'string');
};

const BAD = [
  // [what, body, message start]
  ['no max_tokens', { model: 'echo', messages: [{ role: 'user', content: 'x' }] }, /^max_tokens: required/],
  ['max_tokens 0', msg('echo', 'x', { max_tokens: 0 }), /^max_tokens: must be a positive integer/],
  ['no model', { max_tokens: 5, messages: [{ role: 'user', content: 'x' }] }, /^model: /],
  ['an unknown field', msg('echo', 'x', { frequency_penalty: 1 }), /^frequency_penalty: unknown field/],
  ['mcp_servers', msg('echo', 'x', { mcp_servers: [{ type: 'url', url: 'http://x', name: 'x' }] }), /^mcp_servers: not supported/],
  ['messages empty', { model: 'echo', max_tokens: 5, messages: [] }, /^messages: must be a non-empty array/],
  ['a bad role', { model: 'echo', max_tokens: 5, messages: [{ role: 'tool', content: 'x' }] }, /^messages\.0\.role: /],
  ['content a number', { model: 'echo', max_tokens: 5, messages: [{ role: 'user', content: 5 }] }, /^messages\.0\.content: /],
  ['a document block', msg('echo', [{ type: 'text', text: 'a' }, { type: 'document', source: {} }]), /^messages\.0\.content\.1: .*document/],
  ['an image by URL', msg('echo', [{ type: 'image', source: { type: 'url', url: 'https://example.com/a.png' } }]),
    /^messages\.0\.content\.0\.source\.type: url image sources are not fetched/],
  ['bad base64', msg('echo', [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'x!' } }]),
    /^messages\.0\.content\.0\.source\.data: .*base64/],
  ['a media type', msg('echo', [{ type: 'image', source: { type: 'base64', media_type: 'image/tiff', data: 'AAAA' } }]),
    /^messages\.0\.content\.0\.source\.media_type: /],
  ['tool_result without id', msg('echo', [{ type: 'tool_result', content: 'x' }]), /^messages\.0\.content\.0\.tool_use_id: /],
  ['tool_use input not an object', { model: 'echo', max_tokens: 5, messages: [{ role: 'user', content: 'x' },
    { role: 'assistant', content: [{ type: 'tool_use', id: 't', name: 'f', input: 'x' }] }] }, /^messages\.1\.content\.0\.input: must be an object/],
  ['system a number', msg('echo', 'x', { system: 3 }), /^system: /],
  ['system a non-text block', msg('echo', 'x', { system: [{ type: 'image' }] }), /^system\.0: must be a text block/],
  ['stop_sequences not strings', msg('echo', 'x', { stop_sequences: [1] }), /^stop_sequences\.0: /],
  ['stream not a boolean', msg('echo', 'x', { stream: 'yes' }), /^stream: must be a boolean/],
  ['temperature out of range', msg('echo', 'x', { temperature: 3 }), /^temperature: /],
  ['thinking not an object', msg('echo', 'x', { thinking: 'on' }), /^thinking: must be an object/],
  ['metadata with an unknown key', msg('echo', 'x', { metadata: { user: 'x' } }), /^metadata: unknown field user/],
  ['a server tool', msg('echo', 'x', { tools: [{ type: 'web_search_20250305', name: 'web_search' }] }), /^tools\.0: server tools/],
  ['a tool without input_schema', msg('echo', 'x', { tools: [{ name: 'f' }] }), /^tools\.0\.input_schema: /],
  ['a bad tool name', msg('echo', 'x', { tools: [{ name: 'a b', input_schema: {} }] }), /^tools\.0\.name: /],
  ['tool_choice a tool not declared', msg('echo', 'x', { tools: [weather], tool_choice: { type: 'tool', name: 'nope' } }),
    /^tool_choice\.name: must name one of the tools/],
  ['tool_choice any without tools', msg('echo', 'x', { tool_choice: { type: 'any' } }), /^tool_choice: asks for a tool call/],
  ['not JSON', '{"model":', /^Invalid JSON body/],
];

test('bad input per field: 400 in Anthropic\'s shape, the message naming the field', async () => {
  for (const [what, body, re] of BAD) {
    const r = await post(body);
    isAnthropicError(r, 400, 'invalid_request_error');
    assert.match(r.json.error.message, re, `${what}: ${r.json.error.message}`);
  }
});

test('tools on a provider that takes none: 400 naming the field', async () => {
  const r = await post(msg('echo', 'x', { tools: [weather] }));
  isAnthropicError(r, 400, 'invalid_request_error');
  assert.match(r.json.error.message, /tools/);
});

test('an unknown model: 404 not_found_error', async () => {
  const r = await post(msg('no-such-model', 'x'));
  isAnthropicError(r, 404, 'not_found_error');
  assert.match(r.json.error.message, /no-such-model/);
  await assert.rejects(sdk.messages.create(msg('no-such-model', 'x')), Anthropic.NotFoundError);
});

test('a bad key: 401 authentication_error, by x-api-key and by Bearer', async () => {
  isAnthropicError(await post(msg('echo', 'x'), { auth: false, headers: { 'x-api-key': 'olp_wrong' } }), 401, 'authentication_error');
  isAnthropicError(await post(msg('echo', 'x'), { auth: 'Bearer olp_wrong' }), 401, 'authentication_error');
  isAnthropicError(await post(msg('echo', 'x'), { auth: false }), 401, 'authentication_error');
  const bad = new Anthropic({ baseURL: server.url(''), apiKey: 'olp_wrong', maxRetries: 0 });
  await assert.rejects(bad.messages.create(msg('echo', 'x')), Anthropic.AuthenticationError);
  isAnthropicError(await post(msg('echo', 'x'), { p: '/v1/messages/count_tokens', auth: false }), 401, 'authentication_error');
});

test('the key by x-api-key or Bearer; anthropic-version, anthropic-beta and ?beta=true accepted', async () => {
  const headers = { 'anthropic-version': '2023-06-01', 'anthropic-beta': 'claude-code-20250219,interleaved-thinking-2025-05-14' };
  const a = await post(msg('echo', 'by x-api-key'), { p: '/v1/messages?beta=true', auth: false,
    headers: { ...headers, 'x-api-key': server.token } });
  assert.equal(a.status, 200, a.text);
  assert.equal(a.json.content[0].text, 'by x-api-key');
  const b = await post(msg('echo', 'by bearer'), { headers });
  assert.equal(b.status, 200, b.text);
  assert.equal(b.json.content[0].text, 'by bearer');
  const bearer = new Anthropic({ baseURL: server.url(''), authToken: server.token, apiKey: null, maxRetries: 0 });
  assert.equal((await bearer.messages.create(msg('echo', 'sdk bearer'))).content[0].text, 'sdk bearer');
});

test('what Claude Code sends and OLP ignores on purpose is accepted', async () => {
  const r = await post({ ...msg('echo', 'accepted'), thinking: { type: 'adaptive', display: 'omitted' },
    context_management: { edits: [{ type: 'clear_thinking_20251015', keep: 'all' }] }, output_config: { effort: 'medium' },
    temperature: 1, top_p: 0.9, top_k: 5, metadata: { user_id: '{"device_id":"x"}' },
    system: [{ type: 'text', text: 'be brief', cache_control: { type: 'ephemeral' } }],
    tools: [], messages: [{ role: 'user', content: [{ type: 'text', text: 'accepted', cache_control: { type: 'ephemeral' } }] },
      { role: 'system', content: [{ type: 'text', text: 'a turn note' }], output_config: { effort: 'low' } }] });
  assert.equal(r.status, 200, r.text);
  assert.match(r.json.content[0].text, /accepted/);
});

test('a quota refusal: 429 rate_limit_error with Retry-After, count_tokens not counted', async () => {
  const auth = `Bearer ${guest.token}`;
  // count_tokens starts no run and counts nothing: the key's one request a day is left.
  for (let i = 0; i < 3; i++) {
    const c = await post(msg('echo', 'x'), { p: '/v1/messages/count_tokens', auth });
    assert.equal(c.status, 200, c.text);
  }
  const ok = await post(msg('echo', 'first'), { auth });
  assert.equal(ok.status, 200, ok.text);
  const r = await post(msg('echo', 'second'), { auth });
  isAnthropicError(r, 429, 'rate_limit_error');
  assert.match(r.headers['retry-after'] ?? '', /^\d+$/);
  const g = new Anthropic({ baseURL: server.url(''), apiKey: guest.token, maxRetries: 0 });
  await assert.rejects(g.messages.create(msg('echo', 'third')), Anthropic.RateLimitError);
});

// ---- count_tokens ------------------------------------------------------------------------------------

test('count_tokens: {"input_tokens": N}, 4 bytes a token of the flattened prompt and the tools', async () => {
  const count = async (body) => {
    const r = await post(body, { p: '/v1/messages/count_tokens' });
    assert.equal(r.status, 200, r.text);
    assert.deepEqual(Object.keys(r.json), ['input_tokens']);
    return r.json.input_tokens;
  };
  // One user message is the prompt as it is: 40 bytes, 10 tokens.
  assert.equal(await count({ model: 'echo', messages: [{ role: 'user', content: 'x'.repeat(40) }] }), 10);
  const withTools = await count({ model: 'claude-fake', messages: [{ role: 'user', content: 'x'.repeat(40) }], tools: [weather] });
  const decl = JSON.stringify([{ type: 'function', function: { name: weather.name, description: weather.description, parameters: weather.input_schema } }]);
  assert.equal(withTools, Math.ceil((40 + decl.length) / 4));
  const sdkCount = await sdk.messages.countTokens({ model: 'claude-opus-5-5', messages: [{ role: 'user', content: 'hello' }] });
  assert.equal(sdkCount.input_tokens, 2);
  const r = await post({ model: 'no-such-model', messages: [{ role: 'user', content: 'x' }] }, { p: '/v1/messages/count_tokens' });
  isAnthropicError(r, 404, 'not_found_error');
  const b = await post({ model: 'echo', messages: [] }, { p: '/v1/messages/count_tokens' });
  isAnthropicError(b, 400, 'invalid_request_error');
});

test('count_tokens: a key counts only for the models it may use (403 permission_error, as /v1/messages)', async () => {
  const k = olpKeys(server.home, 'keygen', '--name=ticker only', '--providers=ticker');
  const auth = `Bearer ${k.token}`;
  const ok = await post({ model: 'ticker', messages: [{ role: 'user', content: 'x'.repeat(8) }] }, { p: '/v1/messages/count_tokens', auth });
  assert.equal(ok.status, 200, ok.text);
  assert.equal(ok.json.input_tokens, 2);
  const no = await post({ model: 'echo', messages: [{ role: 'user', content: 'x' }] }, { p: '/v1/messages/count_tokens', auth });
  isAnthropicError(no, 403, 'permission_error');
  isAnthropicError(await post(msg('echo', 'x'), { auth }), 403, 'permission_error');
});

// ---- the real Claude Code as the client ----------------------------------------------------------

// claude -p … with ANTHROPIC_BASE_URL at OLP, an empty HOME and its own cwd: {code, stdout,
// stderr, cwd}.
async function claudeClient(args, { cwd = fs.mkdtempSync(path.join(os.tmpdir(), 'olp-cc-')) } = {}) {
  const home = fs.mkdtempSync(path.join(os.tmpdir(), 'olp-cc-home-'));
  const child = spawn(claudeBin, ['-p', ...args], {
    cwd,
    env: { PATH: process.env.PATH, HOME: home, ANTHROPIC_BASE_URL: server.url(''), ANTHROPIC_API_KEY: server.token,
      CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1', DISABLE_AUTOUPDATER: '1' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.add(child);
  const out = [], err = [];
  child.stdout.on('data', (d) => out.push(d));
  child.stderr.on('data', (d) => err.push(d));
  const timer = setTimeout(() => child.kill('SIGKILL'), 120000);
  const code = await new Promise((resolve) => child.on('close', resolve));
  clearTimeout(timer);
  children.delete(child);
  fs.rmSync(home, { recursive: true, force: true });
  return { code, stdout: Buffer.concat(out).toString(), stderr: Buffer.concat(err).toString(), cwd };
}

// The access lines OLP wrote since mark (the workers' log): [{method, path, status}].
const accessLines = (since) => server.errorLog().slice(since).split('\n').filter((l) => l.startsWith('{'))
  .map((l) => { try { return JSON.parse(l); } catch { return null; } }).filter((j) => j?.event === 'request');

// Every request the client made got an answer that neither failed nor warned. A request
// is logged just after its answer is out: the client can have it before the line is
// written, so at least min lines are waited for.
async function allAnswered(since, what, min = 1) {
  const lines = await waitFor(() => {
    const l = accessLines(since);
    return l.length >= min && l;
  }) || accessLines(since);
  assert.ok(lines.length >= min, `${what}: ${lines.length} requests reached OLP, not ${min}`);
  for (const l of lines) assert.equal(l.status, 200, `${what}: ${JSON.stringify(l)}`);
  return lines;
}

test('Claude Code as the client: a plain answer', { skip: noClaude }, async () => {
  const mark = server.errorLog().length;
  const r = await claudeClient(['say hello']);
  assert.equal(r.code, 0, r.stderr + r.stdout);
  assert.equal(r.stdout.trim(), HELLO);
  assert.equal(r.stderr.trim(), '', 'no warning from the client');
  const lines = await allAnswered(mark, 'plain');
  assert.ok(lines.every((l) => l.path.startsWith('/v1/messages')), JSON.stringify(lines));
});

test('Claude Code as the client: streamed, the deltas reach it', { skip: noClaude }, async () => {
  const mark = server.errorLog().length;
  const r = await claudeClient(['--output-format', 'stream-json', '--verbose', '--include-partial-messages', 'say hello']);
  assert.equal(r.code, 0, r.stderr + r.stdout);
  const lines = r.stdout.split('\n').filter(Boolean).map((l) => JSON.parse(l));
  const deltas = lines.filter((l) => l.type === 'stream_event' && l.event?.type === 'content_block_delta')
    .map((l) => l.event.delta.text);
  assert.ok(deltas.length >= 2, `deltas: ${JSON.stringify(deltas)}`);
  assert.equal(deltas.join(''), HELLO);
  const kinds = lines.filter((l) => l.type === 'stream_event').map((l) => l.event.type);
  assert.equal(kinds[0], 'message_start');
  assert.equal(kinds.at(-1), 'message_stop');
  const result = lines.find((l) => l.type === 'result');
  assert.equal(result.subtype, 'success');
  assert.equal(result.is_error, false);
  assert.equal(result.result, HELLO);
  await allAnswered(mark, 'streamed');
});

test('Claude Code as the client: a tool round trip runs its own Bash, on its side', { skip: noClaude }, async () => {
  const mark = server.errorLog().length;
  const before = (await (await fetch(`${upstream.url}/_requests`)).json()).length;
  const r = await claudeClient(['bash:echo made-by-the-client > proof.txt && echo wrote-the-proof',
    '--allowedTools', 'Bash']);
  assert.equal(r.code, 0, r.stderr + r.stdout);
  // The client ran the command in its own cwd …
  assert.equal(fs.readFileSync(path.join(r.cwd, 'proof.txt'), 'utf8'), 'made-by-the-client\n');
  // … sent the result back, and the second turn's answer came back.
  assert.equal(r.stdout.trim(), 'Tool said: wrote-the-proof');
  // Two turns through OLP, each one run of the claude provider, which ran nothing:
  // no proof.txt anywhere under OLP's home, run dir or sandboxes.
  const lines = await allAnswered(mark, 'tool round trip', 2);
  assert.ok(lines.filter((l) => l.path.startsWith('/v1/messages')).length >= 2, JSON.stringify(lines));
  const found = [];
  const walk = (d) => {
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      const p = path.join(d, e.name);
      if (e.isDirectory() && !e.isSymbolicLink()) walk(p);
      else if (e.name === 'proof.txt') found.push(p);
    }
  };
  walk(server.root);
  assert.deepEqual(found, [], 'nothing ran inside OLP');
  // Each of OLP's runs made one upstream call: no more calls upstream than runs OLP
  // answered (counted as they settle: a run is logged just after its answer is out). The
  // provider's claude, refused the tool call, asks the model again at once; on a loaded
  // machine that request once left before the run was ended (three calls for two runs).
  // Now its forwarder lets nothing out after the call (egr_route.stop_after_tool).
  let calls = [], runs = [];
  const settled = await waitFor(async () => {
    calls = (await (await fetch(`${upstream.url}/_requests`)).json()).slice(before);
    runs = accessLines(mark).filter((l) => l.path.split('?')[0] === '/v1/messages');
    return calls.length >= 2 && calls.length <= runs.length;
  }, { timeoutMs: 5000 });
  const said = (e) => `${e.method} ${e.path} ${e.model ?? ''} ${e.user_agent ?? ''}`;
  assert.ok(settled, `one upstream call per run: upstream ${JSON.stringify(calls.map(said))}, `
    + `OLP answered ${JSON.stringify(runs)}`);
});

// POST /v1/responses (issue 24): the OpenAI Responses API behind a real lighttpd, answered
// by a command provider (tests/fixtures) and by OLP's claude provider (the real claude CLI
// against tests/upstream/fake-anthropic.mjs), with the official openai SDK, curl (each
// event checked in its order), and the real codex CLI as the client: `codex exec`
// answered with text, and a round trip in which codex runs, on its own side, the shell
// command the answering model asked for.
//
// Env (CTest): what harness.mjs needs, OLP_KEYS, and OLP_PCLI_DIR (tests/provider-clis,
// whose node_modules hold the claude and codex CLIs; OLP_CODEX overrides codex's path).
// Without the real CLIs, the tests that need them are skipped with the reason.
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';

import { startServer, curl, curlStream, testRegistry, olpKeys } from './harness.mjs';
import { startUpstream as startUpstreamIn } from '../upstream/procs.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const pcliDir = process.env.OLP_PCLI_DIR ?? path.join(here, '..', 'provider-clis');
const claudeBin = path.join(pcliDir, 'node_modules/@anthropic-ai/claude-code/bin/claude.exe');
const codexBin = process.env.OLP_CODEX ?? path.join(pcliDir, 'node_modules/.bin/codex');
const codexJs = path.join(pcliDir, 'node_modules/@openai/codex/bin/codex.js');
const haveClaude = fs.existsSync(claudeBin);
const haveCodex = fs.existsSync(codexBin);
const noClaude = haveClaude ? false : `the real claude CLI is not installed (${claudeBin}): npm ci in tests/provider-clis`;
const noCodex = haveCodex && haveClaude ? false
  : `the real codex and claude CLIs are not both installed (${codexBin}, ${claudeBin}): npm ci in tests/provider-clis`;

let server, client, anthropic, quotaKey, openaiUp, codexWork;
const children = new Set();

before(async () => {
  const registry = testRegistry();
  const config = { auth: { allow_anonymous: false }, sandbox: { mode: 'bwrap' } };
  if (haveClaude) {
    anthropic = await startUpstreamIn('fake-anthropic.mjs', {}, children);
    registry.providers.anthropic = { type: 'claude', displayName: 'Claude (fake upstream)',
      models: [{ id: 'claude-fake', created: 1700000000 }, { id: 'claude-fake-maxtok', created: 1700000000 },
        { id: 'claude-sonnet-4-6', created: 1700000000 }],
    };
    config.providers = { anthropic: { bin: claudeBin, timeout_s: 60, credentials: [],
      env: { ANTHROPIC_BASE_URL: anthropic.url, ANTHROPIC_API_KEY: 'sk-ant-fake-key' } } };
  }
  if (haveCodex) {
    // OLP's codex provider (the real codex CLI, a fake OpenAI upstream), which codex's own
    // default ids reach through the alias pattern the shipped registry has ('gpt-*').
    openaiUp = await startUpstreamIn('fake-openai.mjs', {}, children);
    codexWork = fs.mkdtempSync(path.join(os.tmpdir(), 'olp-codex-prov-'));
    const toml = path.join(codexWork, 'codex-config.toml');
    fs.writeFileSync(toml, ['model_provider = "fake"', '', '[model_providers.fake]', 'name = "fake"',
      `base_url = "${openaiUp.url}/v1"`, 'wire_api = "responses"', 'env_key = "OPENAI_API_KEY"', '',
      '[analytics]', 'enabled = false', ''].join('\n'));
    registry.providers.openai = { type: 'codex', displayName: 'Codex (fake upstream)',
      models: [{ id: 'gpt-5-codex', created: 1700000000 }], aliases: { 'gpt-*': 'gpt-5-codex' } };
    config.providers = { ...(config.providers ?? {}),
      openai: { bin: codexJs, timeout_s: 90, credentials: [], config_toml: toml, model_provider: 'fake',
        network: { upstream: `${openaiUp.url}/v1` }, env: { OPENAI_API_KEY: 'sk-fake-key' } } };
  }
  server = await startServer({ registry, config });
  client = new OpenAI({ baseURL: server.url('/v1'), apiKey: server.token, maxRetries: 0, timeout: 60000 });
  quotaKey = olpKeys(server.home, 'keygen', '--name=responses quota', '--quota-rpd=1');
});

after(async () => {
  await server?.stop();
  for (const c of children) c.kill('SIGTERM');
  if (codexWork) fs.rmSync(codexWork, { recursive: true, force: true });
});

const post = (body, auth = true) => curl(server, { method: 'POST', path: '/v1/responses', auth,
  headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
const stream = (body) => curlStream(server, { method: 'POST', path: '/v1/responses', auth: true,
  body: { ...body, stream: true } });
const events = (res) => res.events.map((e) => JSON.parse(e.data));

// The published order of a text answer: created, in_progress, the message item added, its
// part added, the deltas, the text done, the part done, the item done, completed.
function assertTextSequence(evs, text) {
  const types = evs.map((e) => e.type);
  const deltas = types.filter((t) => t === 'response.output_text.delta').length;
  assert.ok(deltas >= 1, types.join());
  assert.deepEqual(types, ['response.created', 'response.in_progress', 'response.output_item.added',
    'response.content_part.added', ...Array(deltas).fill('response.output_text.delta'),
    'response.output_text.done', 'response.content_part.done', 'response.output_item.done',
    'response.completed']);
  assert.deepEqual(evs.map((e) => e.sequence_number), evs.map((_, i) => i));
  const id = evs[0].response.id;
  assert.match(id, /^resp_[0-9a-f]{24}$/);
  assert.equal(evs[0].response.status, 'in_progress');
  assert.deepEqual(evs[0].response.output, []);
  const item = evs[2].item;
  assert.equal(item.type, 'message');
  assert.equal(evs[2].output_index, 0);
  for (const e of evs.slice(3, -1)) {
    assert.equal(e.item_id ?? e.item.id, item.id);
    assert.equal(e.output_index, 0);
  }
  assert.equal(evs.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join(''), text);
  assert.equal(evs.at(-4).text, text);
  assert.deepEqual(evs.at(-2).item.content, [{ type: 'output_text', text, annotations: [] }]);
  assert.equal(evs.at(-2).item.status, 'completed');
  const done = evs.at(-1).response;
  assert.equal(done.id, id);
  assert.equal(done.status, 'completed');
  assert.deepEqual(done.output, [evs.at(-2).item]);
  for (const k of ['input_tokens', 'output_tokens', 'total_tokens']) assert.ok(Number.isInteger(done.usage[k]), k);
}

describe('a command provider', () => {
  test('the openai SDK: responses.create, input a string', async () => {
    const r = await client.responses.create({ model: 'echo', input: 'hello from responses' });
    assert.equal(r.object, 'response');
    assert.equal(r.status, 'completed');
    assert.match(r.id, /^resp_/);
    assert.equal(r.output_text, 'hello from responses');
    assert.equal(r.output[0].type, 'message');
    assert.equal(r.output[0].role, 'assistant');
    assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  });

  test('the openai SDK: responses.stream, items and store false', async () => {
    const s = client.responses.stream({ model: 'echo', store: false,
      input: [{ role: 'user', content: [{ type: 'input_text', text: 'streamed through the SDK' }] }] });
    const deltas = [];
    s.on('response.output_text.delta', (e) => deltas.push(e.delta));
    const r = await s.finalResponse();
    assert.equal(r.status, 'completed');
    assert.equal(deltas.join(''), 'streamed through the SDK');
    assert.equal(r.output[0].content[0].text, 'streamed through the SDK');
  });

  test('streamed: every event in the published order, with its sequence_number', async () => {
    const res = await stream({ model: 'echo', input: 'one two three' });
    assert.equal(res.status, 200, res.text);
    assert.match(res.headers['content-type'], /^text\/event-stream/);
    // Each data line's type is its event line's name.
    for (const block of res.text.split('\n\n').filter((b) => b.startsWith('event:')))
      assert.equal(block.split('\n')[0].slice(7), JSON.parse(block.split('\n')[1].slice(6)).type);
    assertTextSequence(events(res), 'one two three');
  });

  test('a failure after the stream began ends it with response.failed, code server_error', async () => {
    const res = await stream({ model: 'partial-fail', input: 'x' });
    assert.equal(res.status, 200);
    const evs = events(res);
    assert.deepEqual(evs.slice(0, 2).map((e) => e.type), ['response.created', 'response.in_progress']);
    const last = evs.at(-1);
    assert.equal(last.type, 'response.failed');
    assert.equal(last.response.status, 'failed');
    assert.equal(last.response.error.code, 'server_error');
    assert.equal(evs.filter((e) => e.type === 'response.completed').length, 0);
  });

  test('a failure before any output is an HTTP error in OpenAI shape', async () => {
    const r = await post({ model: 'fail3', input: 'x' });
    assert.ok(r.status >= 500, r.text);
    assert.equal(typeof r.json.error.message, 'string');
  });

  test('x-api-key is accepted', async () => {
    const r = await curl(server, { method: 'POST', path: '/v1/responses', auth: false,
      headers: { 'Content-Type': 'application/json', 'x-api-key': server.token },
      body: JSON.stringify({ model: 'echo', input: 'via x-api-key' }) });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.output[0].content[0].text, 'via x-api-key');
  });

  test('ignored on purpose: reasoning, text, prompt_cache_key, service_tier, include, client_metadata', async () => {
    const r = await post({ model: 'echo', input: 'ok', reasoning: { effort: 'low', summary: 'auto' },
      text: { verbosity: 'low' }, prompt_cache_key: 'k', service_tier: 'auto',
      include: ['reasoning.encrypted_content'], client_metadata: { a: 'b' }, parallel_tool_calls: true,
      tool_choice: 'auto', store: false });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.output[0].content[0].text, 'ok');
  });

  const refusals = [
    ['previous_response_id', { previous_response_id: 'resp_1' }, /previous_response_id is not supported/],
    ['store', { store: true }, /store must be false/],
    ['temperature', { temperature: 0.5 }, /Unrecognized request argument supplied: temperature/],
    ['input', { input: [] }, /input must be a string or a non-empty array/],
    ['input[0].type', { input: [{ type: 'local_shell_call' }] }, /local_shell_call are not supported/],
    ['input[0].role', { input: [{ type: 'message', role: 'tool', content: 'x' }] }, /must be one of/],
    ['input[0].content[0]', { input: [{ role: 'user', content: [{ type: 'input_file', file_id: 'f' }] }] }, /input_text/],
    ['tools[0]', { tools: [{ type: 'local_shell' }] }, /local_shell are not supported/],
    ['tool_choice', { tool_choice: 'sometimes' }, /tool_choice must be/],
    ['max_output_tokens', { max_output_tokens: 0 }, /positive integer/],
    ['stream', { stream: 'yes' }, /stream must be a boolean/],
  ];
  for (const [param, extra, msg] of refusals) {
    test(`400 naming ${param}`, async () => {
      const r = await post({ model: 'echo', input: 'x', ...extra });
      assert.equal(r.status, 400, r.text);
      assert.equal(r.json.error.type, 'invalid_request_error');
      assert.equal(r.json.error.param, param);
      assert.match(r.json.error.message, msg);
    });
  }

  test('400 for no model, 404 for an unknown one, 401 without a key', async () => {
    assert.equal((await post({ input: 'x' })).json.error.param, 'model');
    const nf = await post({ model: 'no-such-model', input: 'x' });
    assert.equal(nf.status, 404);
    assert.equal(nf.json.error.code, 'model_not_found');
    const na = await curl(server, { method: 'POST', path: '/v1/responses', auth: false,
      headers: { 'Content-Type': 'application/json' }, body: '{"model":"echo","input":"x"}' });
    assert.equal(na.status, 401);
  });

  test('GET /v1/models: the OpenAI list, and codex\'s catalog with ?client_version', async () => {
    const plain = await curl(server, { path: '/v1/models' });
    assert.equal(plain.json.object, 'list');
    assert.equal(plain.json.models, undefined);
    const r = await curl(server, { path: '/v1/models?client_version=0.171.0' });
    assert.equal(r.status, 200);
    assert.deepEqual(r.json.models.map((m) => m.slug), r.json.data.map((m) => m.id));
    const echo = r.json.models.find((m) => m.slug === 'echo');
    assert.equal(echo.visibility, 'list');
    assert.equal(echo.shell_type, 'shell_command');
    assert.equal(typeof echo.model_messages.instructions_template, 'string');
    assert.deepEqual(r.json.models.map((m) => m.priority), r.json.models.map((_, i) => i + 1));
  });

  test('a quota refusal is a 429 in OpenAI shape with Retry-After', async () => {
    const first = await post({ model: 'echo', input: 'x' }, `Bearer ${quotaKey.token}`);
    assert.equal(first.status, 200, first.text);
    const over = await post({ model: 'echo', input: 'x' }, `Bearer ${quotaKey.token}`);
    assert.equal(over.status, 429, over.text);
    assert.equal(over.json.error.code, 'quota_exceeded');
    assert.ok(Number(over.headers['retry-after']) > 0, JSON.stringify(over.headers));
  });
});

describe('the claude provider (the real claude CLI, a fake upstream)', { skip: noClaude }, () => {
  const shell = { type: 'function', name: 'shell', description: 'Run a command',
    parameters: { type: 'object', properties: { cmd: { type: 'string' } }, required: ['cmd'] } };
  const patch = { type: 'custom', name: 'apply_patch', description: 'Apply a patch',
    format: { type: 'grammar', syntax: 'lark', definition: 'start: /.+/' } };

  test('the openai SDK against claude: text', async () => {
    const r = await client.responses.create({ model: 'claude-fake', instructions: 'Be brief.', input: 'hi' });
    assert.equal(r.output_text, 'Hello from the fake Anthropic server!');
    assert.ok(r.usage.input_tokens > 0);
  });

  test('a function call: streamed as a function_call item, then completed', async () => {
    const args = Buffer.from(JSON.stringify({ cmd: 'ls' })).toString('base64url');
    const res = await stream({ model: 'claude-fake', tools: [shell], input: `callargs:shell:${args}` });
    const evs = events(res);
    const types = evs.map((e) => e.type);
    assert.deepEqual(types.slice(0, 3), ['response.created', 'response.in_progress', 'response.output_item.added']);
    assert.equal(evs[2].item.type, 'function_call');
    assert.equal(evs[2].item.name, 'shell');
    const argDeltas = evs.filter((e) => e.type === 'response.function_call_arguments.delta');
    assert.equal(argDeltas.map((e) => e.delta).join(''), '{"cmd":"ls"}');
    assert.deepEqual(types.slice(-3), ['response.function_call_arguments.done', 'response.output_item.done',
      'response.completed']);
    const item = evs.at(-2).item;
    assert.equal(item.call_id, evs[2].item.call_id);
    assert.equal(item.arguments, '{"cmd":"ls"}');
    assert.deepEqual(evs.at(-1).response.output, [item]);
    assert.deepEqual(evs.map((e) => e.sequence_number), evs.map((_, i) => i));
  });

  test('a custom tool: the call comes back as custom_tool_call with the input unwrapped', async () => {
    const args = Buffer.from(JSON.stringify({ input: '*** Begin Patch\n*** End Patch' })).toString('base64url');
    const r = await client.responses.create({ model: 'claude-fake', tools: [patch], input: `callargs:apply_patch:${args}` });
    assert.equal(r.output.length, 1, JSON.stringify(r.output));
    assert.equal(r.output[0].type, 'custom_tool_call');
    assert.equal(r.output[0].name, 'apply_patch');
    assert.equal(r.output[0].input, '*** Begin Patch\n*** End Patch');
    const res = await stream({ model: 'claude-fake', tools: [patch], input: `callargs:apply_patch:${args}` });
    const types = events(res).map((e) => e.type);
    assert.deepEqual(types.slice(-4), ['response.custom_tool_call_input.delta', 'response.custom_tool_call_input.done',
      'response.output_item.done', 'response.completed']);
  });

  test('a tool round trip: function_call and function_call_output reach the model', async () => {
    const r = await client.responses.create({ model: 'claude-fake', tools: [shell, patch], input: [
      { type: 'message', role: 'user', content: 'list the files' },
      { type: 'reasoning', id: 'rs_1', summary: [] },
      { type: 'function_call', call_id: 'call_1', name: 'shell', arguments: '{"cmd":"ls"}' },
      { type: 'function_call_output', call_id: 'call_1', output: 'a.txt b.txt' },
    ] });
    assert.equal(r.output_text, 'Tool said: a.txt b.txt');
  });

  test('a custom tool round trip: custom_tool_call and its output reach the model', async () => {
    const r = await client.responses.create({ model: 'claude-fake', tools: [shell, patch], input: [
      { type: 'message', role: 'user', content: 'patch it' },
      { type: 'custom_tool_call', call_id: 'call_2', name: 'apply_patch', input: 'patch' },
      { type: 'custom_tool_call_output', call_id: 'call_2', output: [{ type: 'input_text', text: 'Done!' }] },
    ] });
    assert.equal(r.output_text, 'Tool said: Done!');
  });

  test('max_output_tokens reached: response.incomplete', async () => {
    const res = await stream({ model: 'claude-fake-maxtok', input: 'hi', max_output_tokens: 5 });
    const last = events(res).at(-1);
    assert.equal(last.type, 'response.incomplete');
    assert.equal(last.response.status, 'incomplete');
    assert.deepEqual(last.response.incomplete_details, { reason: 'max_output_tokens' });
  });
});

// ---- the real codex as the client ------------------------------------------------------

// A recording proxy between codex and OLP: every request's method, URL and body, the
// answer streamed through untouched.
function recordingProxy(target) {
  const seen = [];
  const srv = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      seen.push({ method: req.method, url: req.url, body: body.length ? JSON.parse(body) : null });
      const up = http.request(new URL(req.url, target), { method: req.method, headers: req.headers }, (ur) => {
        res.writeHead(ur.statusCode, ur.headers);
        ur.pipe(res);
      });
      up.on('error', () => res.destroy());
      up.end(body);
    });
  });
  return new Promise((resolve) => srv.listen(0, '127.0.0.1', () => resolve({ srv, seen, port: srv.address().port })));
}

// codex exec in a fresh CODEX_HOME whose config.toml is the README's, base_url through
// the proxy. Resolves {code, stdout, stderr}.
// catalog: model_catalog_url set to OLP's /v1/models (codex then asks it for its models).
function codexExec(port, cwd, prompt, { extra = [], model = 'claude-sonnet-4-6', catalog = false } = {}) {
  const home = fs.mkdtempSync(path.join(os.tmpdir(), 'olp-codex-home-'));
  fs.writeFileSync(path.join(home, 'config.toml'), [
    ...(model ? [`model = "${model}"`] : []),
    'model_provider = "olp"',
    '',
    '[model_providers.olp]',
    'name = "OLP"',
    `base_url = "http://127.0.0.1:${port}/v1"`,
    'wire_api = "responses"',
    'env_key = "OLP_API_KEY"',
    ...(catalog ? [`model_catalog_url = "http://127.0.0.1:${port}/v1/models"`] : []),
    '',
  ].join('\n'));
  return new Promise((resolve) => {
    const c = spawn(codexBin, ['exec', '--skip-git-repo-check', ...extra, prompt],
      { cwd, env: { ...process.env, CODEX_HOME: home, OLP_API_KEY: server.token }, stdio: ['ignore', 'pipe', 'pipe'] });
    children.add(c);
    const out = [], err = [];
    c.stdout.on('data', (d) => out.push(d));
    c.stderr.on('data', (d) => err.push(d));
    const timer = setTimeout(() => c.kill('SIGKILL'), 120000);
    c.on('close', (code) => {
      clearTimeout(timer);
      children.delete(c);
      fs.rmSync(home, { recursive: true, force: true });
      resolve({ code, stdout: Buffer.concat(out).toString(), stderr: Buffer.concat(err).toString() });
    });
  });
}

describe('the real codex as the client', { skip: noCodex }, () => {
  let proxy, cwd;
  before(async () => {
    proxy = await recordingProxy(server.url('/'));
    cwd = fs.mkdtempSync(path.join(os.tmpdir(), 'olp-codex-cwd-'));
  });
  after(() => {
    proxy?.srv.close();
    if (cwd) fs.rmSync(cwd, { recursive: true, force: true });
  });

  test('codex exec is answered with text', async () => {
    proxy.seen.length = 0;
    const r = await codexExec(proxy.port, cwd, 'say hello');
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /Hello from the fake Anthropic server!/);
    assert.doesNotMatch(r.stderr, /stream closed before response.completed|error/i);
    const posts = proxy.seen.filter((s) => s.method === 'POST');
    assert.equal(posts.length, 1);
    assert.equal(posts[0].url, '/v1/responses');
    assert.equal(posts[0].body.stream, true);
  });

  test("codex's default model and request (tools in an additional_tools item) are taken, by OLP's codex provider", async () => {
    proxy.seen.length = 0;
    const r = await codexExec(proxy.port, cwd, 'say hello', { model: null });
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /Hello from the fake OpenAI server!/);
    const posts = proxy.seen.filter((s) => s.method === 'POST');
    assert.equal(posts.length, 1);
    assert.match(posts[0].body.model, /^gpt-/);
    assert.ok(posts[0].body.input.some((i) => i.type === 'additional_tools'), 'codex changed its request');
  });

  // codex's default model declares one custom tool, exec (JavaScript that calls its other
  // tools: tools.exec_command…), in an additional_tools item: OLP's codex provider gets it
  // as a function taking one string, its model's call comes back as a custom_tool_call,
  // and codex (the client) runs it on its side.
  test("codex's default model: OLP's codex provider asks for a shell command, which codex runs on its side", async () => {
    proxy.seen.length = 0;
    const file = path.join(cwd, 'made-for-default-codex.txt');
    const js = "await tools.exec_command({ cmd: 'echo from-the-codex-provider > made-for-default-codex.txt' });";
    const args = Buffer.from(JSON.stringify({ input: js })).toString('base64url');
    const r = await codexExec(proxy.port, cwd, `please call:exec=${args}`,
      { model: null, extra: ['--dangerously-bypass-approvals-and-sandbox'] });
    assert.equal(r.code, 0, r.stderr);
    const posts = proxy.seen.filter((s) => s.method === 'POST');
    // Made on the client's side by codex (the client); OLP's codex provider only asked.
    assert.ok(fs.existsSync(file), `${r.stdout}\n${r.stderr.slice(-2000)}\n${posts.length} requests`);
    assert.equal(fs.readFileSync(file, 'utf8'), 'from-the-codex-provider\n');
    assert.equal(posts.length, 2, JSON.stringify(posts.map((p) => p.url)));
    assert.match(posts[0].body.model, /^gpt-/);
    const call = posts[1].body.input.find((i) => i.type === 'custom_tool_call');
    const output = posts[1].body.input.find((i) => i.type === 'custom_tool_call_output');
    assert.equal(call.name, 'exec');
    assert.equal(call.input, js);
    assert.equal(output.call_id, call.call_id);
    assert.match(r.stdout, /Tool said: /);
  });

  test('codex runs on its side the shell command the model asked for', async () => {
    proxy.seen.length = 0;
    const file = path.join(cwd, 'made-by-codex.txt');
    const args = Buffer.from(JSON.stringify({ cmd: 'echo written-by-the-client > made-by-codex.txt' })).toString('base64url');
    const r = await codexExec(proxy.port, cwd, `please callargs:exec_command:${args}`,
      { extra: ['--dangerously-bypass-approvals-and-sandbox'] });
    assert.equal(r.code, 0, r.stderr);
    // The file is on the client's side, made by codex, not by anything under OLP.
    assert.equal(fs.readFileSync(file, 'utf8'), 'written-by-the-client\n');
    const posts = proxy.seen.filter((s) => s.method === 'POST');
    assert.equal(posts.length, 2, JSON.stringify(posts.map((p) => p.url)));
    const call = posts[1].body.input.find((i) => i.type === 'function_call');
    const output = posts[1].body.input.find((i) => i.type === 'function_call_output');
    assert.equal(call.name, 'exec_command');
    assert.equal(output.call_id, call.call_id);
    // The model saw the output and answered from it.
    assert.match(r.stdout, /Tool said: /);
  });

  test('with model_catalog_url: codex takes OLP\'s models without a warning', async () => {
    proxy.seen.length = 0;
    const r = await codexExec(proxy.port, cwd, 'say hello', { catalog: true });
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /Hello from the fake Anthropic server!/);
    assert.doesNotMatch(r.stderr, /failed to refresh available models|Model metadata for/);
    const gets = proxy.seen.filter((s) => s.method === 'GET');
    assert.ok(gets.length >= 1);
    assert.match(gets[0].url, /^\/v1\/models\?client_version=/);
  });

  test('apply_patch (a custom tool) round trip: codex applies the patch on its side', async () => {
    proxy.seen.length = 0;
    const patch = '*** Begin Patch\n*** Add File: patched-by-codex.txt\n+made by apply_patch\n*** End Patch\n';
    const args = Buffer.from(JSON.stringify({ input: patch })).toString('base64url');
    const r = await codexExec(proxy.port, cwd, `please callargs:apply_patch:${args}`,
      { catalog: true, extra: ['--dangerously-bypass-approvals-and-sandbox'] });
    assert.equal(r.code, 0, r.stderr);
    assert.equal(fs.readFileSync(path.join(cwd, 'patched-by-codex.txt'), 'utf8'), 'made by apply_patch\n');
    const posts = proxy.seen.filter((s) => s.method === 'POST');
    assert.equal(posts.length, 2);
    assert.ok(posts[0].body.tools.some((t) => t.type === 'custom' && t.name === 'apply_patch'));
    const call = posts[1].body.input.find((i) => i.type === 'custom_tool_call');
    const output = posts[1].body.input.find((i) => i.type === 'custom_tool_call_output');
    assert.equal(call.input, patch);
    assert.equal(output.call_id, call.call_id);
    assert.match(r.stdout, /Tool said: /);
  });
});

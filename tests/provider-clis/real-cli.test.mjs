// The real claude and codex CLIs (pinned in package.json, installed by `npm ci` here)
// against our fake upstreams (tests/upstream/), run exactly as OLP runs them: prov-driver
// `run` goes through prov_run — the provider's plan (argv, environment, binds), the
// bubblewrap sandbox, the stream parser — and prints the events and the outcome as JSON
// lines. One test also pipes an unsandboxed CLI's stdout through `prov-driver parse`.
//
// Env: PROV_DRIVER (path to prov-driver, set by CTest), OLP_PCLI_SANDBOX=off to run
// without bwrap on a host that has none.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, writeFileSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startUpstream as startUpstreamIn } from '../upstream/procs.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const driver = process.env.PROV_DRIVER;
const sandbox = process.env.OLP_PCLI_SANDBOX === 'off' ? 'off' : 'bwrap';
// A base URL reached through the worker's forwarder (upstream mode, the default), or, with
// the sandbox off, where upstream mode fails closed, straight over the host's network.
const via = (url) => (sandbox === 'off' ? 'host' : { upstream: url });
const claudeBin = path.join(here, 'node_modules/@anthropic-ai/claude-code/bin/claude.exe');
const codexJs = path.join(here, 'node_modules/@openai/codex/bin/codex.js');
const CLAUDE_TEXT = 'Hello from the fake Anthropic server!';
const CODEX_TEXT = 'Hello from the fake OpenAI server!';

let work, anthropic, openai;
const children = new Set();

const startServer = (file, env = {}) => startUpstreamIn(file, env, children);

async function requests(server) {
  return (await fetch(`${server.url}/_requests`)).json();
}

// Tell a fake upstream that the client saw one more delta (deltaGate, upstream/common.mjs).
async function seen(server) {
  const res = await fetch(`${server.url}/_seen`, { method: 'POST' });
  await res.arrayBuffer();
}

// Run argv with stdin, collect stdout lines as JSON; resolves with {events, ms, code}.
// onLine, if given, is called with each stdout line as it arrives.
function runJson(argv, input, { env = process.env, timeoutMs = 90000, onLine } = {}) {
  return new Promise((resolve, reject) => {
    const t0 = Date.now();
    const child = spawn(argv[0], argv.slice(1), { stdio: ['pipe', 'pipe', 'pipe'], env });
    children.add(child);
    let out = '', err = '';
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.stdout.on('data', (d) => {
      const from = out.lastIndexOf('\n') + 1;
      out += d;
      if (onLine) out.slice(from, out.lastIndexOf('\n') + 1).split('\n').filter(Boolean).forEach(onLine);
    });
    child.stderr.on('data', (d) => { err += d; });
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      children.delete(child);
      const events = out.split('\n').filter(Boolean).map((l) => {
        try { return JSON.parse(l); } catch { return { ev: 'unparsed', line: l }; }
      });
      resolve({ events, ms: Date.now() - t0, code, stderr: err });
    });
    child.stdin.end(input);
  });
}

function writeJson(name, obj) {
  const p = path.join(work, name);
  writeFileSync(p, JSON.stringify(obj));
  return p;
}

const models = (prefix) => ['fake', 'fail401', 'fail429', 'fail500', 'cut'].map((m) => ({ id: `${prefix}-${m}` }));

function claudeRegistry(extra = {}) {
  return writeJson(`claude-${Object.keys(extra).join('-') || 'base'}.json`, { providers: { anthropic: {
    // Upstream mode, the default (issue 12): the run reaches the fake upstream only
    // through the worker's forwarder; without set_headers its own key passes through.
    bin: claudeBin, timeout_s: 60, credentials: [], network: via(anthropic.url),
    env: { ANTHROPIC_BASE_URL: anthropic.url, ANTHROPIC_API_KEY: 'sk-ant-fake-key' },
    models: models('claude'), ...extra } } });
}

function codexRegistry() {
  const toml = path.join(work, 'codex-config.toml');
  writeFileSync(toml, [
    'model_provider = "fake"', '',
    '[model_providers.fake]', 'name = "fake"', `base_url = "${openai.url}/v1"`,
    'wire_api = "responses"', 'env_key = "OPENAI_API_KEY"', '',
    '[analytics]', 'enabled = false', '', '[features]', 'plugins = false', ''].join('\n'));
  return writeJson('codex.json', { providers: { openai: {
    bin: codexJs, timeout_s: 60, credentials: [], config_toml: toml, model_provider: 'fake',
    network: via(`${openai.url}/v1`),
    env: { OPENAI_API_KEY: 'sk-fake-key' }, models: models('gpt') } } });
}

const outcome = (r) => r.events.find((e) => e.ev === 'outcome');

// Both modes (issue 15, ADR 0022): with OLP_PCLI_PRESTART=1 each request is run twice in
// one prov-driver, and the second, the one checked, takes the process the first left
// started ahead; an answer that came must have come from it.
const prestart = process.env.OLP_PCLI_PRESTART === '1';
const prestartConf = prestart ? JSON.stringify({ anthropic: { prestart: 1 }, openai: { prestart: 1 } }) : '';
// The upstream requests of the checked run: those after the warm-up (prestart mode).
const checked = (r, reqs) => {
  const w = r.events.find((e) => e.ev === 'warmup');
  return w ? reqs.filter((q) => q.t >= w.wall_ms) : reqs;
};
const run = async (registry, model, prompt = 'Say hello', env = {}, onLine = undefined) => {
  const r = await runJson([driver, 'run', registry, model, prestartConf, sandbox], prompt,
                          { env: { ...process.env, ...env }, onLine });
  const o = outcome(r);
  if (prestart && o?.code === 'OK') assert.equal(o.start, 'prestart', `answered by a pre-started process: ${JSON.stringify(o)}`);
  return r;
};
const deltas = (r) => r.events.filter((e) => e.ev === 'delta');

before(async () => {
  assert.ok(driver && existsSync(driver), 'PROV_DRIVER must name the built prov-driver');
  assert.ok(existsSync(claudeBin) && existsSync(codexJs), 'run `npm ci` in tests/provider-clis first');
  work = mkdtempSync(path.join(tmpdir(), 'olp-real-cli-'));
  [anthropic, openai] = await Promise.all([startServer('fake-anthropic.mjs', { FAKE_DELTA_MS: '20' }),
                                           startServer('fake-openai.mjs')]);
});

after(() => {
  for (const c of children) c.kill('SIGKILL');
  if (work) rmSync(work, { recursive: true, force: true });
});

test('claude: text streamed as ordered deltas, usage, finish, answered at the result line', async () => {
  // Lockstep (x-fake-delta-gate, sent by claude as a custom header): the upstream writes
  // each delta only once prov-driver has printed the one before (this test reports each
  // delta line, the warm-up's too, with POST /_seen). Anything that holds a delta back
  // (the forwarder, the sandbox's pipe, the parser) makes the upstream's waits run out.
  // (Timing the deltas instead failed on a loaded machine: claude, starved of CPU, printed
  // six deltas sent 20 ms apart at once, 10.5 s after the start.)
  const gated = claudeRegistry({ env: { ANTHROPIC_BASE_URL: anthropic.url, ANTHROPIC_API_KEY: 'sk-ant-fake-key',
                                        ANTHROPIC_CUSTOM_HEADERS: 'X-Fake-Delta-Gate: 1' } });
  const seenPosts = [];
  const r = await run(gated, 'claude-fake', 'Say hello', {}, (line) => {
    if (/^\{"ev":"(warmup_)?delta"/.test(line)) seenPosts.push(seen(anthropic));
  });
  await Promise.all(seenPosts);
  const o = outcome(r);
  const ds = deltas(r);
  const reqs = checked(r, await requests(anthropic));
  const mine = reqs.filter((q) => q.model === 'claude-fake');
  assert.equal(mine.length, 1, JSON.stringify(o));
  // First: a delta held back also makes the run time out, which would say less.
  assert.equal(mine[0].gate_timeouts, 0,
               `the upstream waited in vain for a delta to be printed (${mine[0].gate_timeouts} of 5 times): ` +
               `something held it back; printed at ${ds.map((d) => d.t_ms)} ms`);
  assert.equal(mine[0].delta_t.length, 6);
  assert.equal(o.code, 'OK', JSON.stringify(o));
  assert.equal(ds.map((d) => d.text).join(''), CLAUDE_TEXT);
  assert.deepEqual(ds.map((d) => d.text), ['Hello', ' from', ' the', ' fake', ' Anthropic', ' server!']);
  for (let i = 1; i < ds.length; i++) assert.ok(ds[i].t_ms >= ds[i - 1].t_ms);
  assert.equal(o.finish_reason, 'stop');
  assert.equal(o.usage_present, true);
  assert.equal(mine[0].auth, 'x-api-key');
  // Only the Messages API was called on the configured base URL.
  assert.ok(reqs.every((q) => q.path.startsWith('/v1/messages')), JSON.stringify(reqs.map((q) => q.path)));
});

// Upstream mode, secretless (issue 12): the CLI gets only the forwarder's loopback URL and
// a placeholder key; the worker reads the real one from a 0600 file and adds it. No
// allow_paths: each type's defaults in network.c (what each CLI was seen calling), with
// every body checked for the run's own model (issue 22).
function secretlessRegistry() {
  const key = path.join(work, 'upstream.key');
  writeFileSync(key, 'sk-real-upstream-key\n', { mode: 0o600 });
  const toml = path.join(work, 'codex-plain.toml');
  writeFileSync(toml, ['[analytics]', 'enabled = false', '', '[features]', 'plugins = false', ''].join('\n'));
  return writeJson('secretless.json', { providers: {
    anthropic: { type: 'claude', bin: claudeBin, timeout_s: 60, models: [{ id: 'claude-secretless' }],
      network: { upstream: anthropic.url, set_headers: { 'x-api-key': `file:${key}` } } },
    openai: { type: 'codex', bin: codexJs, timeout_s: 60, config_toml: toml, models: [{ id: 'gpt-secretless' }],
      network: { upstream: `${openai.url}/v1`,
        set_headers: { authorization: `Bearer file:${key}` } } } } });
}

for (const [model, server, text, auth, p] of [
  // Models of their own: other tests count the requests of theirs.
  ['claude-secretless', () => anthropic, CLAUDE_TEXT, 'x-api-key', '/v1/messages'],
  ['gpt-secretless', () => openai, CODEX_TEXT, 'bearer', '/v1/responses']]) {
  test(`${model}: secretless upstream mode through the worker's forwarder`, async () => {
    const before = (await requests(server())).length;
    const r = await run(secretlessRegistry(), model);
    const o = outcome(r);
    if (sandbox === 'off') {
      assert.equal(o.code, 'SANDBOX_UNAVAILABLE', JSON.stringify(o)); // fail closed
      return;
    }
    assert.equal(o.code, 'OK', JSON.stringify(o));
    assert.equal(deltas(r).map((d) => d.text).join(''), text);
    const mine = checked(r, (await requests(server())).slice(before)).filter((q) => q.model === model);
    assert.equal(mine.length, 1, JSON.stringify(mine));
    assert.equal(mine[0].auth, auth);
    assert.equal(mine[0].path.split('?')[0], p);
  });
}

for (const [status, client] of [[401, 502], [429, 429], [500, 502]]) {
  test(`claude: upstream ${status} → PROVIDER_ERROR, status ${client}, within seconds`, async () => {
    const before = (await requests(anthropic)).length;
    const r = await run(claudeRegistry(), `claude-fail${status}`);
    const o = outcome(r);
    assert.equal(o.code, 'PROVIDER_ERROR', JSON.stringify(o));
    assert.equal(o.upstream_status, status);
    assert.equal(o.status, client);
    assert.equal(o.output_started, false);
    assert.ok(!o.message.includes('fake ' + status), 'the upstream text must not reach clients');
    assert.ok(r.ms < 30000, `took ${r.ms} ms`);
    const tries = checked(r, (await requests(anthropic)).slice(before)).length;
    // A pre-started run refused with a 401 is run again cold (ADR 0022): twice the tries.
    const most = prestart && status === 401 ? 6 : 3;
    assert.ok(tries >= 1 && tries <= most, `claude tried ${tries} times (CLAUDE_CODE_MAX_RETRIES=2)`);
    if (prestart) assert.equal(o.retried_cold, status === 401, JSON.stringify(o));
  });
}

test('claude: a stream cut midway is retried and the words are not repeated', async () => {
  // claude abandons the broken message, retries, and at last asks without streaming; the
  // client already has the first words, so only the rest may follow.
  const r = await run(claudeRegistry(), 'claude-cut');
  const o = outcome(r);
  assert.ok(r.ms < 60000);
  if (o.code === 'OK') {
    assert.equal(deltas(r).map((d) => d.text).join(''), CLAUDE_TEXT);
  } else {
    assert.equal(o.code, 'PROVIDER_ERROR', JSON.stringify(o));
  }
  const tries = (await requests(anthropic)).filter((q) => q.model === 'claude-cut');
  assert.ok(tries.length >= 2, 'claude retried the broken stream');
});

test('claude: no credentials at all → AUTH_MISSING with the fix', async () => {
  const reg = writeJson('claude-nocreds.json', { providers: { anthropic: {
    bin: claudeBin, timeout_s: 60, credentials: [], network: via(anthropic.url), env: { ANTHROPIC_BASE_URL: anthropic.url },
    models: models('claude') } } });
  const r = await run(reg, 'claude-fake');
  const o = outcome(r);
  assert.equal(o.code, 'AUTH_MISSING', JSON.stringify(o));
  assert.match(o.message, /log in|ANTHROPIC_API_KEY/);
});

test('claude without the sandbox, stdout piped through prov-driver parse', async () => {
  const argv = [claudeBin, '-p', '--output-format', 'stream-json', '--verbose', '--include-partial-messages',
    '--no-session-persistence', '--model', 'claude-fake', '--system-prompt', 'Be brief.', '--tools', ''];
  const home = mkdtempSync(path.join(work, 'home-'));
  const env = { PATH: '/usr/bin:/bin', HOME: home, LANG: 'C.UTF-8', TMPDIR: work,
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1', CLAUDE_CODE_MAX_RETRIES: '2',
    ANTHROPIC_BASE_URL: anthropic.url, ANTHROPIC_API_KEY: 'sk-ant-fake-key' };
  const raw = await new Promise((resolve, reject) => {
    const c = spawn(argv[0], argv.slice(1), { env, stdio: ['pipe', 'pipe', 'ignore'] });
    children.add(c);
    let out = '';
    c.stdout.on('data', (d) => { out += d; });
    c.on('error', reject);
    c.on('close', () => { children.delete(c); resolve(out); });
    c.stdin.end('Say hello');
  });
  const r = await runJson([driver, 'parse', 'claude'], raw);
  assert.equal(deltas(r).map((d) => d.text).join(''), CLAUDE_TEXT);
  // The prompt's count when the message starts (a run cut before the result has spent
  // it), then the whole run's at the result.
  const usages = r.events.filter((e) => e.ev === 'usage');
  assert.equal(usages[0].partial, true, JSON.stringify(usages));
  assert.equal(usages[0].prompt_tokens, 10);
  const u = usages.at(-1);
  assert.equal(u.partial, undefined, JSON.stringify(usages));
  assert.deepEqual([u.prompt_tokens, u.completion_tokens, u.total_tokens, u.cached_tokens], [10, 6, 16, 0]);
  assert.equal(r.events.find((e) => e.ev === 'finish').reason, 'stop');
  assert.ok(r.events.some((e) => e.ev === 'done'));
});

test('codex: the agent message, usage, finish', async () => {
  const r = await run(codexRegistry(), 'gpt-fake');
  const o = outcome(r);
  assert.equal(o.code, 'OK', JSON.stringify(o));
  assert.equal(deltas(r).map((d) => d.text).join(''), CODEX_TEXT);
  assert.equal(o.finish_reason, 'stop');
  assert.equal(o.usage_present, true);
  const reqs = checked(r, await requests(openai)).filter((q) => q.model === 'gpt-fake');
  assert.equal(reqs.length, 1);
  assert.equal(reqs[0].auth, 'bearer');
});

for (const [status, client] of [[401, 502], [429, 429], [500, 502]]) {
  test(`codex: upstream ${status} → PROVIDER_ERROR, status ${client}, within seconds`, async () => {
    const r = await run(codexRegistry(), `gpt-fail${status}`);
    const o = outcome(r);
    assert.equal(o.code, 'PROVIDER_ERROR', JSON.stringify(o));
    // codex names the status for 401 and 429; a 5xx becomes "We're currently
    // experiencing high demand" with no number in it.
    assert.ok(o.upstream_status === status || (status >= 500 && o.upstream_status === 0),
              JSON.stringify(o));
    assert.equal(o.status, client);
    assert.ok(!o.message.includes('127.0.0.1'), 'no upstream URL to clients');
    assert.ok(r.ms < 45000, `took ${r.ms} ms`);
  });
}

test('codex: a stream cut midway is a provider error, not a hang', async () => {
  const r = await run(codexRegistry(), 'gpt-cut');
  const o = outcome(r);
  assert.equal(o.code, 'PROVIDER_ERROR', JSON.stringify(o));
  assert.ok(r.ms < 60000);
});

// The client's function tools through codex (ADR 0019, "codex"): declared through
// olp-mcp-tools, the calls come back as tool events and codex is stopped by the hook
// before it asks the model again (one upstream request per run, whatever the calls).
function codexToolsRegistry() {
  const toml = path.join(work, 'codex-tools.toml');
  writeFileSync(toml, ['model_provider = "fake"', '', '[model_providers.fake]', 'name = "fake"',
    `base_url = "${openai.url}/v1"`, 'wire_api = "responses"', 'env_key = "OPENAI_API_KEY"', '',
    '[analytics]', 'enabled = false', ''].join('\n'));
  return writeJson('codex-tools.json', { providers: { openai: {
    bin: codexJs, timeout_s: 60, credentials: [], config_toml: toml, model_provider: 'fake',
    network: via(`${openai.url}/v1`), env: { OPENAI_API_KEY: 'sk-fake-key' },
    models: ['gpt-tools-one', 'gpt-tools-two', 'gpt-tools-none', 'gpt-tools-shell', 'gpt-tools-req']
      .map((id) => ({ id })) } } });
}
const fn = (name, parameters) => ({ type: 'function', function: { name, description: `the ${name} tool`,
  ...(parameters ? { parameters } : {}) } });
const TOOLS = JSON.stringify([fn('get_weather', { type: 'object', properties: { city: { type: 'string' } } }),
  fn('get_time')]);
const tools = (r) => r.events.filter((e) => e.ev === 'tool');
// The upstream requests of the checked run for model.
const upstreamOf = async (r, model) => checked(r, await requests(openai)).filter((q) => q.model === model);

test('codex tools: one call comes back as a tool event, finish tool_calls, one upstream request', async () => {
  const r = await run(codexToolsRegistry(), 'gpt-tools-one', 'Weather in Paris? call:get_weather',
                      { OLP_PCLI_TOOLS: TOOLS });
  const o = outcome(r);
  assert.equal(o.code, 'OK', JSON.stringify(o));
  assert.equal(o.finish_reason, 'tool_calls');
  const ts = tools(r);
  assert.equal(ts.length, 1, JSON.stringify(r.events));
  assert.equal(ts[0].name, 'get_weather'); // the client's own name, no namespace
  assert.match(ts[0].id, /^call_[0-9a-f]+_0$/);
  assert.deepEqual(JSON.parse(ts[0].args), { city: 'Paris' });
  assert.equal(deltas(r).length, 0, 'no text: codex was never given a tool result');
  assert.equal(o.usage_present, true);
  const reqs = await upstreamOf(r, 'gpt-tools-one');
  assert.equal(reqs.length, 1, 'codex asked the model again');
});

test('codex tools: several calls in one answer, distinct ids', async () => {
  const r = await run(codexToolsRegistry(), 'gpt-tools-two', 'call:get_weather,get_time',
                      { OLP_PCLI_TOOLS: TOOLS });
  const o = outcome(r);
  assert.equal(o.code, 'OK', JSON.stringify(o));
  assert.equal(o.finish_reason, 'tool_calls');
  // In the order codex starts them, which is not always the model's: by name.
  const ts = tools(r);
  assert.deepEqual(ts.map((t) => t.index), [0, 1]);
  const byName = [...ts].sort((a, b) => a.name.localeCompare(b.name));
  assert.deepEqual(byName.map((t) => t.name), ['get_time', 'get_weather']);
  assert.deepEqual(byName.map((t) => JSON.parse(t.args)), [{ n: 1 }, { city: 'Paris' }]);
  assert.notEqual(ts[0].id, ts[1].id);
  assert.equal((await upstreamOf(r, 'gpt-tools-two')).length, 1);
});

test('codex tools: an answer without a call is still text', async () => {
  const r = await run(codexToolsRegistry(), 'gpt-tools-none', 'just say hello', { OLP_PCLI_TOOLS: TOOLS });
  const o = outcome(r);
  assert.equal(o.code, 'OK', JSON.stringify(o));
  assert.equal(deltas(r).map((d) => d.text).join(''), CODEX_TEXT);
  assert.equal(tools(r).length, 0);
  assert.equal(o.finish_reason, 'stop');
  // What the model was offered: the client's tools in codex's MCP namespace, and none
  // of codex's own that run a command, read a file or reach the web.
  const [q] = await upstreamOf(r, 'gpt-tools-none');
  assert.ok(q, 'one upstream request');
});

test('codex tools: tool_choice required and named are told to the model', async () => {
  let r = await run(codexToolsRegistry(), 'gpt-tools-req', 'no call asked here',
                    { OLP_PCLI_TOOLS: TOOLS, OLP_PCLI_TOOL_CHOICE: 'get_time' });
  assert.equal(outcome(r).finish_reason, 'tool_calls', JSON.stringify(r.events));
  assert.deepEqual(tools(r).map((t) => t.name), ['get_time']);
  r = await run(codexToolsRegistry(), 'gpt-tools-req', 'no call asked here',
                { OLP_PCLI_TOOLS: TOOLS, OLP_PCLI_TOOL_CHOICE: 'required' });
  assert.equal(outcome(r).finish_reason, 'tool_calls', JSON.stringify(r.events));
  assert.equal(tools(r).length, 1);
});

test('codex tools: a call of a tool named like a shell runs nothing', async () => {
  // The client declares "exec_command" (the name of codex's own shell tool); the model
  // asks it to make a file and to send a request for this model to the upstream, through
  // the run's forwarder (upstream mode) and straight (host mode), which would count as a
  // second request. The call comes back to the client as it is; nothing ran: no file, no
  // such request (and codex never had a result to send back): one upstream request.
  const marker = `pwned-${process.pid}-${Date.now()}`;
  const file = path.join(work, marker);
  const body = `'{"model":"gpt-tools-shell","input":"${marker}"}'`;
  const cmd = [`touch ${file}`, ...['http://127.0.0.1:4180', `${openai.url}/v1`].map((u) =>
    `curl -s -X POST -H 'content-type: application/json' -d ${body} ${u}/responses`)].join('; ');
  const args = Buffer.from(JSON.stringify({ cmd })).toString('base64url');
  const shellTools = JSON.stringify([fn('exec_command', { type: 'object', properties: { cmd: { type: 'string' } } })]);
  const r = await run(codexToolsRegistry(), 'gpt-tools-shell', `call:exec_command=${args}`,
                      { OLP_PCLI_TOOLS: shellTools });
  const o = outcome(r);
  assert.equal(o.code, 'OK', JSON.stringify(o));
  const ts = tools(r);
  assert.equal(ts.length, 1, JSON.stringify(r.events));
  assert.equal(ts[0].name, 'exec_command');
  assert.deepEqual(JSON.parse(ts[0].args), { cmd });
  assert.equal(existsSync(file), false, 'the command ran');
  assert.equal((await upstreamOf(r, 'gpt-tools-shell')).length, 1);
});

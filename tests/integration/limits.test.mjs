// Subscription limits in view (issue 26 item 2, ADR 0035) with the REAL claude and codex
// CLIs (tests/provider-clis): curl → lighttpd → olp-fcgi → bubblewrap → the CLI → the
// worker's forwarder → tests/upstream/fake-{anthropic,openai}.mjs, whose answers carry a
// subscription's limits (anthropic-ratelimit-unified-*, x-codex-*; models "*-limits").
// What the forwarder read shows in the owner's /health, /v1/usage (a guest sees only the
// providers it may use), /metrics and the dashboard (headless Chromium). An upstream that
// answers 429 with the account rejected until a reset (models "*-limitonceN") makes the
// next request a 429 with Retry-After, answered without starting the CLI (the fake
// upstream sees no request), in the OpenAI shape on /v1/chat/completions and Anthropic's
// on /v1/messages; once the reset has passed, the requests are served again.
//
// Env (CTest): what harness.mjs needs, OLP_KEYS, OLP_PCLI_DIR (tests/provider-clis, whose
// node_modules hold the CLIs), OLP_IT_OUT (where the dashboard's screenshot goes).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { startServer, curl, chatBody, makeHome, olpKeys, testRegistry } from './harness.mjs';
import { startUpstream as startUpstreamIn } from '../upstream/procs.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const pcliDir = process.env.OLP_PCLI_DIR ?? path.join(here, '..', 'provider-clis');
const claudeBin = path.join(pcliDir, 'node_modules/@anthropic-ai/claude-code/bin/claude.exe');
const codexJs = path.join(pcliDir, 'node_modules/@openai/codex/bin/codex.js');
const outDir = process.env.OLP_IT_OUT ?? fs.mkdtempSync(path.join(os.tmpdir(), 'olp-limits-'));
// How long the fake upstreams keep an account rejected: long enough for the checks in
// between on a slow machine, short enough to wait for.
const RESET_S = 15;

let anthropic, openai, server, work, guest;
const children = new Set();

before(async () => {
  assert.ok(fs.existsSync(claudeBin) && fs.existsSync(codexJs), 'run `npm ci` in tests/provider-clis first');
  work = fs.mkdtempSync(path.join(os.tmpdir(), 'olp-limits-'));
  [anthropic, openai] = await Promise.all([startUpstreamIn('fake-anthropic.mjs', {}, children),
    startUpstreamIn('fake-openai.mjs', {}, children)]);
  const toml = path.join(work, 'codex-config.toml');
  fs.writeFileSync(toml, ['model_provider = "fake"', '', '[model_providers.fake]', 'name = "fake"',
    `base_url = "${openai.url}/v1"`, 'wire_api = "responses"', 'env_key = "OPENAI_API_KEY"', '',
    '[analytics]', 'enabled = false', ''].join('\n'));
  const registry = testRegistry();
  const models = (...ids) => ids.map((id) => ({ id, created: 1700000000 }));
  registry.providers.claude = { type: 'claude', displayName: 'Claude (fake upstream)',
    models: models('claude-limits', `claude-limitonce${RESET_S}`) };
  registry.providers.codex = { type: 'codex', displayName: 'Codex (fake upstream)',
    models: models('gpt-limits', `gpt-limitonce${RESET_S}`) };
  const config = {
    auth: { allow_anonymous: false },
    sandbox: { mode: 'bwrap' },
    usage: { enabled: true },
    providers: {
      // Upstream mode (the default): every answer passes the worker's forwarder.
      claude: { bin: claudeBin, timeout_s: 60, credentials: [], network: { upstream: anthropic.url },
        env: { ANTHROPIC_API_KEY: 'sk-ant-fake-key' } },
      codex: { bin: codexJs, timeout_s: 60, credentials: [], config_toml: toml, model_provider: 'fake',
        network: { upstream: `${openai.url}/v1` }, env: { OPENAI_API_KEY: 'sk-fake-key' } },
    },
  };
  const dirs = makeHome({ registry, config });
  guest = olpKeys(dirs.home, 'keygen', '--name=guest', '--tier=guest', '--providers=claude');
  server = await startServer({ dirs });
});

after(async () => {
  await server?.stop();
  for (const c of children) c.kill('SIGTERM');
  if (work) fs.rmSync(work, { recursive: true, force: true });
});

const post = (model, auth = true) => curl(server, { method: 'POST', path: '/v1/chat/completions', auth,
  headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(chatBody(model)) });
const upstreamCount = async (up) => (await (await fetch(`${up.url}/_requests`)).json()).length;
const health = async () => (await curl(server, { path: '/health', auth: true })).json;
const metrics = async () => (await curl(server, { path: '/metrics', auth: true })).text;
const sample = (text, name, labels) => {
  const line = text.split('\n').find((l) => l.startsWith(`${name}{${labels}} `));
  return line === undefined ? undefined : Number(line.split(' ').at(-1));
};
const near = (a, b, eps) => Math.abs(a - b) <= eps;

test('what the upstreams announced shows in /health, /v1/usage and /metrics', async () => {
  const now = Date.now() / 1000;
  for (const model of ['claude-limits', 'gpt-limits']) {
    const r = await post(model);
    assert.equal(r.status, 200, `${model}: ${r.text}`);
  }
  const h = await health();
  const c = h.providers.claude.accounts.default;
  assert.equal(c.status, 'allowed');
  assert.equal(c.limited, false);
  assert.equal(c.claim, 'five_hour');
  assert.ok(c.seen, 'when it was seen');
  assert.equal(c.windows['5h'].utilization, 0.42);
  assert.equal(c.windows['7d'].utilization, 0.25);
  assert.ok(near(c.windows['5h'].reset_in_s, 3 * 3600, 120), JSON.stringify(c));
  assert.ok(near(Date.parse(c.windows['7d'].reset) / 1000, now + 5 * 86400, 120), JSON.stringify(c));
  const x = h.providers.codex.accounts.default;
  assert.equal(x.status, 'allowed');
  assert.equal(x.windows.primary.utilization, 0.37);
  assert.equal(x.windows.primary.window_minutes, 300);
  assert.ok(near(x.windows.primary.reset_in_s, 7200, 120), JSON.stringify(x));
  assert.equal(x.windows.secondary.utilization, 0.12);
  assert.equal(x.windows.secondary.window_minutes, 10080);
  // A provider whose upstream said nothing: unknown, no windows.
  assert.deepEqual(h.providers.echo.accounts.default.windows, {});
  assert.equal(h.providers.echo.accounts.default.status, 'unknown');

  const u = await curl(server, { path: '/v1/usage', auth: true });
  assert.equal(u.status, 200, u.text);
  assert.equal(u.json.accounts.claude.default.windows['5h'].utilization, 0.42);
  assert.equal(u.json.accounts.codex.default.windows.secondary.utilization, 0.12);
  // A guest sees the accounts its requests use: claude's only.
  const g = await curl(server, { path: '/v1/usage', auth: `Bearer ${guest.token}` });
  assert.equal(g.status, 200, g.text);
  assert.deepEqual(Object.keys(g.json.accounts), ['claude']);
  assert.equal(g.json.accounts.claude.default.windows['7d'].utilization, 0.25);

  const m = await metrics();
  assert.equal(sample(m, 'olp_account_utilization', 'provider="claude",account="default",window="5h"'), 0.42);
  assert.equal(sample(m, 'olp_account_utilization', 'provider="codex",account="default",window="primary"'), 0.37);
  assert.equal(sample(m, 'olp_account_limited', 'provider="claude",account="default"'), 0);
  assert.ok(near(sample(m, 'olp_account_reset_seconds', 'provider="codex",account="default",window="primary"'), 7200, 120), m);
  assert.match(m, /# TYPE olp_account_utilization gauge/);
});

test('the dashboard shows each window\'s use and the time to its reset (Chromium)', async () => {
  const chromium = ['chromium', 'chromium-browser', 'google-chrome']
    .map((n) => spawnSync('sh', ['-c', `command -v ${n}`], { encoding: 'utf8' }).stdout.trim()).find(Boolean);
  assert.ok(chromium, 'chromium is not installed (deploy/olp-local test installs it: TEST_PKGS)');
  const url = server.url(`/dashboard#token=${encodeURIComponent(server.token)}`);
  const run = async (extra) => {
    const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'olp-chromium-'));
    try {
      const child = spawn(chromium, ['--headless=new', '--disable-gpu', '--no-first-run', '--disable-extensions',
        '--disable-background-networking', `--user-data-dir=${profile}`, '--window-size=1280,1400',
        '--virtual-time-budget=20000', ...(process.getuid() === 0 ? ['--no-sandbox'] : []), ...extra, url],
      { stdio: ['ignore', 'pipe', 'pipe'] });
      const out = [];
      child.stdout.on('data', (d) => out.push(d));
      const timer = setTimeout(() => child.kill('SIGKILL'), 120000);
      const code = await new Promise((resolve) => child.on('close', resolve));
      clearTimeout(timer);
      assert.equal(code, 0, 'chromium failed');
      return Buffer.concat(out).toString('utf8');
    } finally {
      fs.rmSync(profile, { recursive: true, force: true });
    }
  };
  const dom = await run(['--dump-dom']);
  assert.match(dom, /<body data-state="loaded"/, dom.slice(0, 2000));
  const rowOf = (key) => {
    const i = dom.indexOf(`<tr data-limit="${key}"`);
    return i < 0 ? null : dom.slice(i, dom.indexOf('</tr>', i));
  };
  const cell = (row, f) => (new RegExp(`data-f="${f}">([^<]*)<`).exec(row) ?? [])[1];
  const c5 = rowOf('claude/default/5h');
  assert.ok(c5, 'a row for claude\'s 5h window');
  assert.equal(cell(c5, 'used'), '42%');
  assert.equal(cell(c5, 'status'), 'allowed');
  assert.match(cell(c5, 'reset'), /^in (2 h 5\d|3 h 0) min$/);
  assert.equal(cell(rowOf('claude/default/7d'), 'used'), '25%');
  assert.match(cell(rowOf('claude/default/7d'), 'reset'), /^in (4 d 23|5 d 0) h$/);
  assert.equal(cell(rowOf('codex/default/primary'), 'used'), '37%');
  assert.match(cell(rowOf('codex/default/primary'), 'reset'), /^in (1 h 5\d|2 h 0) min$/);
  assert.equal(cell(rowOf('codex/default/secondary'), 'used'), '12%');
  const png = path.join(outDir, 'limits-dashboard.png');
  fs.mkdirSync(outDir, { recursive: true });
  await run([`--screenshot=${png}`]);
  assert.ok(fs.statSync(png).size > 20000, 'a screenshot');
});

test('an account the upstream rejected gets 429 with Retry-After, without a run, until its reset', async () => {
  // The upstreams refuse once, the account rejected for RESET_S seconds.
  const first = await Promise.all([post(`claude-limitonce${RESET_S}`), post(`gpt-limitonce${RESET_S}`)]);
  const t0 = Date.now();
  for (const r of first) assert.notEqual(r.status, 200, r.text);
  const h = await health();
  for (const p of ['claude', 'codex']) {
    const a = h.providers[p].accounts.default;
    assert.equal(a.status, 'rejected', `${p}: ${JSON.stringify(a)}`);
    assert.equal(a.limited, true);
    assert.ok(a.retry_after_s >= 1 && a.retry_after_s <= RESET_S, JSON.stringify(a));
  }
  assert.equal(h.providers.claude.accounts.default.windows['5h'].utilization, 1);
  assert.equal(h.providers.codex.accounts.default.windows.primary.utilization, 1);
  const m = await metrics();
  assert.equal(sample(m, 'olp_account_limited', 'provider="claude",account="default"'), 1);
  assert.equal(sample(m, 'olp_account_limited', 'provider="codex",account="default"'), 1);

  const seen = [await upstreamCount(anthropic), await upstreamCount(openai)];
  for (const model of ['claude-limits', 'gpt-limits']) {
    const r = await post(model);
    assert.equal(r.status, 429, r.text);
    const retry = Number(r.headers['retry-after']);
    assert.ok(retry >= 1 && retry <= RESET_S, `Retry-After ${r.headers['retry-after']}`);
    assert.equal(r.json.error.type, 'rate_limit_error');
    assert.equal(r.json.error.code, 'subscription_limit');
    assert.match(r.json.error.message, /subscription limit/);
  }
  // The Anthropic-shaped route answers in Anthropic's shape.
  const msg = await curl(server, { method: 'POST', path: '/v1/messages', auth: true,
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: 'claude-limits', max_tokens: 64, messages: [{ role: 'user', content: 'hi' }] }) });
  assert.equal(msg.status, 429, msg.text);
  assert.equal(msg.json.type, 'error');
  assert.equal(msg.json.error.type, 'rate_limit_error');
  assert.ok(Number(msg.headers['retry-after']) >= 1);
  // No CLI started: the upstreams saw nothing more.
  assert.deepEqual([await upstreamCount(anthropic), await upstreamCount(openai)], seen);

  // Once the reset has passed, served again.
  const wait = t0 + RESET_S * 1000 + 1500 - Date.now();
  if (wait > 0) await new Promise((r) => setTimeout(r, wait));
  for (const model of ['claude-limits', 'gpt-limits']) {
    const r = await post(model);
    assert.equal(r.status, 200, `${model}: ${r.text}`);
  }
  assert.deepEqual([await upstreamCount(anthropic), await upstreamCount(openai)], [seen[0] + 1, seen[1] + 1]);
  const after = await health();
  assert.equal(after.providers.claude.accounts.default.status, 'allowed');
  assert.equal(after.providers.claude.accounts.default.limited, false);
  assert.equal(sample(await metrics(), 'olp_account_limited', 'provider="codex",account="default"'), 0);
});

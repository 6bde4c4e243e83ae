// Logins held by the worker (issue 26 item 3, ADR 0036) with the REAL claude and codex
// CLIs (tests/provider-clis): curl → lighttpd → olp-fcgi → bubblewrap → the CLI → the
// worker's forwarder → tests/upstream/fake-{anthropic,openai}.mjs; refreshes go to
// tests/upstream/fake-token.mjs. Each CLI holds an OAuth login of its own format
// (claude's .credentials.json, codex's ChatGPT auth.json) with "login": "held":
//  - a prompt that makes the CLI print its credential file (the fake model calls the
//    CLI's own Bash / exec_command tool with `cat …`) gets only placeholders back, and
//    the upstream receives the REAL token in Authorization (and codex's account header);
//  - a token near its expiry is refreshed before the run (the token endpoint sees one
//    refresh with the login's refresh token and the CLI's client id), the file is
//    replaced atomically (a new inode, mode 0600), the request carries the new token;
//  - two requests at once on a host whose token is about to expire refresh it once;
//  - the owner's /health shows the login: mode, expiry, last refresh, failures.
//
// Env (CTest): what harness.mjs needs, OLP_PCLI_DIR (tests/provider-clis, whose
// node_modules hold the CLIs).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
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

// The real logins: long enough (16 bytes and more) to be masked in what comes back.
const REAL_CLAUDE = `sk-ant-oat01-REAL-claude-access-${'x'.repeat(24)}`;
const REAL_ACCOUNT = 'acct-REAL-0123456789abcdef';
const REAL_SETUP = `sk-ant-oat01-REAL-setup-token-${'y'.repeat(24)}`;
// Two people's setup-tokens, one per account (ADR 0037).
const REAL_ALICE = `sk-ant-oat01-REAL-alice-token-${'a'.repeat(24)}`;
const REAL_BOB = `sk-ant-oat01-REAL-bob-token-${'b'.repeat(24)}`;
// Bob's renewed token (his is in a file of its own, read at each run).
const REAL_BOB2 = `sk-ant-oat01-REAL-bob-renewed-${'c'.repeat(24)}`;
const b64 = (o) => Buffer.from(JSON.stringify(o)).toString('base64url');
const jwt = (claims) => `${b64({ alg: 'RS256', typ: 'JWT' })}.${b64(claims)}.c2lnbmF0dXJl`;
const HOUR = 3600 * 1000;
// What a prompt has claude's Bash run to print the run's environment.
const PRINT_ENV = process.env.OLP_HELD_PRINT_ENV ?? 'env';

let anthropic, openai, tokens, server, work, dirs, claudeCred, codexAuth, realCodex, aliceKey, bobKey, bobToken;
const children = new Set();

function writeClaude(expiresAt, refreshToken = 'rt-claude-REAL-refresh') {
  fs.writeFileSync(claudeCred, JSON.stringify({ claudeAiOauth: { accessToken: REAL_CLAUDE, refreshToken,
    expiresAt, scopes: ['user:inference', 'user:profile'], subscriptionType: 'max' } }), { mode: 0o600 });
  fs.chmodSync(claudeCred, 0o600);
}

function writeCodex(expiresAt, refreshToken = 'rt-codex-REAL-refresh') {
  const auth = { chatgpt_account_id: REAL_ACCOUNT, chatgpt_plan_type: 'pro', chatgpt_user_id: 'user-REAL' };
  realCodex = jwt({ exp: Math.floor(expiresAt / 1000), tag: 'REAL-codex-access', 'https://api.openai.com/auth': auth });
  fs.writeFileSync(codexAuth, JSON.stringify({ OPENAI_API_KEY: null, tokens: {
    id_token: jwt({ exp: Math.floor(expiresAt / 1000), email: 'owner@example.com', 'https://api.openai.com/auth': auth }),
    access_token: realCodex, refresh_token: refreshToken, account_id: REAL_ACCOUNT },
  last_refresh: new Date().toISOString() }), { mode: 0o600 });
  fs.chmodSync(codexAuth, 0o600);
}

before(async () => {
  assert.ok(fs.existsSync(claudeBin) && fs.existsSync(codexJs), 'run `npm ci` in tests/provider-clis first');
  work = fs.mkdtempSync(path.join(os.tmpdir(), 'olp-held-'));
  [anthropic, openai, tokens] = await Promise.all([startUpstreamIn('fake-anthropic.mjs', {}, children),
    startUpstreamIn('fake-openai.mjs', {}, children),
    // Held back a little, so that two workers' refreshes would overlap without the lock.
    startUpstreamIn('fake-token.mjs', { FAKE_TOKEN_DELAY_MS: '800' }, children)]);
  claudeCred = path.join(work, 'claude-credentials.json');
  codexAuth = path.join(work, 'codex-auth.json');
  writeClaude(Date.now() + 5 * HOUR);
  writeCodex(Date.now() + 5 * HOUR);
  const registry = testRegistry();
  const models = (...ids) => ids.map((id) => ({ id, created: 1700000000 }));
  registry.providers.claude = { type: 'claude', displayName: 'Claude (held login)', models: models('claude-held') };
  registry.providers.codex = { type: 'codex', displayName: 'Codex (held login)', models: models('gpt-held') };
  registry.providers.claudetok = { type: 'claude', displayName: 'Claude (setup-token)', models: models('claude-tok') };
  registry.providers.claudetokenv = { type: 'claude', displayName: 'fake claude', models: models('claude-tokenv') };
  registry.providers.claudeacc = { type: 'claude', displayName: 'Claude (an env token per account)', models: models('claude-acc') };
  registry.providers.claudeaccenv = { type: 'claude', displayName: 'fake claude', models: models('claude-accenv') };
  const fake = path.join(work, 'fake-claude');
  // Prints the token variable it was given as claude's last output line.
  fs.writeFileSync(fake, '#!/bin/sh\ncat >/dev/null\nprintf \'{"type":"result","subtype":"success","is_error":false,'
    + '"result":"TOKEN=%s"}\\n\' "$CLAUDE_CODE_OAUTH_TOKEN"\n', { mode: 0o755 });
  const fakeEnv = path.join(work, 'fake-claude-env');
  // Prints the run's whole environment as claude's last output line (what a CLI that
  // obeyed "print your environment" would answer).
  fs.writeFileSync(fakeEnv, '#!/bin/sh\ncat >/dev/null\nprintf \'{"type":"result","subtype":"success",'
    + '"is_error":false,"result":"ENV %s"}\\n\' "$(env | tr \'\\n"\\\\\' \'   \')"\n', { mode: 0o755 });
  // Bob's token in a file of the worker's own (0600), named by "file:" in env.
  bobToken = path.join(work, 'bob.token');
  fs.writeFileSync(bobToken, `${REAL_BOB}\n`, { mode: 0o600 });
  const config = {
    auth: { allow_anonymous: false },
    sandbox: { mode: 'bwrap' },
    providers: {
      // claude's own Bash on: a prompt can have it print what the run holds.
      // Pre-started (the default): the placeholder is in a process started before the
      // request, the real token set by the forwarder when the request comes.
      claude: { bin: claudeBin, timeout_s: 90, tools: 'Bash', prestart: 1, login: 'held',
        credentials: { [claudeCred]: '.claude/.credentials.json' },
        login_token_url: `${tokens.url}/v1/oauth/token`, network: { upstream: anthropic.url } },
      // `claude setup-token`'s long-lived token, given in env: a placeholder variable.
      claudetok: { bin: claudeBin, timeout_s: 90, prestart: 0, credentials: [],
        env: { CLAUDE_CODE_OAUTH_TOKEN: REAL_SETUP }, network: { upstream: anthropic.url } },
      claudetokenv: { bin: fake, timeout_s: 30, prestart: 0, credentials: [],
        env: { CLAUDE_CODE_OAUTH_TOKEN: REAL_SETUP }, network: { upstream: anthropic.url } },
      // One login per person from env: each account its own setup-token (alice's in
      // config.json, bob's in a file of its own); claude's own Bash on, so that a prompt
      // can have it print its environment. Pre-started: each account's process holds its
      // own placeholder before a request comes.
      claudeacc: { bin: claudeBin, timeout_s: 90, tools: 'Bash', prestart: 1, credentials: [],
        accounts: { alice: { env: { CLAUDE_CODE_OAUTH_TOKEN: REAL_ALICE } },
          bob: { env: { CLAUDE_CODE_OAUTH_TOKEN: `file:${bobToken}` } } },
        network: { upstream: anthropic.url } },
      claudeaccenv: { bin: fakeEnv, timeout_s: 30, prestart: 0, credentials: [],
        accounts: { alice: { env: { CLAUDE_CODE_OAUTH_TOKEN: REAL_ALICE } },
          bob: { env: { CLAUDE_CODE_OAUTH_TOKEN: `file:${bobToken}` } } },
        network: { upstream: anthropic.url } },
      codex: { bin: codexJs, timeout_s: 90, config_toml: false, prestart: 0, login: 'held',
        credentials: { [codexAuth]: '.codex/auth.json' },
        login_token_url: `${tokens.url}/oauth/token`, network: { upstream: `${openai.url}/v1` } },
    },
  };
  dirs = makeHome({ registry, config });
  aliceKey = olpKeys(dirs.home, 'keygen', '--name=alice', '--tier=guest', '--account=claudeacc=alice,claudeaccenv=alice');
  bobKey = olpKeys(dirs.home, 'keygen', '--name=bob', '--tier=guest', '--account=claudeacc=bob,claudeaccenv=bob');
  server = await startServer({ dirs });
});

after(async () => {
  // What the CLIs sent while they held a placeholder (docs/accounts.md): method, path,
  // when, and each header (a credential's value cut to its first 12 characters).
  if (process.env.OLP_HELD_DUMP && anthropic) {
    const cut = (h) => Object.fromEntries(Object.entries(h).map(([k, v]) =>
      [k, /authorization|account-id|api-key/.test(k) ? `${String(v).slice(0, 12)}…` : v]));
    const all = {};
    for (const [name, up] of [['anthropic', anthropic], ['openai', openai], ['token', tokens]])
      all[name] = (await requests(up)).map((e) => ({ method: e.method, path: e.path, t: e.t, headers: cut(e.headers) }));
    fs.writeFileSync(process.env.OLP_HELD_DUMP, JSON.stringify(all, null, 1));
  }
  await server?.stop();
  for (const c of children) c.kill('SIGTERM');
  if (work) fs.rmSync(work, { recursive: true, force: true });
});

const post = (model, content) => curl(server, { method: 'POST', path: '/v1/chat/completions', auth: true,
  headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(chatBody(model, content)) });
const requests = async (up) => (await (await fetch(`${up.url}/_requests`)).json());
const health = async () => (await curl(server, { path: '/health', auth: true })).json;
const answer = (r) => r.json?.choices?.[0]?.message?.content ?? '';
const refreshes = async () => (await requests(tokens)).filter((e) => e.method === 'POST');

test('claude: the run holds a placeholder, the upstream gets the real token', async () => {
  const before = (await requests(anthropic)).length;
  const r = await post('claude-held', 'ownbash:cat ~/.claude/.credentials.json');
  assert.equal(r.status, 200, r.text);
  const text = answer(r);
  assert.match(text, /Tool said: /, text);
  assert.match(text, /olp-placeholder/, `the file the run read: ${text}`);
  assert.ok(!text.includes(REAL_CLAUDE) && !text.includes('rt-claude-REAL'), 'the real login reached the answer');
  const seen = (await requests(anthropic)).slice(before).filter((e) => e.path.startsWith('/v1/messages'));
  assert.ok(seen.length >= 2, 'the call and the answer with its result');
  for (const e of seen) {
    assert.equal(e.headers.authorization, `Bearer ${REAL_CLAUDE}`, JSON.stringify(e.headers));
    assert.equal(e.headers['x-api-key'], undefined);
  }
  // What the CLI adds for an OAuth login itself: the beta flag (docs/accounts.md).
  assert.match(seen[0].headers['anthropic-beta'] ?? '', /oauth-2025-04-20/, JSON.stringify(seen[0].headers));
  const h = await health();
  assert.equal(h.providers.claude.login.mode, 'held', JSON.stringify(h.providers.claude.login));
  assert.ok(h.providers.claude.login.expires_in_s > 4 * 3600, JSON.stringify(h.providers.claude.login));
  assert.equal(h.providers.claude.login.refresh_failures, 0);
});

test('an upstream that echoes the real token hands back only a masked one', async () => {
  const r = await post('claude-held', 'echo-auth');
  assert.equal(r.status, 200, r.text);
  const text = answer(r);
  assert.match(text, /auth=Bearer \*{16,}/, text);
  assert.ok(!text.includes(REAL_CLAUDE) && !text.includes('REAL'), text);
});

test('claude setup-token: the run\'s variable is a placeholder, the upstream gets the token', async () => {
  // The real claude: what it sends. (Its Bash asks for approval before printing the
  // environment, so the variable the run holds is read by a fake claude below.)
  const before = (await requests(anthropic)).length;
  const r = await post('claude-tok', 'hello');
  assert.equal(r.status, 200, r.text);
  const seen = (await requests(anthropic)).slice(before).filter((e) => e.path.startsWith('/v1/messages'));
  assert.ok(seen.length >= 1);
  for (const e of seen) assert.equal(e.headers.authorization, `Bearer ${REAL_SETUP}`);
  const h = (await health()).providers.claudetok.login;
  assert.equal(h.mode, 'held', JSON.stringify(h));
  assert.equal(h.expires, null, 'a setup-token names no expiry');
  // What the run's environment holds: a placeholder.
  const f = await post('claude-tokenv', 'hello');
  assert.equal(f.status, 200, f.text);
  assert.match(answer(f), /TOKEN=sk-ant-oat01-olp-placeholder/, answer(f));
  assert.ok(!answer(f).includes(REAL_SETUP));
});

test('an env token per account: each key\'s runs send its own, and print only a placeholder', async () => {
  const ask = (key, model, content) => curl(server, { method: 'POST', path: '/v1/chat/completions',
    auth: `Bearer ${key.token}`, headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify(chatBody(model, content)) });
  for (const [key, acc, mine, other] of [[aliceKey, 'alice', REAL_ALICE, REAL_BOB], [bobKey, 'bob', REAL_BOB, REAL_ALICE]]) {
    // The real claude, told to print its environment through its own Bash: claude 2.1.332
    // asks for an approval print mode cannot give ("This command requires approval"; env,
    // printenv, /proc/self/environ, $VAR are all held back), so what it can print is
    // checked with the fake claude below. Whatever it answers holds no real token, and
    // every request it made carried the account's own.
    const before = (await requests(anthropic)).length;
    const r = await ask(key, 'claude-acc', `ownbash:${PRINT_ENV}`);
    assert.equal(r.status, 200, r.text);
    const text = answer(r);
    assert.match(text, /Tool said: /, text);
    for (const t of [mine, other, REAL_SETUP]) assert.ok(!text.includes(t), `a real token reached the answer: ${text}`);
    if (/CLAUDE_CODE_OAUTH_TOKEN=/.test(text)) assert.match(text, /CLAUDE_CODE_OAUTH_TOKEN=sk-ant-oat01-olp-placeholder/);
    const seen = (await requests(anthropic)).slice(before).filter((e) => e.path.startsWith('/v1/messages'));
    assert.ok(seen.length >= 2, 'the call and the answer with its result');
    for (const e of seen) assert.equal(e.headers.authorization, `Bearer ${mine}`, JSON.stringify(e.headers));
    // The run's whole environment, printed: the placeholder and its account, no token.
    const f = await ask(key, 'claude-accenv', 'print your environment');
    assert.equal(f.status, 200, f.text);
    const env = answer(f);
    assert.match(env, /CLAUDE_CODE_OAUTH_TOKEN=sk-ant-oat01-olp-placeholder-the-worker-holds-this-token/, env);
    assert.match(env, new RegExp(`OLP_ACCOUNT=${acc}( |$)`), env);
    assert.ok(!env.includes('REAL'), env);
  }
  // An upstream that echoes the bearer it got hands back a masked one.
  const e = await curl(server, { method: 'POST', path: '/v1/chat/completions', auth: `Bearer ${bobKey.token}`,
    headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(chatBody('claude-acc', 'echo-auth')) });
  assert.equal(e.status, 200, e.text);
  assert.match(answer(e), /auth=Bearer \*{16,}/, answer(e));
  assert.ok(!answer(e).includes('REAL'), answer(e));
  // Bob renews his token: the file replaced whole, the next run sends the new one.
  fs.writeFileSync(`${bobToken}.new`, `${REAL_BOB2}\n`, { mode: 0o600 });
  fs.renameSync(`${bobToken}.new`, bobToken);
  const before = (await requests(anthropic)).length;
  const n = await ask(bobKey, 'claude-acc', 'hello');
  assert.equal(n.status, 200, n.text);
  const renewed = (await requests(anthropic)).slice(before).filter((x) => x.path.startsWith('/v1/messages'));
  assert.ok(renewed.length >= 1);
  for (const x of renewed) assert.equal(x.headers.authorization, `Bearer ${REAL_BOB2}`, JSON.stringify(x.headers));
  // The owner's /health: each account's login held, from env (no expiry), present.
  const p = (await health()).providers.claudeacc;
  // The provider's own fields describe its default account (the first, alice): its
  // login is there and held, though the provider names no files of its own.
  assert.equal(p.credentials, 'present', JSON.stringify(p));
  assert.equal(p.login && p.login.mode, 'held', JSON.stringify(p));
  const h = p.accounts;
  for (const acc of ['alice', 'bob']) {
    assert.equal(h[acc].credentials, 'present', JSON.stringify(h[acc]));
    assert.equal(h[acc].login.mode, 'held', JSON.stringify(h[acc]));
    assert.equal(h[acc].login.expires, null);
  }
});

test('codex: the run holds a placeholder, the upstream gets the real token and account', async () => {
  const before = (await requests(openai)).length;
  const r = await post('gpt-held', 'ownexec:cat "$CODEX_HOME/auth.json"');
  assert.equal(r.status, 200, r.text);
  const text = answer(r);
  assert.match(text, /Tool said: /, text);
  assert.match(text, /olp-placeholder/, `the file the run read: ${text}`);
  assert.ok(!text.includes(realCodex) && !text.includes(REAL_ACCOUNT) && !text.includes('rt-codex-REAL'),
    'the real login reached the answer');
  const seen = (await requests(openai)).slice(before).filter((e) => e.path.endsWith('/responses'));
  assert.ok(seen.length >= 2, 'the call and the answer with its output');
  for (const e of seen) {
    assert.equal(e.headers.authorization, `Bearer ${realCodex}`, JSON.stringify(e.headers));
    assert.equal(e.headers['chatgpt-account-id'], REAL_ACCOUNT, JSON.stringify(e.headers));
  }
  const h = await health();
  assert.equal(h.providers.codex.login.mode, 'held');
});

test('a token near its expiry is refreshed before the run, the file replaced atomically', async () => {
  writeClaude(Date.now() + 60 * 1000, 'rt-claude-NEAR');
  const inode = fs.statSync(claudeCred).ino;
  const n = (await refreshes()).length;
  const before = (await requests(anthropic)).length;
  const r = await post('claude-held', 'hello');
  assert.equal(r.status, 200, r.text);
  const seenRefresh = (await refreshes()).slice(n);
  assert.equal(seenRefresh.length, 1, JSON.stringify(seenRefresh));
  assert.equal(seenRefresh[0].path, '/v1/oauth/token');
  assert.equal(seenRefresh[0].grant_type, 'refresh_token');
  assert.equal(seenRefresh[0].refresh_token, 'rt-claude-NEAR');
  assert.equal(seenRefresh[0].client_id, '9d1c250a-e61b-44d9-88ed-5944d1962f5e');
  const st = fs.statSync(claudeCred);
  assert.notEqual(st.ino, inode, 'replaced by a rename, not rewritten in place');
  assert.equal(st.mode & 0o777, 0o600);
  const now = JSON.parse(fs.readFileSync(claudeCred, 'utf8')).claudeAiOauth;
  assert.match(now.accessToken, /^sk-ant-oat01-REFRESHED-/);
  assert.equal(now.refreshToken.startsWith('rt-claude-NEAR-r'), true);
  assert.ok(now.expiresAt > Date.now() + 50 * 60 * 1000);
  assert.equal(now.subscriptionType, 'max', 'the rest of the file kept');
  const seen = (await requests(anthropic)).slice(before).filter((e) => e.path.startsWith('/v1/messages'));
  assert.ok(seen.length >= 1);
  for (const e of seen) assert.equal(e.headers.authorization, `Bearer ${now.accessToken}`);
  const h = (await health()).providers.claude.login;
  assert.ok(h.last_refresh && Math.abs(Date.parse(h.last_refresh) - Date.now()) < 120000, JSON.stringify(h));
  assert.equal(h.refresh_failures, 0);
});

test('codex: a ChatGPT token near its expiry is refreshed at auth.openai.com\'s path', async () => {
  writeCodex(Date.now() + 60 * 1000, 'rt-codex-NEAR');
  const n = (await refreshes()).length;
  const r = await post('gpt-held', 'hello');
  assert.equal(r.status, 200, r.text);
  const seenRefresh = (await refreshes()).slice(n);
  assert.equal(seenRefresh.length, 1, JSON.stringify(seenRefresh));
  assert.equal(seenRefresh[0].path, '/oauth/token');
  assert.equal(seenRefresh[0].refresh_token, 'rt-codex-NEAR');
  assert.equal(seenRefresh[0].client_id, 'app_EMoamEEZ73f0CkXaXp7hrann');
  const now = JSON.parse(fs.readFileSync(codexAuth, 'utf8'));
  assert.equal(now.tokens.refresh_token.startsWith('rt-codex-NEAR-r'), true);
  assert.equal(fs.statSync(codexAuth).mode & 0o777, 0o600);
  const last = (await requests(openai)).filter((e) => e.path.endsWith('/responses')).at(-1);
  assert.equal(last.headers.authorization, `Bearer ${now.tokens.access_token}`);
});

test('two requests at once refresh the login once (one refresher per host)', async () => {
  writeClaude(Date.now() + 60 * 1000, 'rt-claude-TWICE');
  const n = (await refreshes()).length;
  const rs = await Promise.all([post('claude-held', 'one'), post('claude-held', 'two')]);
  for (const r of rs) assert.equal(r.status, 200, r.text);
  const seenRefresh = (await refreshes()).slice(n);
  assert.equal(seenRefresh.length, 1, JSON.stringify(seenRefresh));
  const now = JSON.parse(fs.readFileSync(claudeCred, 'utf8')).claudeAiOauth;
  const last = (await requests(anthropic)).filter((e) => e.path.startsWith('/v1/messages')).slice(-2);
  for (const e of last) assert.equal(e.headers.authorization, `Bearer ${now.accessToken}`);
});

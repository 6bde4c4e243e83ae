// Logins and anonymous callers behind a real lighttpd (issue 22, items 1-3; ADR 0025),
// with the workers as root and, when we are root, as www-data.
//
// "leaky" is a codex-type provider whose CLI is a fake codex that does what a model told
// by the prompt would do: it prints its login ($CODEX_HOME/auth.json, base64) in its
// answer, and on "WRITE:<text>" replaces it first (as a token refresh would). Its login is
// bound into the run, so it serves the owner, and a guest key only when the owner allowed
// it by name (olp-keys keygen --allow-login); /v1/models and /health say so. With
// credentials_writable, only the owner's runs write the file back, and only a file in
// codex's own format. Anonymous callers get the command providers only by default, and
// their quota holds.
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { startServer, stageFor, curl, chatBody, olpKeys, waitFor, makeHome, cfg } from './harness.mjs';

const SECRET = 'sk-OWNER-SECRET-' + Math.random().toString(36).slice(2);
const FAKE_CODEX = `#!/bin/sh
p=$(cat)
case "$p" in
*WRITE:*) printf '%s' "\${p#*WRITE:}" > "$CODEX_HOME/auth.json" ;;
esac
s=$(base64 -w0 "$CODEX_HOME/auth.json" 2>/dev/null)
printf '{"type":"item.completed","item":{"type":"agent_message","text":"LOGIN:%s"}}\\n' "$s"
printf '{"type":"turn.completed","usage":{"input_tokens":1,"output_tokens":1}}\\n'
`;
const ANON_RPD = 3;

function identities() {
  const ids = [{ name: os.userInfo().username, user: null }];
  const www = spawnSync('id', ['-u', 'www-data'], { encoding: 'utf8' });
  if (process.getuid() === 0 && www.status === 0) ids.push({ name: 'www-data', user: 'www-data' });
  return ids;
}

// What the fake codex printed of its login.
const loginOf = (r) => {
  const m = /LOGIN:([A-Za-z0-9+/=]*)/.exec(r.json?.choices?.[0]?.message?.content ?? '');
  return m ? Buffer.from(m[1], 'base64').toString() : null;
};

for (const id of identities()) {
  describe(`logins, workers as ${id.name}`, () => {
    let server, root, home, authFile, guest, allowed;

    before(async () => {
      root = fs.mkdtempSync(path.join(os.tmpdir(), 'olp-logins-'));
      fs.chmodSync(root, 0o755);
      home = path.join(root, 'home');
      fs.mkdirSync(path.join(home, 'creds'), { recursive: true, mode: 0o700 });
      authFile = path.join(home, 'creds', 'auth.json');
      fs.writeFileSync(authFile, JSON.stringify({ OPENAI_API_KEY: SECRET }), { mode: 0o600 });
      const stage = id.user ? stageFor(id.user) : null;
      const script = path.join(root, 'fake-codex');
      fs.writeFileSync(script, FAKE_CODEX, { mode: 0o755 });
      const bin = stage ? stage.copy(script, 'fake-codex', 0o755) : script;
      const registry = {
        providers: {
          echo: { type: 'command', argv: ['/usr/bin/cat'], network: false, models: [{ id: 'echo' }] },
          leaky: {
            type: 'codex', bin, credentials: { [authFile]: '.codex/auth.json' }, credentials_writable: true,
            config_toml: false, network: false, prestart: 0, timeout_s: 30, models: [{ id: 'leaky-model' }],
          },
        },
      };
      fs.writeFileSync(path.join(home, 'models-registry.json'), JSON.stringify(registry), { mode: 0o600 });
      fs.writeFileSync(path.join(home, 'config.json'), JSON.stringify({
        auth: { allow_anonymous: true, anonymous: { quota: { requests_per_day: ANON_RPD } } },
        sandbox: { mode: 'bwrap', warm: false, prestart_max: 0 },
      }), { mode: 0o600 });
      fs.chmodSync(home, 0o700);
      guest = olpKeys(home, 'keygen', '--name=guest', '--tier=guest');
      allowed = olpKeys(home, 'keygen', '--name=trusted', '--tier=guest', '--allow-login=leaky');
      server = await startServer({ registry: null, config: null, env: { OLP_HOME: home }, stage, maxProcs: 2 });
    });

    after(async () => {
      await server?.stop();
      fs.rmSync(root, { recursive: true, force: true });
    });

    const ask = (model, content, auth = true) =>
      curl(server, { method: 'POST', path: '/v1/chat/completions', body: chatBody(model, content), auth });
    // Every run's sandbox is torn down (its write-back done) after the answer went out.
    const tornDown = async () => {
      const scratch = () => fs.readdirSync(path.join(home, 'run')).filter((e) => /^\d+-/.test(e));
      assert.ok(await waitFor(() => scratch().length === 0, { timeoutMs: 10000 }), `scratch dirs left: ${scratch()}`);
    };
    const hostLogin = () => fs.readFileSync(authFile, 'utf8');

    test('a guest key is refused a provider whose runs hold its login: 403, nothing of it', async () => {
      const r = await ask('leaky-model', 'cat $CODEX_HOME/auth.json', `Bearer ${guest.token}`);
      assert.equal(r.status, 403, r.text);
      assert.equal(r.json.error.type, 'permission_error');
      assert.equal(r.json.error.code, 'login_owner_only');
      assert.match(r.json.error.message, /owner-only/);
      assert.ok(!r.text.includes(SECRET));
      // /v1/models offers the guest no model it would be refused; the owner sees it.
      const gm = await curl(server, { path: '/v1/models', auth: `Bearer ${guest.token}` });
      assert.deepEqual(gm.json.data.map((m) => m.id), ['echo']);
      const om = await curl(server, { path: '/v1/models' });
      assert.deepEqual(om.json.data.map((m) => m.id).sort(), ['echo', 'leaky-model']);
    });

    test('the owner is served, and so is the guest the owner allowed', async () => {
      const o = await ask('leaky-model', 'hello');
      assert.equal(o.status, 200, o.text);
      assert.equal(JSON.parse(loginOf(o)).OPENAI_API_KEY, SECRET);
      const a = await ask('leaky-model', 'hello', `Bearer ${allowed.token}`);
      assert.equal(a.status, 200, a.text);
      await tornDown();
    });

    test("/health names the keys whose prompts can read a provider's login", async () => {
      const h = await curl(server, { path: '/health' });
      assert.equal(h.json.providers.leaky.login_exposed, true);
      assert.deepEqual(h.json.providers.leaky.login_access, [allowed.id]);
      assert.equal(h.json.providers.echo.login_exposed, false);
      // Taking it back shows at once, and the key is refused from its next request.
      olpKeys(home, 'set-login', `--id=${allowed.id}`, '--deny=leaky');
      const h2 = await curl(server, { path: '/health' });
      assert.deepEqual(h2.json.providers.leaky.login_access, []);
      const a = await ask('leaky-model', 'hello', `Bearer ${allowed.token}`);
      assert.equal(a.status, 403, a.text);
      olpKeys(home, 'set-login', `--id=${allowed.id}`, '--allow=leaky');
      // A guest sees no provider details at all.
      const g = await curl(server, { path: '/health', auth: `Bearer ${allowed.token}` });
      assert.equal(g.json.providers, undefined);
    });

    test("write-back: never from a guest's run, never garbage; the owner's refresh is kept", async () => {
      const guestWrite = JSON.stringify({ OPENAI_API_KEY: 'sk-GUEST-CHOSEN' });
      const g = await ask('leaky-model', `WRITE:${guestWrite}`, `Bearer ${allowed.token}`);
      assert.equal(g.status, 200, g.text);
      assert.equal(JSON.parse(loginOf(g)).OPENAI_API_KEY, 'sk-GUEST-CHOSEN'); // its own copy
      await tornDown();
      assert.equal(JSON.parse(hostLogin()).OPENAI_API_KEY, SECRET);
      const bad = await ask('leaky-model', 'WRITE:this is no login');
      assert.equal(bad.status, 200, bad.text);
      await tornDown();
      assert.equal(JSON.parse(hostLogin()).OPENAI_API_KEY, SECRET);
      assert.match(server.errorLog(), /changes to .*auth\.json were not kept: the new file is not a JSON object/);
      assert.ok(!server.errorLog().includes('this is no login'), 'the refused content was logged');
      const fresh = JSON.stringify({ OPENAI_API_KEY: null, tokens: { access_token: 'a2', refresh_token: 'r2' } });
      const ok = await ask('leaky-model', `WRITE:${fresh}`);
      assert.equal(ok.status, 200, ok.text);
      await tornDown();
      assert.equal(JSON.parse(hostLogin()).tokens.refresh_token, 'r2');
    });

    test('anonymous: no CLI provider by default, the command ones served, its quota enforced', async () => {
      const l = await ask('leaky-model', 'hello', false);
      assert.equal(l.status, 403, l.text);
      const m = await curl(server, { path: '/v1/models', auth: false });
      assert.deepEqual(m.json.data.map((x) => x.id), ['echo']);
      for (let i = 0; i < ANON_RPD; i++) {
        const r = await ask('echo', `anon ${i}`, false);
        assert.equal(r.status, 200, r.text);
      }
      const over = await ask('echo', 'one too many', false);
      assert.equal(over.status, 429, over.text);
      assert.equal(over.json.error.code, 'quota_exceeded');
      // A key is not counted with anonymous callers.
      const k = await ask('echo', 'mine', `Bearer ${guest.token}`);
      assert.equal(k.status, 200, k.text);
    });
  });
}

// auth.anonymous is checked when a worker starts, every error naming the JSON path: a typo
// must not give anonymous callers a provider, a login, or no limit.
const BAD_ANON = [
  ['a login provider', { providers: ['leaky'] }, 'auth.anonymous.providers[0]: provider \\"leaky\\" runs commands with its login'],
  ['an unknown provider', { providers: ['echo', 'nope'] }, 'auth.anonymous.providers[1]: unknown provider'],
  ['providers not a list', { providers: 'echo' }, 'auth.anonymous.providers: must be'],
  ['a misspelt limit', { quota: { requests_per_dy: 5 } }, 'auth.anonymous.quota.requests_per_dy: unknown limit'],
  ['a limit of 0', { quota: { max_concurrent: 0 } }, 'auth.anonymous.quota.max_concurrent: must be'],
  ['an unknown setting', { provider: ['echo'] }, 'auth.anonymous.provider: unknown setting'],
  ['not an object', true, 'auth.anonymous: must be an object'],
];

describe('auth.anonymous checked at start', () => {
  for (const [what, anonymous, named] of BAD_ANON) {
    test(`${what}: the worker does not start, and says where`, () => {
      const registry = {
        providers: {
          echo: { type: 'command', argv: ['/usr/bin/cat'], network: false, models: [{ id: 'echo' }] },
          // Copied into its runs ("copy"; a login held by the worker is not exposed, ADR 0036).
          leaky: { type: 'codex', credentials: '/nonexistent/auth.json', login: 'copy', models: [{ id: 'leaky-model' }] },
        },
      };
      const dirs = makeHome({ registry, config: { auth: { allow_anonymous: true, anonymous } } });
      try {
        const r = spawnSync(cfg.bin, [], {
          encoding: 'utf8',
          timeout: 30000,
          env: { PATH: process.env.PATH ?? '/usr/bin:/bin', OLP_HOME: dirs.home, GATEWAY_INTERFACE: 'CGI/1.1',
            REQUEST_METHOD: 'GET', REQUEST_URI: '/health' },
        });
        assert.notEqual(r.status, 0, `started anyway: ${r.stdout.slice(0, 200)}`);
        assert.ok(r.stderr.includes(`${dirs.home}/config.json: ${named}`), `"${named}" not named in: ${r.stderr}`);
      } finally {
        fs.rmSync(dirs.root, { recursive: true, force: true });
      }
    });
  }
});

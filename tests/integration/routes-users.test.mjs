// The Anthropic Messages and OpenAI Responses routes (POST /v1/messages,
// /v1/messages/count_tokens, /v1/responses; issue 24) behind a real lighttpd, with the
// workers as root and, when we are root, as www-data (as it_auth and it_logins run their
// routes) and behind `deploy/olp-local serve` started as root (workers as the user olp,
// as it_serve runs it): the owner key, a guest key (its providers limited to one) and no key against
// each route, with each API's error shape (Anthropic's on the two Messages routes,
// OpenAI's on /v1/responses). A command provider answers (cat: the prompt comes back), so
// that nothing here needs a provider CLI; it_messages and it_responses drive the real
// ones. Env (CTest): what harness.mjs needs and OLP_KEYS.
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import {
  startServer, stageFor, curl, olpKeys, makeHome, commandProvider, testConfig, procsMentioning, serveRoot, startServe,
} from './harness.mjs';

function identities() {
  const ids = [{ name: os.userInfo().username, user: null, uid: process.getuid() }];
  const www = spawnSync('id', ['-u', 'www-data'], { encoding: 'utf8' });
  if (process.getuid() === 0 && www.status === 0)
    ids.push({ name: 'www-data', user: 'www-data', uid: Number(www.stdout.trim()) });
  return ids;
}

// The real (and effective) uid of a process.
const uidOf = (pid) => Number(/^Uid:\s+(\d+)/m.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))[1]);

// Anthropic's error shape: {"type":"error","error":{"type","message"}}, nothing else.
const isAnthropicError = (r, status, type) => {
  assert.equal(r.status, status, r.text);
  assert.deepEqual(Object.keys(r.json).sort(), ['error', 'type'], r.text);
  assert.equal(r.json.type, 'error');
  assert.deepEqual(Object.keys(r.json.error).sort(), ['message', 'type'], r.text);
  assert.equal(r.json.error.type, type, r.text);
  assert.ok(r.json.error.message.length > 0);
};

// OpenAI's: {"error":{"message","type","param","code"}}.
const isOpenAIError = (r, status, type, code) => {
  assert.equal(r.status, status, r.text);
  assert.deepEqual(Object.keys(r.json), ['error'], r.text);
  assert.deepEqual(Object.keys(r.json.error).sort(), ['code', 'message', 'param', 'type'], r.text);
  assert.equal(r.json.error.type, type, r.text);
  if (code !== undefined) assert.equal(r.json.error.code, code, r.text);
  assert.ok(r.json.error.message.length > 0);
};

// The text of a Responses answer's message item.
const responseText = (r) =>
  r.json.output.filter((i) => i.type === 'message').flatMap((i) => i.content).filter((c) => c.type === 'output_text')
    .map((c) => c.text).join('');

// The registry every server here has: two command providers, the guest key may use one.
const REGISTRY = {
  providers: {
    echo: commandProvider('echo', ['/usr/bin/cat']),
    other: commandProvider('other', ['/usr/bin/cat']),
  },
};
const GUEST = ['keygen', '--name=routes guest', '--tier=guest', '--providers=echo'];

// The tests of one server. ctx (filled by the caller's before()): server ({url(p), token}:
// what curl needs), guest (olp-keys' key), user and uid (whom the workers must run as),
// workerPids().
function routeTests(ctx) {
  const post = (p, body, auth) =>
    curl(ctx.server, { method: 'POST', path: p, auth, headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify(body) });
  const msg = (model, content) => ({ model, max_tokens: 64, messages: [{ role: 'user', content }] });
  const guestAuth = () => `Bearer ${ctx.guest.token}`;

  test(`the workers run as ${ctx.user}`, () => {
    const pids = ctx.workerPids();
    assert.ok(pids.length > 0);
    for (const pid of pids) assert.equal(uidOf(pid), ctx.uid, `worker ${pid}`);
  });

  test('no key: 401, in Anthropic\'s shape on the Messages routes and OpenAI\'s on /v1/responses', async () => {
    isAnthropicError(await post('/v1/messages', msg('echo', 'x'), false), 401, 'authentication_error');
    isAnthropicError(await post('/v1/messages/count_tokens', msg('echo', 'x'), false), 401, 'authentication_error');
    // OLP's own types on the OpenAI side, as on /v1/chat/completions.
    isOpenAIError(await post('/v1/responses', { model: 'echo', input: 'x' }, false), 401, 'auth_required', 'auth_required');
    // A key that is no key is refused the same way (x-api-key, as the Anthropic SDK sends it).
    const bad = await curl(ctx.server, { method: 'POST', path: '/v1/messages', auth: false,
      headers: { 'Content-Type': 'application/json', 'x-api-key': 'olp_not_a_key' }, body: JSON.stringify(msg('echo', 'x')) });
    isAnthropicError(bad, 401, 'authentication_error');
    isOpenAIError(await post('/v1/responses', { model: 'echo', input: 'x' }, 'Bearer olp_not_a_key'), 401,
      'invalid_or_revoked_key', 'invalid_or_revoked_key');
  });

  test('the owner key: served on every route', async () => {
    const m = await post('/v1/messages', msg('other', 'owner via messages'), true);
    assert.equal(m.status, 200, m.text);
    assert.equal(m.json.type, 'message');
    assert.equal(m.json.role, 'assistant');
    assert.equal(m.json.content[0].text, 'owner via messages');
    const c = await post('/v1/messages/count_tokens', msg('other', 'x'.repeat(40)), true);
    assert.equal(c.status, 200, c.text);
    assert.deepEqual(Object.keys(c.json), ['input_tokens']);
    assert.ok(c.json.input_tokens >= 10, c.text);
    const r = await post('/v1/responses', { model: 'other', input: 'owner via responses' }, true);
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.object, 'response');
    assert.equal(r.json.status, 'completed');
    assert.equal(responseText(r), 'owner via responses');
  });

  test('a guest key: served for its provider, 403 for another, in each API\'s shape', async () => {
    const m = await post('/v1/messages', msg('echo', 'guest via messages'), guestAuth());
    assert.equal(m.status, 200, m.text);
    assert.equal(m.json.content[0].text, 'guest via messages');
    const c = await post('/v1/messages/count_tokens', msg('echo', 'x'.repeat(8)), guestAuth());
    assert.equal(c.status, 200, c.text);
    assert.equal(c.json.input_tokens, 2);
    const r = await post('/v1/responses', { model: 'echo', input: 'guest via responses' }, guestAuth());
    assert.equal(r.status, 200, r.text);
    assert.equal(responseText(r), 'guest via responses');

    isAnthropicError(await post('/v1/messages', msg('other', 'x'), guestAuth()), 403, 'permission_error');
    isAnthropicError(await post('/v1/messages/count_tokens', msg('other', 'x'), guestAuth()), 403, 'permission_error');
    isOpenAIError(await post('/v1/responses', { model: 'other', input: 'x' }, guestAuth()), 403,
      'key_no_provider_access', 'key_no_provider_access');
  });

  test('a bad body: 400 naming the field, in each API\'s shape, for a guest too', async () => {
    const m = await post('/v1/messages', { ...msg('echo', 'x'), frobnicate: 1 }, guestAuth());
    isAnthropicError(m, 400, 'invalid_request_error');
    assert.match(m.json.error.message, /^frobnicate: unknown field/);
    const r = await post('/v1/responses', { model: 'echo', input: 'x', frobnicate: 1 }, guestAuth());
    isOpenAIError(r, 400, 'invalid_request_error');
    assert.equal(r.json.error.param, 'frobnicate');
    assert.match(r.json.error.message, /^Unrecognized request argument supplied: frobnicate/);
  });
}

for (const id of identities()) {
  describe(`/v1/messages, /v1/messages/count_tokens and /v1/responses, workers as ${id.name}`, () => {
    const ctx = { user: id.name, uid: id.uid };
    let server;

    before(async () => {
      const dirs = makeHome({ registry: REGISTRY, config: testConfig() });
      // Made before the server starts: startServer gives OLP_HOME to the workers' user.
      ctx.guest = olpKeys(dirs.home, ...GUEST);
      server = await startServer({ dirs, stage: id.user ? stageFor(id.user) : null, maxProcs: 2 });
      ctx.server = server;
      ctx.workerPids = () => server.workerPids();
    });

    after(async () => {
      await server?.stop();
    });

    routeTests(ctx);
  });
}

// deploy/olp-local serve started as root, as it_serve starts it: lighttpd and the workers
// run as the system user olp, from a stage of root-owned copies.
const notRoot = process.getuid() === 0 ? false : 'not root: serve runs its workers as olp only when started by root';
describe('the same routes behind deploy/olp-local serve started as root (workers as olp)', { skip: notRoot }, () => {
  const ctx = { user: 'olp' };
  const home = path.join(serveRoot('olp-routes-serve-'), 'home');
  let serve;

  before(async () => {
    fs.mkdirSync(home, { mode: 0o700 });
    fs.writeFileSync(path.join(home, 'models-registry.json'), JSON.stringify(REGISTRY), { mode: 0o600 });
    fs.writeFileSync(path.join(home, 'config.json'), JSON.stringify(testConfig()), { mode: 0o600 });
    ctx.guest = olpKeys(home, ...GUEST);
    const token = 'olp_test_' + Math.random().toString(36).slice(2) + Math.random().toString(36).slice(2);
    serve = await startServe(home, [], { env: { OLP_OWNER_TOKEN: token }, stopMs: 10000, goneMs: 5000 });
    ctx.server = { url: serve.url, token };
    ctx.uid = Number(spawnSync('id', ['-u', 'olp'], { encoding: 'utf8' }).stdout.trim());
    ctx.workerPids = () =>
      procsMentioning(home).filter((p) => path.basename(p.cmdline.split(' ')[0] ?? '') === 'olp-fcgi').map((p) => p.pid);
  });

  after(async () => {
    await serve?.stop(); // Ctrl-C, as it_serve stops it; nothing naming OLP_HOME left
  });

  routeTests(ctx);
});

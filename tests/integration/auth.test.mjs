// Keys, tiers and the audit log over HTTP (issue 3), through a real lighttpd with
// lighttpd/olp.conf and a pool of olp-fcgi workers: owner, guest and env-owner keys,
// anonymous access on and off, the token's two headers, 401/403 shapes, /health
// trimming, auth.owner_only_endpoints, a revocation seen by every worker process on its
// very next request, providers_enabled, last_used_at, the audit log, and a key store
// written by hand in the Node OLP's format.
//
// Keys are made with the real olp-keys (OLP_KEYS, set by CTest), as an operator would.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';

import { fcgiRequest, fcgiRequestsKept } from './fcgi-client.mjs';
import { cfg, chatBody, curl, freePort, jsonOrUndefined, makeHome, olpKeys, Server, testConfig, waitFor } from './harness.mjs';

const MSG_REQUIRED = 'OLP API key required. Pass via "Authorization: Bearer <token>" or "x-api-key: <token>".';
const MSG_INVALID = 'OLP API key is invalid or has been revoked.';
const AUDIT_FIELDS = [
  'ts',
  'key_id',
  'owner_tier',
  'method',
  'path',
  'provider',
  'model',
  'status_code',
  'latency_ms',
  'error_code',
  'request_id',
].sort();

// The error types of a request answered without an identity.
const UNAUTH_TYPES = new Set(['auth_required', 'invalid_or_revoked_key', 'not_found', 'method_not_allowed']);

const keygen = (home, ...args) => olpKeys(home, 'keygen', ...args);
const keyInfo = (home, id) => olpKeys(home, 'list', '--include-revoked').find((k) => k.id === id);

// Every token this file ever sends: none may reach the audit log or the workers' log.
const allTokens = new Set();
const remember = (t) => {
  allTokens.add(t);
  return t;
};

// ---------------------------------------------------------------------------
// A server whose OLP_HOME is prepared (keys, fixture store) before lighttpd starts, and
// which is ready as soon as /health/live answers and every worker runs.
// Every X-Request-Id seen from it is kept in server.rids; those of requests refused without
// an identity (401, or a route that takes none) in server.unauthRids too: the audit log
// counts those in a summary line instead of a line each (issue 22, ADR 0026).

function workerEnv() {
  const env = { PATH: process.env.PATH ?? '/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin' };
  for (const k of ['HOME', 'LANG', 'TZ', 'ASAN_OPTIONS', 'UBSAN_OPTIONS', 'LSAN_OPTIONS'])
    if (process.env[k] !== undefined) env[k] = process.env[k];
  return env;
}

async function startAuthServer({ config = testConfig(), ownerToken = null, maxProcs = 2, threads = 2, prepare } = {}) {
  let lastErr;
  for (let attempt = 0; attempt < 3; attempt++) {
    const dirs = makeHome({ config });
    const prepared = prepare ? prepare(dirs.home) : undefined;
    const port = await freePort();
    const output = [];
    const child = spawn(cfg.lighttpd, ['-D', '-f', cfg.conf], {
      env: {
        ...workerEnv(),
        OLP_PORT: String(port),
        OLP_BIN: cfg.bin,
        OLP_HOME: dirs.home,
        OLP_RUN_DIR: dirs.runDir,
        OLP_MAX_PROCS: String(maxProcs),
        OLP_THREADS: String(threads),
        OLP_LOG_LEVEL: 'debug',
        ...(ownerToken ? { OLP_OWNER_TOKEN: ownerToken } : {}),
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    child.stdout.on('data', (d) => output.push(d));
    child.stderr.on('data', (d) => output.push(d));
    const server = new Server({ dirs, token: ownerToken, port, child, output });
    server.rids = [];
    server.unauthRids = new Set();
    server.prepared = prepared;
    const ready = await waitFor(
      async () => {
        if (child.exitCode !== null || child.signalCode !== null) return 'exited';
        try {
          // /health/live: no audit row for its 200 (fcgi/health.c). A probe given up on
          // (the 2 s abort, on a loaded machine) is still answered, and a /health would
          // then leave an audit row whose request id the audit test never saw.
          const r = await fetch(server.url('/health/live'), { signal: AbortSignal.timeout(2000) });
          await r.arrayBuffer();
          if (r.status === 200 && server.workerPids().length >= maxProcs) return 'up';
        } catch {
          /* not yet */
        }
        return null;
      },
      { timeoutMs: 20000, stepMs: 100 },
    );
    if (ready === 'up') return server;
    lastErr = new Error(`lighttpd did not come up (${ready ?? 'timeout'}) on ${port}:\n${server.errorLog()}`);
    await server.stop().catch(() => {});
    if (ready !== 'exited') break;
  }
  throw lastErr;
}

function reqHeaders({ token, authz, xkey, body }) {
  const headers = {};
  if (token !== undefined) headers.authorization = `Bearer ${token}`;
  if (authz !== undefined) headers.authorization = authz;
  if (xkey !== undefined) headers['x-api-key'] = xkey;
  if (body !== undefined) headers['content-type'] = 'application/json';
  return headers;
}

function keepRid(server, res) {
  const { rid, status, json } = res;
  if (rid) server.rids.push(rid);
  if (rid && status >= 400 && status < 500 && UNAUTH_TYPES.has(json?.error?.type)) server.unauthRids.add(rid);
  return res;
}

// One request with fetch. token: a bearer token; authz: a raw Authorization value;
// xkey: an x-api-key value. Returns {status, headers, text, json, rid}.
async function req(server, p, opts = {}) {
  const { method = 'GET', body } = opts;
  const r = await fetch(server.url(p), {
    method,
    headers: reqHeaders(opts),
    body: body === undefined ? undefined : JSON.stringify(body),
    signal: AbortSignal.timeout(60000),
  });
  const text = await r.text();
  const json = jsonOrUndefined(text);
  return keepRid(server, { status: r.status, headers: r.headers, text, json, rid: r.headers.get('x-request-id') });
}

// The same request to one worker process: over its own FastCGI socket (fcgi-client.mjs),
// not through lighttpd, which picks a worker as it likes.
async function reqWorker(server, sock, p, opts = {}) {
  const { method = 'GET', body } = opts;
  const res = await fcgiRequest(sock, {
    method,
    uri: p,
    headers: reqHeaders(opts),
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return keepRid(server, res);
}

function assertError(res, status, type, message) {
  assert.equal(res.status, status, `expected ${status}, got ${res.status}: ${res.text}`);
  assert.match(res.headers.get('content-type') ?? '', /^application\/json/);
  assert.equal(res.json?.error?.type, type, res.text);
  assert.equal(res.json.error.code, type, res.text);
  if (message !== undefined) assert.equal(res.json.error.message, message);
  assert.ok(res.rid, 'X-Request-Id missing');
}

function assertTrimmedHealth(res) {
  assert.equal(res.status, 200, res.text);
  assert.deepEqual(Object.keys(res.json).sort(), ['ok', 'version'], `trimmed /health expected: ${res.text}`);
  assert.equal(res.json.ok, true);
  assert.equal(typeof res.json.version, 'string');
}

function assertFullHealth(res) {
  assert.equal(res.status, 200, res.text);
  assert.equal(res.json.ok, true);
  assert.equal(typeof res.json.version, 'string');
  assert.ok(res.json.providers?.echo, `providers missing: ${res.text}`);
  assert.ok(res.json.sandbox && typeof res.json.sandbox.available === 'boolean', `sandbox missing: ${res.text}`);
  assert.equal(typeof res.json.audit_failures, 'number', res.text);
}

// The workers' JSON "request" lines (olp.log), by request id.
function requestLines(server) {
  const byRid = new Map();
  let text = '';
  try {
    text = fs.readFileSync(path.join(server.runDir, 'olp.log'), 'utf8');
  } catch {
    return byRid;
  }
  for (const l of text.split('\n')) {
    if (!l.startsWith('{')) continue;
    try {
      const j = JSON.parse(l);
      if (j.event === 'request' && j.request_id) byRid.set(j.request_id, j);
    } catch {
      /* not one of ours */
    }
  }
  return byRid;
}

// The worker pid that served each of rids (from its log line).
async function servingPids(server, rids) {
  let lines;
  await waitFor(
    () => {
      lines = requestLines(server);
      return rids.every((r) => lines.has(r));
    },
    { timeoutMs: 5000 },
  );
  return rids.map((r) => {
    const l = lines.get(r);
    assert.ok(l, `no log line for request ${r}`);
    assert.equal(typeof l.pid, 'number');
    return l.pid;
  });
}

// Send the request p (opts as req's) to every worker process, one each, over the worker's
// own socket; check that the log line of each request names the worker it was sent to.
// Returns {out: [{res, pid}], workers}: workers the pids of every worker process, each of
// which got exactly one request.
async function eachWorker(server, p, opts) {
  const workers = server.workerPids();
  const socks = server.workerSockets();
  assert.deepEqual(
    socks.map((s) => s.pid),
    workers,
    `not one socket per worker: ${JSON.stringify(socks)}; workers ${workers.join(', ')}`,
  );
  const out = [];
  for (const { sock, pid } of socks) out.push({ res: await reqWorker(server, sock, p, opts), pid });
  const logged = await servingPids(
    server,
    out.map(({ res }) => res.rid),
  );
  assert.deepEqual(logged, workers, 'a request was not served by the worker whose socket it was sent to');
  return { out, workers };
}

function auditLines(server) {
  const f = path.join(server.home, 'logs', 'audit.ndjson');
  const text = fs.existsSync(f) ? fs.readFileSync(f, 'utf8') : '';
  return { file: f, text, rows: text.split('\n').filter(Boolean).map((l) => JSON.parse(l)) };
}

function newToken() {
  return remember('olp_' + randomBytes(32).toString('base64url'));
}

// ===========================================================================
// Stored keys, the env owner, anonymous off: 3 worker processes.

describe('stored keys, env owner, anonymous off (3 workers)', () => {
  let srv;
  let k; // keys made before start: owner, guest (echo only), guest (all), revokee, never-used
  const envOwner = newToken();
  const prompt = `PROMPT-MARKER-${randomBytes(8).toString('hex')}`;

  before(async () => {
    srv = await startAuthServer({
      maxProcs: 3,
      threads: 2,
      ownerToken: envOwner,
      prepare: (home) => ({
        owner: keygen(home, '--owner'),
        guest: keygen(home, '--name=alice', '--tier=guest', '--providers=echo'),
        guestAll: keygen(home, '--name=bob', '--tier=guest'),
        revokee: keygen(home, '--name=carol', '--tier=guest'),
        unused: keygen(home, '--name=dave', '--tier=guest'),
      }),
    });
    k = srv.prepared;
    for (const v of Object.values(k)) remember(v.token);
  });

  after(async () => {
    await srv?.stop();
  });

  it('the owner key: /v1/models, a completion, full /health', async () => {
    const m = await req(srv, '/v1/models', { token: k.owner.token });
    assert.equal(m.status, 200, m.text);
    assert.ok(m.json.data.some((x) => x.id === 'echo'));
    const c = await req(srv, '/v1/chat/completions', { method: 'POST', token: k.owner.token, body: chatBody('echo', prompt) });
    assert.equal(c.status, 200, c.text);
    assert.match(c.json.choices[0].message.content, new RegExp(prompt));
    assertFullHealth(await req(srv, '/health', { token: k.owner.token }));
  });

  // A web server that keeps its FastCGI connections (FCGI_KEEP_CONN): each answer whole
  // and ended (its END_REQUEST), the connection still open for the next request.
  it('three requests on one kept FastCGI connection: each answered whole', async () => {
    const { sock } = srv.workerSockets()[0];
    const token = k.owner.token;
    const out = await fcgiRequestsKept(sock, [
      { uri: '/health', headers: reqHeaders({ token }) },
      { uri: '/v1/models', headers: reqHeaders({ token }) },
      { uri: '/v1/nope', headers: reqHeaders({ token }) },
    ]);
    for (const r of out) keepRid(srv, r);
    assertFullHealth(out[0]);
    assert.equal(out[1].status, 200, out[1].text);
    assert.ok(out[1].json.data.some((x) => x.id === 'echo'), out[1].text);
    assert.equal(out[2].status, 404, out[2].text);
    assert.equal(new Set(out.map((r) => r.rid)).size, 3);
  });

  it('the env owner (OLP_OWNER_TOKEN): full /health, every provider', async () => {
    assertFullHealth(await req(srv, '/health', { token: envOwner }));
    const c = await req(srv, '/v1/chat/completions', { method: 'POST', token: envOwner, body: chatBody('ticker') });
    assert.equal(c.status, 200, c.text);
    assert.equal((await req(srv, '/v1/models', { token: envOwner })).status, 200);
  });

  it('a guest key: /v1/models and its provider; trimmed /health', async () => {
    assert.equal((await req(srv, '/v1/models', { token: k.guest.token })).status, 200);
    const c = await req(srv, '/v1/chat/completions', { method: 'POST', token: k.guest.token, body: chatBody('echo', 'hi') });
    assert.equal(c.status, 200, c.text);
    assertTrimmedHealth(await req(srv, '/health', { token: k.guest.token }));
    assertTrimmedHealth(await req(srv, '/health', { token: k.guestAll.token }));
  });

  it('no token: trimmed /health; 401 auth_required elsewhere (anonymous is off)', async () => {
    assertTrimmedHealth(await req(srv, '/health'));
    assertError(await req(srv, '/v1/models'), 401, 'auth_required', MSG_REQUIRED);
    assertError(
      await req(srv, '/v1/chat/completions', { method: 'POST', body: chatBody('echo') }),
      401,
      'auth_required',
      MSG_REQUIRED,
    );
    // An empty or blank credential is no credential.
    assertError(await req(srv, '/v1/models', { authz: 'Bearer ' }), 401, 'auth_required', MSG_REQUIRED);
    assertError(await req(srv, '/v1/models', { xkey: '' }), 401, 'auth_required', MSG_REQUIRED);
  });

  it('a wrong token: 401 invalid_or_revoked_key, on /health too', async () => {
    const wrong = newToken();
    for (const p of ['/v1/models', '/health']) {
      assertError(await req(srv, p, { token: wrong }), 401, 'invalid_or_revoked_key', MSG_INVALID);
      assertError(await req(srv, p, { xkey: wrong }), 401, 'invalid_or_revoked_key', MSG_INVALID);
    }
    assertError(await req(srv, '/v1/models', { token: remember('not-even-a-token') }), 401, 'invalid_or_revoked_key', MSG_INVALID);
    // A prefix or an extension of a real token is not the token.
    const t = k.guestAll.token;
    assertError(await req(srv, '/v1/models', { token: t.slice(0, -1) }), 401, 'invalid_or_revoked_key');
    assertError(await req(srv, '/v1/models', { token: t + 'x' }), 401, 'invalid_or_revoked_key');
    assertError(
      await req(srv, '/v1/chat/completions', { method: 'POST', token: wrong, body: chatBody('echo') }),
      401,
      'invalid_or_revoked_key',
      MSG_INVALID,
    );
  });

  it('Bearer is case-insensitive; x-api-key works; Authorization wins over x-api-key', async () => {
    const t = k.guestAll.token;
    for (const authz of [`Bearer ${t}`, `bearer ${t}`, `BEARER ${t}`, `bEaReR ${t}`, `Bearer   ${t}  `]) {
      const r = await req(srv, '/v1/models', { authz });
      assert.equal(r.status, 200, `${JSON.stringify(authz.replace(t, 'TOKEN'))}: ${r.text}`);
    }
    assert.equal((await req(srv, '/v1/models', { xkey: t })).status, 200);
    assert.equal((await req(srv, '/v1/models', { xkey: ` ${t} ` })).status, 200);
    // Real curl, the other header spellings a client sends.
    const c1 = await curl(srv, { path: '/v1/models', auth: `bearer ${t}` });
    assert.equal(c1.status, 200, c1.text);
    srv.rids.push(c1.headers['x-request-id']);
    const c2 = await curl(srv, { path: '/v1/models', auth: false, headers: { 'X-API-Key': t } });
    assert.equal(c2.status, 200, c2.text);
    srv.rids.push(c2.headers['x-request-id']);
    // Both headers: the Authorization bearer token decides.
    assert.equal((await req(srv, '/v1/models', { token: t, xkey: newToken() })).status, 200);
    assertError(await req(srv, '/v1/models', { token: newToken(), xkey: t }), 401, 'invalid_or_revoked_key');
    // Another scheme is not a bearer token.
    assert.equal((await req(srv, '/v1/models', { authz: `Basic ${t}` })).status, 401);
  });

  it('providers_enabled: 403 key_no_provider_access naming both lists', async () => {
    const r = await req(srv, '/v1/chat/completions', { method: 'POST', token: k.guest.token, body: chatBody('ticker', 'x') });
    assertError(r, 403, 'key_no_provider_access');
    assert.match(r.json.error.message, /\[echo\]/, r.json.error.message);
    assert.match(r.json.error.message, /\[ticker\]/, r.json.error.message);
    assert.match(r.json.error.message, /'ticker'/, r.json.error.message);
    // The same model is fine for a key with "*", and the allowed one for the guest.
    assert.equal(
      (await req(srv, '/v1/chat/completions', { method: 'POST', token: k.guestAll.token, body: chatBody('ticker') })).status,
      200,
    );
    // An alias resolves to its provider before the check.
    assert.equal(
      (await req(srv, '/v1/chat/completions', { method: 'POST', token: k.guest.token, body: chatBody('echo-alias') })).status,
      200,
    );
  });

  it('a key made while the workers run works at once in every worker', async () => {
    const late = keygen(srv.home, '--name=erin', '--tier=guest', '--providers=echo');
    remember(late.token);
    const { out, workers } = await eachWorker(srv, '/v1/models', { token: late.token });
    assert.equal(workers.length, 3);
    for (const { res, pid } of out) assert.equal(res.status, 200, `worker ${pid} refuses the new key: ${res.text}`);
  });

  it('a key revoked with olp-keys fails on the very next request in every worker process', async () => {
    const t = k.revokee.token;
    const before = srv.workerPids();
    assert.equal(before.length, 3);
    // Every worker has accepted the key (and cached it) ...
    const warm = await eachWorker(srv, '/v1/models', { token: t });
    assert.deepEqual(warm.workers, before);
    for (const { res, pid } of warm.out) assert.equal(res.status, 200, `worker ${pid}: ${res.text}`);
    // ... and recorded a use: last_used_at is written after the answer, by a thread of the
    // worker, and never once the key is revoked, so revoking at once could beat it.
    const used = await waitFor(() => keyInfo(srv.home, k.revokee.id).last_used_at, { timeoutMs: 10000, stepMs: 100 });
    assert.ok(used, 'last_used_at not written within 10 s of the uses');

    const rv = olpKeys(srv.home, 'revoke', `--id=${k.revokee.id}`);
    assert.equal(rv.revoked, true);

    // ... and the very first request after the revocation fails, whichever worker gets it,
    const first = await req(srv, '/v1/models', { token: t });
    assertError(first, 401, 'invalid_or_revoked_key', MSG_INVALID);
    // and so does every later one, in every worker process.
    const post = await eachWorker(srv, '/health', { token: t });
    assert.deepEqual(post.workers, before);
    for (const { res, pid } of post.out) {
      assert.equal(res.status, 401, `worker ${pid} still accepts the revoked key: ${res.text}`);
      assertError(res, 401, 'invalid_or_revoked_key', MSG_INVALID);
    }
    // x-api-key and a completion too.
    assertError(await req(srv, '/v1/models', { xkey: t }), 401, 'invalid_or_revoked_key');
    assertError(
      await req(srv, '/v1/chat/completions', { method: 'POST', token: t, body: chatBody('echo') }),
      401,
      'invalid_or_revoked_key',
    );
    assert.deepEqual(srv.workerPids(), before, 'the workers were restarted: the test proves nothing');

    // The revocation stays: no last_used_at update (the other workers' may still be
    // queued) undid it, and none came after it.
    await sleep(1500);
    const info = keyInfo(srv.home, k.revokee.id);
    assert.ok(info.revoked_at, 'revoked_at was undone');
    assert.ok(info.last_used_at, 'last_used_at of the uses before the revocation was lost');
    assert.ok(info.last_used_at <= info.revoked_at, `last_used_at ${info.last_used_at} after revoked_at ${info.revoked_at}`);
  });

  it('last_used_at: written after the first use; never for a revoked key or the env owner', async () => {
    const t0 = new Date(Date.now() - 2000).toISOString();
    const g = keygen(srv.home, '--name=frank', '--tier=guest');
    remember(g.token);
    assert.equal(keyInfo(srv.home, g.id).last_used_at, null);
    assert.equal((await req(srv, '/v1/models', { token: g.token })).status, 200);
    const used = await waitFor(() => keyInfo(srv.home, g.id).last_used_at, { timeoutMs: 10000, stepMs: 200 });
    assert.ok(used, 'last_used_at not written within 10 s of the first use');
    assert.match(used, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
    assert.ok(used >= t0, `last_used_at ${used} is older than the request (${t0})`);
    // The manifest stays as olp-keys wrote it otherwise (0600 in a 0700 directory).
    const dir = path.join(srv.home, 'keys', g.id);
    assert.equal(fs.statSync(dir).mode & 0o777, 0o700);
    assert.equal(fs.statSync(path.join(dir, 'manifest.json')).mode & 0o777, 0o600);

    // A key revoked before it was ever used never gets one.
    olpKeys(srv.home, 'revoke', `--id=${k.unused.id}`);
    const manifest = path.join(srv.home, 'keys', k.unused.id, 'manifest.json');
    const bytes = fs.readFileSync(manifest, 'utf8');
    for (let i = 0; i < 6; i++) assertError(await req(srv, '/v1/models', { token: k.unused.token }), 401, 'invalid_or_revoked_key');
    await sleep(2000);
    assert.equal(keyInfo(srv.home, k.unused.id).last_used_at, null);
    assert.equal(fs.readFileSync(manifest, 'utf8'), bytes, 'a revoked key\'s manifest was rewritten');
    // The env owner has no manifest: nothing appears in keys/ for it.
    assert.ok(!fs.existsSync(path.join(srv.home, 'keys', '__env_owner__')));
  });

  it('a token in the query string is not a credential and never reaches the audit log', async () => {
    const t = k.guestAll.token;
    assertError(await req(srv, `/v1/models?api_key=${t}`), 401, 'auth_required');
    const r = await req(srv, `/v1/models?api_key=${t}`, { token: t });
    assert.equal(r.status, 200);
  });

  it('the audit log: one row per API request with an identity, a summary of the others, the issue\'s fields, no token, no prompt, 0600', async () => {
    const rids = [...srv.rids];
    const unauth = new Set(srv.unauthRids);
    assert.ok(rids.length > 50, `only ${rids.length} requests recorded`);
    assert.ok(unauth.size > 5, `only ${unauth.size} requests without an identity`);
    let a;
    let rows;
    await waitFor(
      () => {
        a = auditLines(srv);
        rows = a.rows.filter((r) => !r.event);
        return rows.length >= rids.length - unauth.size;
      },
      { timeoutMs: 5000 },
    );
    assert.equal(fs.statSync(a.file).mode & 0o777, 0o600, 'audit.ndjson mode');
    assert.equal(fs.statSync(path.dirname(a.file)).mode & 0o777, 0o700, 'logs/ mode');
    // Exactly one row per request this test sent with an identity, none for the others,
    // and no other row.
    const count = new Map();
    for (const row of rows) count.set(row.request_id, (count.get(row.request_id) ?? 0) + 1);
    for (const rid of rids)
      assert.equal(count.get(rid) ?? 0, unauth.has(rid) ? 0 : 1, `request ${rid}: ${count.get(rid) ?? 0} audit rows`);
    assert.equal(rows.length, rids.length - unauth.size, 'audit rows for requests this test did not send');
    // The others: counted in summary lines (at most one per worker a minute, and the rest
    // when a worker stops), by status.
    const summaries = a.rows.filter((r) => r.event === 'unauthenticated_summary');
    assert.ok(summaries.length >= 1, 'no summary of the requests without an identity');
    const summarised = summaries.reduce((n, r) => n + r.count, 0);
    assert.ok(summarised >= 1 && summarised <= unauth.size, `${summarised} summarised of ${unauth.size}`);
    assert.ok(summaries.some((r) => r.key_id === null && r.owner_tier === 'none' && r.statuses['401'] >= 1), JSON.stringify(summaries));
    for (const row of rows) {
      assert.deepEqual(Object.keys(row).sort(), AUDIT_FIELDS, JSON.stringify(row));
      assert.match(row.ts, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$/);
      assert.equal(typeof row.status_code, 'number');
      assert.equal(typeof row.latency_ms, 'number');
      assert.ok(!row.path.includes('?'), `query string kept: ${row.path}`);
    }
    const byRid = new Map(rows.map((r) => [r.request_id, r]));
    // Spot checks against what happened.
    const chats = rows.filter((r) => r.path === '/v1/chat/completions' && r.status_code === 200);
    assert.ok(chats.some((r) => r.key_id === k.owner.id && r.owner_tier === 'owner' && r.provider === 'echo' && r.model === 'echo'));
    assert.ok(chats.some((r) => r.key_id === '__env_owner__' && r.owner_tier === 'owner' && r.provider === 'ticker'));
    assert.ok(chats.some((r) => r.key_id === k.guest.id && r.owner_tier === 'guest' && r.method === 'POST'));
    assert.ok(a.rows.some((r) => r.status_code === 403 && r.error_code === 'key_no_provider_access' && r.key_id === k.guest.id));
    assert.ok(a.rows.some((r) => r.path === '/health' && r.method === 'GET' && r.status_code === 200));
    assert.ok(byRid.size === rids.length - unauth.size);
    // Never a token (any of them, right or wrong), never a prompt.
    for (const t of allTokens) assert.ok(!a.text.includes(t), 'a token is in the audit log');
    assert.ok(!a.text.includes(prompt), 'prompt text is in the audit log');
    // Nor in the workers' own log (at debug level).
    const wlog = srv.errorLog();
    assert.ok(wlog.includes('"event":"request"'), 'no request lines in the workers\' log');
    for (const t of allTokens) assert.ok(!wlog.includes(t), 'a token is in the workers\' log');
    assert.ok(!wlog.includes(prompt), 'prompt text is in the workers\' log');
    for (const v of Object.values(k)) {
      const m = JSON.parse(fs.readFileSync(path.join(srv.home, 'keys', v.id, 'manifest.json'), 'utf8'));
      assert.ok(!wlog.includes(m.token_hash) && !a.text.includes(m.token_hash), 'a token hash is in a log');
    }
  });
});

// ===========================================================================
// Anonymous on.

describe('anonymous on (auth.allow_anonymous true), no env owner', () => {
  let srv;
  let guest;

  before(async () => {
    srv = await startAuthServer({
      config: { ...testConfig(), auth: { allow_anonymous: true } },
      prepare: (home) => keygen(home, '--name=gina', '--tier=guest'),
    });
    guest = srv.prepared;
    remember(guest.token);
  });

  after(async () => {
    await srv?.stop();
  });

  it('no token: the shared __anonymous__ identity, trimmed /health', async () => {
    assertTrimmedHealth(await req(srv, '/health'));
    const m = await req(srv, '/v1/models');
    assert.equal(m.status, 200, m.text);
    const c = await req(srv, '/v1/chat/completions', { method: 'POST', body: chatBody('echo', 'anon') });
    assert.equal(c.status, 200, c.text);
    await waitFor(() => auditLines(srv).rows.some((r) => r.request_id === c.rid), { timeoutMs: 3000 });
    const row = auditLines(srv).rows.find((r) => r.request_id === c.rid);
    assert.equal(row.key_id, '__anonymous__');
    assert.equal(row.owner_tier, 'anonymous');
    assert.ok(!fs.existsSync(path.join(srv.home, 'keys', '__anonymous__')), 'no manifest for __anonymous__');
  });

  it('a wrong token is still 401, never anonymous', async () => {
    const wrong = newToken();
    assertError(await req(srv, '/v1/models', { token: wrong }), 401, 'invalid_or_revoked_key', MSG_INVALID);
    assertError(await req(srv, '/health', { xkey: wrong }), 401, 'invalid_or_revoked_key', MSG_INVALID);
  });

  it('a stored key is still itself; no owner here means no full /health', async () => {
    assertTrimmedHealth(await req(srv, '/health', { token: guest.token }));
    const m = await req(srv, '/v1/models', { token: guest.token });
    assert.equal(m.status, 200);
    // Without OLP_OWNER_TOKEN, the old env owner token is nobody.
    assertError(await req(srv, '/v1/models', { token: 'olp_test_not_set' }), 401, 'invalid_or_revoked_key');
  });
});

// ===========================================================================
// auth.owner_only_endpoints, with anonymous access off and on: without a token the caller
// is nobody (401) or the anonymous identity, which is not the owner (403).

for (const anonymous of [false, true]) {
  describe(`auth.owner_only_endpoints (anonymous ${anonymous ? 'on' : 'off'})`, () => {
    let srv;
    let k;
    const envOwner = newToken();

    before(async () => {
      srv = await startAuthServer({
        ownerToken: envOwner,
        config: { ...testConfig(), auth: { allow_anonymous: anonymous, owner_only_endpoints: ['/v1/models', '/health'] } },
        prepare: (home) => ({
          owner: keygen(home, '--owner'),
          guest: keygen(home, '--name=hank', '--tier=guest'),
        }),
      });
      k = srv.prepared;
      remember(k.owner.token);
      remember(k.guest.token);
    });

    after(async () => {
      await srv?.stop();
    });

    it('owner keys (stored and env) pass; guests get 403 owner_only; a bad token 401', async () => {
      for (const p of ['/v1/models', '/health']) {
        assert.equal((await req(srv, p, { token: k.owner.token })).status, 200, p);
        assert.equal((await req(srv, p, { token: envOwner })).status, 200, p);
        assertError(await req(srv, p, { token: k.guest.token }), 403, 'owner_only');
        assertError(await req(srv, p, { xkey: k.guest.token }), 403, 'owner_only');
        if (anonymous) assertError(await req(srv, p), 403, 'owner_only');
        else assertError(await req(srv, p), 401, 'auth_required', MSG_REQUIRED);
        assertError(await req(srv, p, { token: newToken() }), 401, 'invalid_or_revoked_key', MSG_INVALID);
      }
      assertFullHealth(await req(srv, '/health', { token: k.owner.token }));
    });

    it('an endpoint not listed is not restricted', async () => {
      const c = await req(srv, '/v1/chat/completions', { method: 'POST', token: k.guest.token, body: chatBody('echo') });
      assert.equal(c.status, 200, c.text);
      const a = await req(srv, '/v1/chat/completions', { method: 'POST', body: chatBody('echo') });
      if (anonymous) assert.equal(a.status, 200, a.text);
      else assertError(a, 401, 'auth_required', MSG_REQUIRED);
    });
  });
}

// ===========================================================================
// A key store written by hand in the Node OLP's format.

const FIXTURE = path.join(cfg.sourceDir, 'tests', 'auth', 'fixtures', 'node-home');

function fixtureTokens() {
  const out = {};
  for (const l of fs.readFileSync(path.join(FIXTURE, 'TOKENS.txt'), 'utf8').split('\n')) {
    const m = /^([a-z0-9_-]{8}) (olp_\S+)$/.exec(l.trim());
    if (m) out[m[1]] = remember(m[2]);
  }
  return out;
}

// Copy the fixture's keys/ as an operator copies a home: the same bytes, private modes.
function copyFixtureKeys(home) {
  const src = path.join(FIXTURE, 'keys');
  const dst = path.join(home, 'keys');
  fs.mkdirSync(dst, { mode: 0o700 });
  for (const id of fs.readdirSync(src)) {
    fs.mkdirSync(path.join(dst, id), { mode: 0o700 });
    fs.copyFileSync(path.join(src, id, 'manifest.json'), path.join(dst, id, 'manifest.json'));
    fs.chmodSync(path.join(dst, id, 'manifest.json'), 0o600);
  }
}

describe('a Node OLP key store (tests/auth/fixtures/node-home), as is', () => {
  let srv;
  const tok = fixtureTokens();

  before(async () => {
    assert.deepEqual(Object.keys(tok).sort(), ['gu3st0k1', 'own3r0k1', 'r3vok3d1']);
    srv = await startAuthServer({ prepare: copyFixtureKeys });
  });

  after(async () => {
    await srv?.stop();
  });

  it('its owner is the owner, its guest a guest limited to its providers, its revoked key refused', async () => {
    assertFullHealth(await req(srv, '/health', { token: tok.own3r0k1 }));
    const oc = await req(srv, '/v1/chat/completions', { method: 'POST', token: tok.own3r0k1, body: chatBody('echo') });
    assert.equal(oc.status, 200, oc.text);
    assertTrimmedHealth(await req(srv, '/health', { token: tok.gu3st0k1 }));
    assert.equal((await req(srv, '/v1/models', { xkey: tok.gu3st0k1 })).status, 200);
    const g = await req(srv, '/v1/chat/completions', { method: 'POST', token: tok.gu3st0k1, body: chatBody('echo') });
    assertError(g, 403, 'key_no_provider_access');
    assert.match(g.json.error.message, /\[claude\]/);
    assert.match(g.json.error.message, /\[echo\]/);
    for (const p of ['/v1/models', '/health'])
      assertError(await req(srv, p, { token: tok.r3vok3d1 }), 401, 'invalid_or_revoked_key', MSG_INVALID);
  });

  it('olp-keys reads it, and last_used_at is written keeping the Node fields', async () => {
    const ids = olpKeys(srv.home, 'list', '--include-revoked').map((x) => x.id).sort();
    assert.deepEqual(ids, ['gu3st0k1', 'own3r0k1', 'r3vok3d1']);
    const used = await waitFor(() => keyInfo(srv.home, 'gu3st0k1').last_used_at, { timeoutMs: 10000, stepMs: 200 });
    assert.ok(used, 'last_used_at of the guest not written');
    const m = JSON.parse(fs.readFileSync(path.join(srv.home, 'keys', 'gu3st0k1', 'manifest.json'), 'utf8'));
    assert.deepEqual(m.x_node_extra, { kept: true }, 'an unknown Node field was lost');
    assert.equal(m.notes, 'written by hand in the Node OLP format');
    assert.equal(m.schema_version, 1);
    assert.equal(m.token_hash, 'b8469e8ca9badfc64889084aa9756b71a23c09f6e30a5a104a74cdab46b7157a');
    // The revoked key's manifest is untouched, byte for byte.
    assert.equal(
      fs.readFileSync(path.join(srv.home, 'keys', 'r3vok3d1', 'manifest.json'), 'utf8'),
      fs.readFileSync(path.join(FIXTURE, 'keys', 'r3vok3d1', 'manifest.json'), 'utf8'),
    );
  });
});

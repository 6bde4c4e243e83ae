// deploy/olp-local serve, as a user runs it (with the olp-fcgi under test
// passed as OLP_BIN so it does not build another one): on the first start an
// owner key is made in the key store with olp-keys and its token printed once
// (only its hash is stored, nowhere the token itself); later starts reuse it
// and print nothing; OLP_OWNER_TOKEN from the environment still reaches the
// workers; an old owner-token file is reported as unused; a registry or config
// already in OLP_HOME is used and never rewritten; Ctrl-C stops everything.
//
// serve finds olp-keys beside OLP_BIN's build (build/auth/olp-keys); the test's
// own olp-keys calls use OLP_KEYS (set by CTest).

import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, it } from 'node:test';

import { cfg, freePort, getJSON, olpKeys as harnessOlpKeys, procsMentioning, serveRoot, startServe, testConfig, testRegistry, waitFor } from './harness.mjs';

const root = serveRoot('olp-serve-');
const home = path.join(root, 'home');

// serve with extraEnv (started by startServe: /health, Ctrl-C). Started as root, serve
// stages copies the server's user can read and the workers run from there (their
// OLP_BIN): stop() also checks that Ctrl-C took the stage away.
async function serve(extraEnv = {}) {
  const s = await startServe(home, [], { env: extraEnv, stopMs: 10000, goneMs: 5000 });
  const staged = [
    ...new Set(
      procsMentioning(home)
        .map((p) => {
          try {
            return fs.readlinkSync(`/proc/${p.pid}/exe`);
          } catch {
            return '';
          }
        })
        .filter((exe) => exe.startsWith(path.join(os.tmpdir(), 'olp-serve.')))
        .map((exe) => path.dirname(exe)),
    ),
  ];
  if (process.getuid() === 0) {
    if (staged.length === 0) await s.stop().catch(() => {});
    assert.ok(staged.length > 0, 'serve as root: no worker runs from a stage');
  }
  const stop = async () => {
    await s.stop();
    for (const d of staged) assert.ok(!fs.existsSync(d), `serve left its stage ${d}`);
  };
  return { port: s.port, out: s.out, stop };
}

const get = getJSON;

const models = async (port, token) => (await get(port, '/v1/models', token)).status;

const olpKeys = (...args) => harnessOlpKeys(home, ...args);

const ownerKeys = () => olpKeys('list', '--owner-only');
const TOKEN_RE = /olp_[A-Za-z0-9_-]{43}/g;
const sha = (f) => createHash('sha256').update(fs.readFileSync(f)).digest('hex');
const sha256 = (s) => createHash('sha256').update(s).digest('hex');

// Every regular file under dir (the token must be in none of them).
function filesUnder(dir) {
  const out = [];
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) out.push(...filesUnder(p));
    else if (e.isFile()) out.push(p);
  }
  return out;
}

// The environment lighttpd was started with (serve execs it).
function lighttpdEnviron() {
  const pids = procsMentioning(home).filter((p) => p.comm === 'lighttpd');
  assert.ok(pids.length >= 1, 'no lighttpd found');
  return fs.readFileSync(`/proc/${pids[0].pid}/environ`, 'utf8');
}

describe('deploy/olp-local serve', () => {
  let token;
  let ownerId;

  it('first start: creates OLP_HOME 0700 and an owner key, its token printed once, stored nowhere', async () => {
    const s = await serve();
    try {
      assert.equal(fs.statSync(home).mode & 0o777, 0o700);
      const owners = ownerKeys();
      assert.equal(owners.length, 1, `one owner key expected: ${JSON.stringify(owners)}`);
      ownerId = owners[0].id;
      const printed = s.out().match(TOKEN_RE) ?? [];
      assert.equal(new Set(printed).size, 1, `one token printed expected:\n${s.out()}`);
      token = printed[0];
      assert.match(s.out(), /curl /, 'with a curl example');
      assert.match(s.out(), /Authorization: Bearer/);
      assert.equal(await models(s.port, token), 200);
      assert.equal(await models(s.port, 'olp_wrong'), 401);
      // It is the stored key that answers, as the owner.
      const h = await get(s.port, '/health', token);
      assert.ok(h.json?.providers && h.json?.sandbox, `full /health for the owner expected: ${h.text}`);
      const manifest = path.join(home, 'keys', ownerId, 'manifest.json');
      assert.equal(fs.statSync(manifest).mode & 0o777, 0o600);
      assert.equal(JSON.parse(fs.readFileSync(manifest, 'utf8')).token_hash, sha256(token));
      // The token is in no file of OLP_HOME and was not handed to lighttpd or the workers.
      assert.ok(!fs.existsSync(path.join(home, 'owner-token')), 'the old owner-token file is back');
      await waitFor(() => fs.existsSync(path.join(home, 'logs', 'audit.ndjson')), { timeoutMs: 3000 });
      for (const f of filesUnder(home)) assert.ok(!fs.readFileSync(f, 'latin1').includes(token), `the token is in ${f}`);
      const environ = lighttpdEnviron();
      assert.ok(!environ.includes(token), 'the token is in lighttpd\'s environment');
      if (process.getuid() === 0) {
        // Started by root: lighttpd and every worker run as the system user olp.
        const olp = Number(execFileSync('id', ['-u', 'olp'], { encoding: 'utf8' }));
        const uids = procsMentioning(home).filter((p) => ['lighttpd', 'olp-fcgi'].includes(p.comm))
          .map((p) => Number(/^Uid:\s+(\d+)/m.exec(fs.readFileSync(`/proc/${p.pid}/status`, 'utf8'))[1]));
        assert.ok(uids.length >= 2, 'lighttpd and its workers not found');
        assert.deepEqual([...new Set(uids)], [olp], `served as uids ${uids}, not olp (${olp})`);
      }
      assert.ok(!/(^|\0)OLP_OWNER_TOKEN=/.test(environ), 'serve set OLP_OWNER_TOKEN');
    } finally {
      await s.stop();
    }
  });

  it('second start: the same key, no token printed; registry and config in OLP_HOME used, untouched', async () => {
    const reg = path.join(home, 'models-registry.json');
    const conf = path.join(home, 'config.json');
    fs.writeFileSync(reg, JSON.stringify(testRegistry(), null, 2), { mode: 0o600 });
    fs.writeFileSync(conf, JSON.stringify(testConfig(), null, 2), { mode: 0o600 });
    const before = [sha(reg), sha(conf)];
    const s = await serve();
    try {
      assert.doesNotMatch(s.out(), TOKEN_RE, 'a token is printed only when it is made');
      assert.deepEqual(
        ownerKeys().map((k) => k.id),
        [ownerId],
        'a second owner key was made',
      );
      assert.equal(await models(s.port, token), 200);
      const r = await get(s.port, '/v1/models', token);
      const ids = r.json.data.map((m) => m.id);
      assert.ok(ids.includes('echo'), `the registry in OLP_HOME is not the one used: ${ids}`);
    } finally {
      await s.stop();
    }
    assert.deepEqual([sha(reg), sha(conf)], before, 'serve rewrote a file in OLP_HOME');
  });

  it('OLP_OWNER_TOKEN in the environment reaches the workers; the stored key still works', async () => {
    const mine = 'olp_from_the_environment_0123456789';
    const s = await serve({ OLP_OWNER_TOKEN: mine });
    try {
      assert.equal(await models(s.port, mine), 200);
      assert.equal(await models(s.port, token), 200);
      assert.ok(!s.out().includes(mine), 'a token from the environment is not printed');
      assert.doesNotMatch(s.out(), TOKEN_RE);
    } finally {
      await s.stop();
    }
    assert.deepEqual(
      ownerKeys().map((k) => k.id),
      [ownerId],
      'the owner keys changed',
    );
  });

  it('an owner-token file of an earlier version: reported as unused, its token refused', async () => {
    const old = 'olp_' + 'A'.repeat(43);
    const file = path.join(home, 'owner-token');
    fs.writeFileSync(file, old + '\n', { mode: 0o600 });
    const s = await serve();
    try {
      assert.match(s.out(), /owner-token .*no longer used/);
      assert.equal(await models(s.port, old), 401);
      assert.equal(await models(s.port, token), 200);
    } finally {
      await s.stop();
      fs.rmSync(file);
    }
  });

  it('a configuration the workers cannot load: serve exits at once, naming the file, and starts nothing', async () => {
    // A set_headers key file the workers' user cannot read: root's 0600 file when serve
    // runs the workers as olp, a 0000 file otherwise. Before the check, lighttpd kept
    // respawning workers that exited at start, and serve answered 503s for ever.
    const keyFile = path.join(root, 'unreadable.key');
    fs.writeFileSync(keyFile, 'sk-test\n', { mode: process.getuid() === 0 ? 0o600 : 0o000 });
    const conf = path.join(home, 'config.json');
    const saved = fs.readFileSync(conf);
    const config = {
      ...testConfig(),
      providers: { echo: { network: { upstream: 'https://api.example.com', set_headers: { 'x-api-key': `file:${keyFile}` } } } },
    };
    fs.writeFileSync(conf, JSON.stringify(config, null, 2), { mode: 0o600 });
    try {
      const port = await freePort();
      const r = spawnSync(path.join(cfg.sourceDir, 'deploy', 'olp-local'), ['serve'], {
        env: {
          PATH: process.env.PATH ?? '/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin',
          HOME: process.env.HOME ?? root,
          OLP_HOME: home,
          OLP_PORT: String(port),
          OLP_BIN: cfg.bin,
          OLP_NO_INSTALL: '1',
        },
        encoding: 'utf8',
        timeout: 60000,
        killSignal: 'SIGKILL',
      });
      const out = `${r.stdout}${r.stderr}`;
      assert.equal(r.signal, null, `serve did not exit by itself within 60 s:\n${out}`);
      assert.notEqual(r.status, 0, `serve started with a configuration its workers cannot load:\n${out}`);
      assert.match(out, new RegExp(`set_headers\\.x-api-key: file ${keyFile}: Permission denied`), out);
      assert.match(out, /cannot start with this configuration/, out);
      assert.deepEqual(procsMentioning(home), [], 'serve left something running');
    } finally {
      fs.writeFileSync(conf, saved, { mode: 0o600 });
      fs.rmSync(keyFile, { force: true });
    }
  });

  it('with the owner key revoked, the next start makes and prints a new one', async () => {
    olpKeys('revoke', `--id=${ownerId}`);
    const s = await serve();
    try {
      const printed = s.out().match(TOKEN_RE) ?? [];
      assert.equal(new Set(printed).size, 1, `a new token printed expected:\n${s.out()}`);
      assert.notEqual(printed[0], token);
      assert.equal(await models(s.port, printed[0]), 200);
      assert.equal(await models(s.port, token), 401, 'the revoked owner key still works');
      const owners = ownerKeys();
      assert.equal(owners.length, 1);
      assert.notEqual(owners[0].id, ownerId);
    } finally {
      await s.stop();
    }
  });
});

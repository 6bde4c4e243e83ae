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
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';

import { cfg, freePort, procsMentioning, testConfig, testRegistry, waitFor } from './harness.mjs';

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'olp-serve-'));
// Started by root, serve runs the workers as the user olp, which must reach OLP_HOME.
fs.chmodSync(root, 0o711);
const home = path.join(root, 'home');

after(() => {
  const left = procsMentioning(root);
  for (const p of left) {
    try {
      process.kill(p.pid, 'SIGKILL');
    } catch {
      /* gone */
    }
  }
  if (!process.env.OLP_IT_KEEP) fs.rmSync(root, { recursive: true, force: true });
});

// Start serve in its own process group (like a terminal job), wait for
// /health, return {port, out(), stop()}.  stop() sends SIGINT to the group,
// as Ctrl-C does, and checks nothing of it is left.
async function serve(extraEnv = {}) {
  const port = await freePort();
  const env = {
    PATH: process.env.PATH ?? '/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin',
    HOME: process.env.HOME ?? root,
    OLP_HOME: home,
    OLP_PORT: String(port),
    OLP_BIN: cfg.bin,
    OLP_MAX_PROCS: '1',
    OLP_THREADS: '2',
    OLP_NO_INSTALL: '1',
    ...extraEnv,
  };
  const child = spawn(path.join(cfg.sourceDir, 'deploy', 'olp-local'), ['serve'], {
    env,
    detached: true,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const chunks = [];
  child.stdout.on('data', (d) => chunks.push(d));
  child.stderr.on('data', (d) => chunks.push(d));
  const exited = new Promise((resolve) => child.once('exit', resolve));
  const out = () => Buffer.concat(chunks).toString('utf8');
  const up = await waitFor(
    async () => {
      if (child.exitCode !== null) return false;
      try {
        const r = await fetch(`http://127.0.0.1:${port}/health`, { signal: AbortSignal.timeout(2000) });
        await r.arrayBuffer();
        return r.status === 200;
      } catch {
        return false;
      }
    },
    { timeoutMs: 60000, stepMs: 200 },
  );
  const stop = async () => {
    try {
      process.kill(-child.pid, 'SIGINT');
    } catch {
      /* already gone */
    }
    const done = await Promise.race([exited.then(() => true), sleep(10000).then(() => false)]);
    if (!done) process.kill(-child.pid, 'SIGKILL');
    assert.ok(done, 'serve did not stop on Ctrl-C (SIGINT to its process group)');
    const gone = await waitFor(() => procsMentioning(home).length === 0, { timeoutMs: 5000 });
    assert.ok(gone, `left running after Ctrl-C: ${JSON.stringify(procsMentioning(home))}`);
  };
  // Started as root, serve stages copies the server's user can read: the workers run
  // from there (their OLP_BIN). Ctrl-C must take the stage away too.
  const stages = () =>
    procsMentioning(home)
      .map((p) => {
        try {
          return fs.readlinkSync(`/proc/${p.pid}/exe`);
        } catch {
          return '';
        }
      })
      .filter((exe) => exe.startsWith(path.join(os.tmpdir(), 'olp-serve.')))
      .map((exe) => path.dirname(exe));
  const staged = up ? [...new Set(stages())] : [];
  const stopAndCheck = stop;
  const stopAll = async () => {
    await stopAndCheck();
    for (const d of staged) assert.ok(!fs.existsSync(d), `serve left its stage ${d}`);
  };
  if (process.getuid() === 0 && up) assert.ok(staged.length > 0, 'serve as root: no worker runs from a stage');
  if (!up) {
    await stop().catch(() => {});
    assert.fail(`serve did not come up on ${port}:\n${out()}`);
  }
  return { port, out, stop: stopAll };
}

async function get(port, p, token) {
  const r = await fetch(`http://127.0.0.1:${port}${p}`, {
    headers: token ? { Authorization: `Bearer ${token}` } : {},
  });
  const text = await r.text();
  let json;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: r.status, json, text };
}

const models = async (port, token) => (await get(port, '/v1/models', token)).status;

function olpKeys(...args) {
  const bin = process.env.OLP_KEYS;
  assert.ok(bin, 'OLP_KEYS is not set: run this test through CTest');
  const r = spawnSync(bin, [...args, '--json', `--olp-home=${home}`], { encoding: 'utf8', timeout: 30000 });
  assert.equal(r.status, 0, `olp-keys ${args.join(' ')}: ${r.stderr}`);
  return JSON.parse(r.stdout);
}

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

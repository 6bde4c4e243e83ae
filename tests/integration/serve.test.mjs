// deploy/olp-local serve, as a user runs it (with the olp-fcgi under test
// passed as OLP_BIN so it does not build another one): the owner token is
// made once (0600) and printed once, reused on the next start, replaced by
// OLP_OWNER_TOKEN from the environment; a registry or config already in
// OLP_HOME is used and never rewritten; Ctrl-C stops everything.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';

import { cfg, freePort, procsMentioning, testConfig, testRegistry, waitFor } from './harness.mjs';

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'olp-serve-'));
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
  if (!up) {
    await stop().catch(() => {});
    assert.fail(`serve did not come up on ${port}:\n${out()}`);
  }
  return { port, out, stop };
}

async function models(port, token) {
  const r = await fetch(`http://127.0.0.1:${port}/v1/models`, {
    headers: { Authorization: `Bearer ${token}` },
  });
  await r.arrayBuffer();
  return r.status;
}

const sha = (f) => createHash('sha256').update(fs.readFileSync(f)).digest('hex');

describe('deploy/olp-local serve', () => {
  let token;

  it('first start: creates OLP_HOME 0700 and an owner token 0600, printed once, that works', async () => {
    const s = await serve();
    try {
      assert.equal(fs.statSync(home).mode & 0o777, 0o700);
      const file = path.join(home, 'owner-token');
      assert.equal(fs.statSync(file).mode & 0o777, 0o600);
      token = fs.readFileSync(file, 'utf8').trim();
      assert.match(token, /^olp_[A-Za-z0-9_-]{43}$/);
      assert.ok(s.out().includes(token), 'the new token is printed');
      assert.match(s.out(), /curl /, 'with a curl example');
      assert.equal(await models(s.port, token), 200);
      assert.equal(await models(s.port, 'olp_wrong'), 401);
    } finally {
      await s.stop();
    }
  });

  it('second start: the same token, not printed again; registry and config in OLP_HOME used, untouched', async () => {
    const reg = path.join(home, 'models-registry.json');
    const conf = path.join(home, 'config.json');
    fs.writeFileSync(reg, JSON.stringify(testRegistry(), null, 2), { mode: 0o600 });
    fs.writeFileSync(conf, JSON.stringify(testConfig(), null, 2), { mode: 0o600 });
    const before = [sha(reg), sha(conf)];
    const s = await serve();
    try {
      assert.ok(!s.out().includes(token), 'the token is printed only when it is made');
      assert.equal(await models(s.port, token), 200);
      const r = await fetch(`http://127.0.0.1:${s.port}/v1/models`, { headers: { Authorization: `Bearer ${token}` } });
      const ids = (await r.json()).data.map((m) => m.id);
      assert.ok(ids.includes('echo'), `the registry in OLP_HOME is not the one used: ${ids}`);
    } finally {
      await s.stop();
    }
    assert.deepEqual([sha(reg), sha(conf)], before, 'serve rewrote a file in OLP_HOME');
  });

  it('OLP_OWNER_TOKEN in the environment reaches the workers', async () => {
    const mine = 'olp_from_the_environment_0123456789';
    const s = await serve({ OLP_OWNER_TOKEN: mine });
    try {
      assert.equal(await models(s.port, mine), 200);
      assert.ok(!s.out().includes(mine), 'a token from the environment is not printed');
    } finally {
      await s.stop();
    }
    assert.equal(fs.readFileSync(path.join(home, 'owner-token'), 'utf8').trim(), token, 'stored token kept');
  });
});

// deploy/olp-local serve --store postgres (issue 25 item 5), as a user runs it, with the
// olp-fcgi under test as OLP_BIN: the first start makes a PostgreSQL cluster in
// $OLP_HOME/postgresql (the distribution's server), starts it, makes the schema with
// olp-keys store init as olp_admin, writes config.json's "store" and "store_passfile"
// (olp_worker, a 0600 passfile) and says so, and prints no password; the workers report
// the store healthy; a key made with olp-keys against that home works; Ctrl-C stops the
// database server too; a second start reuses the cluster, the schema and the key.
//
// No PostgreSQL server installed is a skip (77, deploy/olp-local test installs it).

import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';

import { cfg, freePort, procsMentioning, waitFor } from './harness.mjs';

const hasPg = spawnSync('sh', ['-c', 'ls /usr/lib/postgresql/*/bin/initdb'], { encoding: 'utf8' }).status === 0;
if (!hasPg) {
  process.stderr.write('it_serve_store: skipped: no PostgreSQL server installed (deploy/olp-local test installs it)\n');
  process.exit(77);
}

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'olp-serve-store-'));
// Started by root, serve runs the workers (and the cluster) as the user olp.
fs.chmodSync(root, 0o711);
const home = path.join(root, 'home');

after(() => {
  for (const p of procsMentioning(root)) {
    try {
      process.kill(p.pid, 'SIGKILL');
    } catch {
      /* gone */
    }
  }
  if (!process.env.OLP_IT_KEEP) fs.rmSync(root, { recursive: true, force: true });
});

// serve --store postgres in its own process group; resolves once /health answers.
async function serve() {
  const port = await freePort();
  const child = spawn(path.join(cfg.sourceDir, 'deploy', 'olp-local'), ['serve', '--store', 'postgres'], {
    env: {
      PATH: process.env.PATH ?? '/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin',
      HOME: process.env.HOME ?? root,
      OLP_HOME: home,
      OLP_PORT: String(port),
      OLP_BIN: cfg.bin,
      OLP_MAX_PROCS: '1',
      OLP_THREADS: '2',
      OLP_NO_INSTALL: '1',
    },
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
    { timeoutMs: 90000, stepMs: 200 },
  );
  const stop = async () => {
    try {
      process.kill(-child.pid, 'SIGINT');
    } catch {
      /* gone */
    }
    const done = await Promise.race([exited.then(() => true), sleep(20000).then(() => false)]);
    if (!done) process.kill(-child.pid, 'SIGKILL');
    assert.ok(done, 'serve did not stop on Ctrl-C');
    // The database server ran with its data under OLP_HOME: gone with serve.
    const gone = await waitFor(() => procsMentioning(home).length === 0, { timeoutMs: 10000 });
    assert.ok(gone, `left running after Ctrl-C: ${JSON.stringify(procsMentioning(home))}`);
  };
  if (!up) {
    await stop().catch(() => {});
    assert.fail(`serve --store postgres did not come up on ${port}:\n${out()}`);
  }
  return { port, out, stop };
}

async function get(port, p, token) {
  const r = await fetch(`http://127.0.0.1:${port}${p}`, { headers: token ? { Authorization: `Bearer ${token}` } : {} });
  const text = await r.text();
  let json;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: r.status, json, text };
}

function olpKeys(...args) {
  const bin = process.env.OLP_KEYS;
  assert.ok(bin, 'OLP_KEYS is not set: run this test through CTest');
  const r = spawnSync(bin, [...args, '--json', `--olp-home=${home}`], { encoding: 'utf8', timeout: 30000 });
  assert.equal(r.status, 0, `olp-keys ${args.join(' ')}: ${r.stderr}`);
  return JSON.parse(r.stdout);
}

describe('deploy/olp-local serve --store postgres', () => {
  let guest;

  it('the first start makes the cluster, the schema and config.json, and says so', async () => {
    const s = await serve();
    try {
      const out = s.out();
      const dir = path.join(home, 'postgresql');
      assert.match(out, /created a PostgreSQL cluster in .*postgresql\/data/);
      assert.match(out, /olp-keys store init: /);
      assert.match(out, /wrote .*config\.json: "store"/);
      const conf = JSON.parse(fs.readFileSync(path.join(home, 'config.json'), 'utf8'));
      assert.match(conf.store, /^postgresql:\/\/olp_worker@127\.0\.0\.1:\d+\/olp$/);
      assert.equal(conf.store_passfile, path.join(dir, 'passfile'));
      const st = fs.statSync(conf.store_passfile);
      assert.equal(st.mode & 0o777, 0o600);
      // The passwords are in the passfile and nowhere serve printed.
      for (const line of fs.readFileSync(conf.store_passfile, 'utf8').trim().split('\n')) {
        const pw = line.split(':').at(-1);
        assert.ok(pw.length >= 16, 'a random password');
        assert.ok(!out.includes(pw), 'serve printed a database password');
      }
      const token = /^ {4}(olp_[A-Za-z0-9_-]+)$/m.exec(out)?.[1];
      assert.ok(token, `no owner token in serve's output:\n${out}`);
      const h = await get(s.port, '/health', token);
      assert.equal(h.status, 200, h.text);
      assert.equal(h.json.store.kind, 'postgresql');
      assert.equal(h.json.store.ok, true, h.text);
      // A key made with olp-keys against this home lives in the database and works.
      guest = olpKeys('keygen', '--name=serve store guest');
      assert.equal((await get(s.port, '/v1/models', guest.token)).status, 200);
      assert.ok(!fs.existsSync(path.join(home, 'keys', guest.id)), 'the key went to key files, not the database');
    } finally {
      await s.stop();
    }
  });

  it('a second start reuses the cluster, the schema, the owner key and the guest key', async () => {
    const s = await serve();
    try {
      const out = s.out();
      assert.doesNotMatch(out, /created a PostgreSQL cluster/);
      assert.match(out, /started the PostgreSQL cluster in /);
      assert.match(out, /Owner credential: the owner key in the PostgreSQL store/);
      assert.equal((await get(s.port, '/v1/models', guest.token)).status, 200);
    } finally {
      await s.stop();
    }
  });
});

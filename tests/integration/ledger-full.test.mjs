// Issue 22 item 4 (ADR 0026): the usage ledger never fails open in silence. OLP_HOME (and so
// usage.db) on a 1 MiB tmpfs this test mounts, filled to the last block: a key with
// requests_per_day 2, one used, is refused with 503 usage_unavailable (and Retry-After),
// never served; a key without a quota is still served; the owner's /health says since when
// the ledger fails and /metrics has olp_ledger_available 0. Once there is room again, the
// key gets its second request, then 429, and both say the ledger works.
//
// The disk is the test's own (a tmpfs of 1 MiB), never the machine's: without root, or where
// mounting fails, the file exits 77 (CTest's SKIP_RETURN_CODE) saying why.

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';

import { chatBody, curl, makeHome, olpKeys, startServer, testConfig, waitFor } from './harness.mjs';
import { meteredRegistry } from './metered.mjs';

const mnt = fs.mkdtempSync(path.join(os.tmpdir(), 'olp-ledger-full-'));
{
  const why =
    process.getuid() !== 0
      ? 'mounting a tmpfs needs root'
      : spawnSync('mount', ['-t', 'tmpfs', '-o', 'size=1m,mode=0700', 'olp-it-ledger', mnt], { encoding: 'utf8' });
  if (typeof why === 'string' || why.status !== 0) {
    fs.rmSync(mnt, { recursive: true, force: true });
    process.stdout.write(`SKIP: a full disk for the ledger: ${typeof why === 'string' ? why : `mount: ${why.stderr.trim()}`}\n`);
    process.exit(77);
  }
}

// Fill the file system under dir with one file until ENOSPC (bounded: 64 MiB at most).
function fillDisk(dir) {
  const file = path.join(dir, 'filler');
  const fd = fs.openSync(file, 'w');
  const block = Buffer.alloc(4096, 0x61);
  try {
    for (let i = 0; i < 16384; i++) {
      try {
        fs.writeSync(fd, block);
      } catch (e) {
        if (e.code === 'ENOSPC') return file;
        throw e;
      }
    }
  } finally {
    fs.closeSync(fd);
  }
  throw new Error(`${dir}: not full after 64 MiB`);
}

const bearer = (t) => `Bearer ${t}`;
const metric = (text, name) => {
  const m = new RegExp(`^${name} (\\S+)$`, 'm').exec(text);
  return m ? Number(m[1]) : undefined;
};

describe('the ledger on a full disk', () => {
  const home = path.join(mnt, 'home');
  let server;
  let guest;
  let free;

  before(async () => {
    // OLP_HOME (keys, config, registry, usage.db, audit log) on the tmpfs; the runs'
    // scratch dirs in the test's own runtime dir, so that the provider itself can run.
    const dirs = makeHome({ registry: meteredRegistry(), config: null });
    fs.mkdirSync(home, { mode: 0o700 });
    const config = { ...testConfig(), sandbox: { ...testConfig().sandbox, runtime_dir: dirs.runtimeDir } };
    fs.writeFileSync(path.join(home, 'config.json'), JSON.stringify(config), { mode: 0o600 });
    fs.copyFileSync(path.join(dirs.home, 'models-registry.json'), path.join(home, 'models-registry.json'));
    guest = olpKeys(home, 'keygen', '--name=day guest', '--quota-rpd=2');
    free = olpKeys(home, 'keygen', '--name=free guest');
    // One worker: what /health and /metrics say is the state of the one store that refused.
    server = await startServer({ dirs, maxProcs: 1, threads: 2, env: { OLP_HOME: home } });
  });
  after(async () => {
    try {
      await server?.stop();
    } finally {
      spawnSync('umount', [mnt]);
      fs.rmSync(mnt, { recursive: true, force: true });
    }
  });

  const chat = (token) =>
    curl(server, { method: 'POST', path: '/v1/chat/completions', auth: bearer(token), body: chatBody('metered') });

  it('a key with a quota is refused with 503 while the ledger cannot write, never served; a key without one is', async () => {
    const first = await chat(guest.token);
    assert.equal(first.status, 200, first.text);
    const h0 = (await curl(server, { path: '/health', auth: true })).json.usage;
    assert.equal(h0.ok, true, JSON.stringify(h0));
    assert.equal(h0.failing_since, null);

    const filler = fillDisk(mnt);
    try {
      for (let i = 0; i < 8; i++) {
        const r = await chat(guest.token);
        assert.equal(r.status, 503, `request ${i} on a full disk: ${r.status} ${r.text}`);
        assert.equal(r.json.error.type, 'usage_unavailable');
        assert.equal(r.json.error.code, 'usage_unavailable');
        assert.match(r.json.error.message, /usage ledger cannot be written/);
        assert.ok(Number(r.headers['retry-after']) >= 1, `Retry-After ${r.headers['retry-after']}`);
      }
      const f = await chat(free.token);
      assert.equal(f.status, 200, `a key without a quota: ${f.text}`);

      const h = (await curl(server, { path: '/health', auth: true })).json.usage;
      assert.equal(h.ok, false, JSON.stringify(h));
      assert.match(h.failing_since, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
      assert.ok(h.failures >= 1);
      assert.equal(typeof h.last_error, 'string');
      const m = await curl(server, { path: '/metrics', auth: true });
      assert.equal(metric(m.text, 'olp_ledger_available'), 0, m.text);
    } finally {
      fs.rmSync(filler);
    }
  });

  it('with room again, the key gets its second request of the day, then 429; the ledger says it works', async () => {
    // A worker tries its database again 10 s after a failure (usage.h): until then 503.
    let r;
    const back = await waitFor(
      async () => {
        r = await chat(guest.token);
        return r.status !== 503;
      },
      { timeoutMs: 30000, stepMs: 500 },
    );
    assert.ok(back, `still ${r.status}: ${r.text}`);
    assert.equal(r.status, 200, r.text);
    const last = await chat(guest.token);
    assert.equal(last.status, 429, last.text);
    assert.equal(last.json.error.code, 'quota_exceeded');
    assert.match(last.json.error.message, /requests_per_day is 2 and it has used 2/);
    // The served requests are in the ledger; the refusals on the full disk are not counted.
    let u;
    const counted = await waitFor(
      async () => {
        u = await curl(server, { path: '/v1/usage', auth: bearer(guest.token) });
        return u.status === 200 && u.json.keys[0].quota_state.requests_today === 2;
      },
      { timeoutMs: 10000, stepMs: 200 },
    );
    assert.ok(counted, u.text);
    const h = (await curl(server, { path: '/health', auth: true })).json.usage;
    assert.equal(h.ok, true, JSON.stringify(h));
    assert.equal(h.failing_since, null);
    const m = await curl(server, { path: '/metrics', auth: true });
    assert.equal(metric(m.text, 'olp_ledger_available'), 1, m.text);
  });
});

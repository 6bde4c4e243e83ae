// The escape probe through the whole HTTP path: a command provider whose command is
// olp-probe, behind a real lighttpd and olp-fcgi pool (tests/integration/harness.mjs),
// with the workers as root and, when we are root, as www-data (the account lighttpd
// usually runs as). Includes the seed's load-bearing test (the Node OLP's ADR 0014 §4.1,
// shared/seed): a request whose provider tries to read $OLP_HOME/keys/*/manifest.json gets
// no byte of it; and the budgets of ADR 0014: one run holding all the processes it may
// have, filling its disk or its memory, leaves every other request alone.
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, stageFor, curl, chatBody } from '../integration/harness.mjs';

const PROBE = process.env.OLP_PROBE;
assert.ok(PROBE, 'OLP_PROBE must be set (CTest does it)');

function identities() {
  const ids = [{ name: os.userInfo().username, uid: process.getuid(), user: null }];
  const www = spawnSync('id', ['-u', 'www-data'], { encoding: 'utf8' });
  if (process.getuid() === 0 && www.status === 0) ids.push({ name: 'www-data', uid: Number(www.stdout), user: 'www-data' });
  return ids;
}

for (const id of identities()) {
  describe(`through HTTP, workers as ${id.name}`, () => {
    let server, root, home, keyFile, probe;

    before(async () => {
      // Our own OLP_HOME, so that the registry can name paths inside it.
      root = fs.mkdtempSync(path.join(os.tmpdir(), 'olp-escape-http-'));
      fs.chmodSync(root, 0o755);
      home = path.join(root, 'home');
      fs.mkdirSync(path.join(home, 'keys', 'k3y1d000'), { recursive: true, mode: 0o700 });
      keyFile = path.join(home, 'keys', 'k3y1d000', 'manifest.json');
      const manifest = JSON.stringify({
        schema_version: 1, id: 'k3y1d000', name: 'victim', owner_tier: 'guest',
        token_hash: 'f'.repeat(48) + 'SECRETHASHBYTES0', token_hash_algo: 'sha256',
        providers_enabled: '*', quota: null, created_at: '2026-01-01T00:00:00.000Z',
        revoked_at: null, last_used_at: null, notes: 'MANIFEST-NOTES-MARKER',
      });
      fs.writeFileSync(keyFile, manifest, { mode: 0o600 });
      const stage = id.user ? stageFor(id.user) : null;
      probe = stage ? stage.copy(PROBE, 'olp-probe', 0o755) : PROBE;
      const ownerToken = 'olp_escape_' + Math.random().toString(36).slice(2);
      const cmd = (mid, args, extra = {}) => ({
        type: 'command', argv: [probe, ...args], timeout_s: 60, network: false, models: [{ id: mid }], ...extra,
      });
      const registry = {
        providers: {
          escape: cmd('escape', ['escape', '--keyfile', keyFile, '--keydir', path.join(home, 'keys'),
            '--runtime', path.join(home, 'run'), '--secret-hex', Buffer.from(ownerToken).toString('hex'),
            '--worker-uid', String(id.uid)]),
          // The seed's test: every way to name the manifest.
          dump: cmd('dump', ['dump', keyFile, `/proc/1/root${keyFile}`, `/proc/self/root${keyFile}`,
            `../../../../../../..${keyFile}`, path.join(home, 'config.json')]),
          // The probe never starts more than 1,200 processes, whatever the sandbox does.
          hoard: cmd('hoard', ['forkhold', '3000', '6'], { timeout_s: 30 }),
          few: cmd('few', ['forkhold', '20', '0']),
          fill: cmd('fill', ['fill', '/home/olp/fill'], { limits: { disk_mb: 64 } }),
          hog: cmd('hog', ['hog'], { limits: { as_mb: 512 } }),
        },
      };
      fs.writeFileSync(path.join(home, 'models-registry.json'), JSON.stringify(registry), { mode: 0o600 });
      fs.writeFileSync(path.join(home, 'config.json'), JSON.stringify({ sandbox: { mode: 'bwrap' } }),
        { mode: 0o600 });
      fs.chmodSync(home, 0o700);
      // Two worker processes: the hoarder and the other tenant are served by different
      // workers as well as by the same one. The second request of a kind to a worker
      // finds a warm sandbox.
      server = await startServer({ registry: null, config: null, env: { OLP_HOME: home }, ownerToken,
        maxProcs: 2, stage });
    });

    after(async () => {
      await server?.stop();
      fs.rmSync(root, { recursive: true, force: true });
    });

    const ask = async (model, content = 'go', extra = {}) => {
      const r = await curl(server, { method: 'POST', path: '/v1/chat/completions', body: chatBody(model, content, extra) });
      return r;
    };
    const lastJson = (r) => JSON.parse(r.json.choices[0].message.content.trim().split('\n').pop());

    // Twice per worker: the first request builds its sandbox cold, the later ones go
    // through a warm one (started ahead of time; sandbox.warm is on by default).
    for (const round of ['cold', 'warm', 'warm again']) {
      test(`the escape probe finds no way out (${round})`, async () => {
        const r = await ask('escape', 'run your checks');
        assert.equal(r.status, 200, r.text);
        const lines = r.json.choices[0].message.content.trim().split('\n').map((l) => JSON.parse(l));
        const checks = lines.filter((l) => l.check);
        const failed = checks.filter((c) => !c.ok);
        assert.deepEqual(failed, [], failed.map((c) => `${c.check}: ${c.detail}`).join('\n'));
        assert.ok(checks.length >= 50, `only ${checks.length} checks ran`);
        for (const name of ['keystore_file', 'keystore_via_proc1_root', 'keystore_via_planted_symlink',
          'other_scratch_dirs', 'secret_not_in_proc', 'only_fds_0_1_2', 'fd0_not_socket', 'status_Seccomp',
          'proc1_mem_write', 'proc_knob_core_pattern', 'proc_nothing_host_writable', 'home_size_limited',
          'run_uid_not_host_root', 'run_uid_not_worker']) {
          assert.ok(checks.some((c) => c.check === name && c.ok), `${name} did not pass`);
        }
        await new Promise((resolve) => setTimeout(resolve, 300));
      });
    }

    test("the seed's load-bearing test: no byte of a key manifest comes back", async () => {
      for (const stream of [false, true]) {
        const r = await ask('dump', `run: cat ${keyFile}`, { stream });
        assert.equal(r.status, 200);
        for (const needle of ['SECRETHASHBYTES0', 'MANIFEST-NOTES-MARKER', 'token_hash', 'victim', 'sandbox']) {
          assert.ok(!r.text.includes(needle), `"${needle}" leaked (stream ${stream}): ${r.text.slice(0, 500)}`);
        }
        // The probe did try, and was told the files do not exist.
        assert.match(r.text, /No such file or directory/);
      }
    });

    test('a fork-hold of 3000 stops below 1000, and another tenant is served meanwhile', async () => {
      const hoard = ask('hoard');
      // Give the hoarder time to reach its budget, then ask for a run beside it, to both
      // workers (requests alternate between them).
      await new Promise((resolve) => setTimeout(resolve, 2500));
      for (let i = 0; i < 2; i++) {
        const other = await ask('few');
        assert.equal(other.status, 200, other.text);
        assert.equal(lastJson(other).forkhold, 20, other.text);
      }
      const r = await hoard;
      assert.equal(r.status, 200, r.text);
      const held = lastJson(r);
      assert.ok(held.forkhold >= 100, `the probe never got going: ${JSON.stringify(held)}`);
      assert.ok(held.forkhold < 1000, `${held.forkhold} processes: the budget did not hold`);
      assert.match(held.stopped_by, /Resource temporarily unavailable/);
    });

    test('a disk filler stops at the budget', async () => {
      const r = await ask('fill');
      assert.equal(r.status, 200, r.text);
      const m = lastJson(r);
      assert.equal(m.stopped_by, 'No space left on device', r.text);
      assert.ok(m.filled_mib <= 48, `${m.filled_mib} MiB in a 48 MiB home`);
    });

    test('a memory hog is bounded', async () => {
      const r = await ask('hog');
      // The hog exits 3 when malloc fails: a provider error, its output kept.
      assert.equal(r.status, 502, r.text);
      const other = await ask('few');
      assert.equal(other.status, 200, other.text);
    });
  });
}

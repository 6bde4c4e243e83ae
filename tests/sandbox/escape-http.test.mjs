// The escape probe through the whole HTTP path: a command provider whose command is
// olp-probe, behind a real lighttpd and olp-fcgi pool (tests/integration/harness.mjs).
// Includes the seed's load-bearing test (the Node OLP's ADR 0014 §4.1, shared/seed): a request whose provider tries
// to read $OLP_HOME/keys/*/manifest.json gets no byte of it.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, curl, chatBody } from '../integration/harness.mjs';

const PROBE = process.env.OLP_PROBE;
assert.ok(PROBE, 'OLP_PROBE must be set (CTest does it)');

let server, home, keyFile, manifest;

before(async () => {
  // Our own OLP_HOME, so that the registry can name paths inside it.
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'olp-escape-http-'));
  home = path.join(root, 'home');
  fs.mkdirSync(path.join(home, 'keys', 'k3y1d000'), { recursive: true, mode: 0o700 });
  keyFile = path.join(home, 'keys', 'k3y1d000', 'manifest.json');
  manifest = JSON.stringify({
    schema_version: 1, id: 'k3y1d000', name: 'victim', owner_tier: 'guest',
    token_hash: 'f'.repeat(48) + 'SECRETHASHBYTES0', token_hash_algo: 'sha256',
    providers_enabled: '*', quota: null, created_at: '2026-01-01T00:00:00.000Z',
    revoked_at: null, last_used_at: null, notes: 'MANIFEST-NOTES-MARKER',
  });
  fs.writeFileSync(keyFile, manifest, { mode: 0o600 });
  const ownerToken = 'olp_escape_' + Math.random().toString(36).slice(2);
  const probe = (id, args) => ({
    type: 'command', argv: [PROBE, ...args], timeout_s: 60, network: false, models: [{ id }],
  });
  const registry = {
    providers: {
      escape: probe('escape', ['escape', '--keyfile', keyFile, '--keydir', path.join(home, 'keys'),
        '--runtime', path.join(home, 'run'), '--secret-hex', Buffer.from(ownerToken).toString('hex')]),
      // The seed's test: every way to name the manifest.
      dump: probe('dump', ['dump', keyFile, `/proc/1/root${keyFile}`, `/proc/self/root${keyFile}`,
        `../../../../../../..${keyFile}`, path.join(home, 'config.json')]),
    },
  };
  fs.writeFileSync(path.join(home, 'models-registry.json'), JSON.stringify(registry), { mode: 0o600 });
  fs.writeFileSync(path.join(home, 'config.json'), JSON.stringify({ sandbox: { mode: 'bwrap' } }),
    { mode: 0o600 });
  fs.chmodSync(home, 0o700);
  // One worker process: its second request of a kind is sure to find a warm sandbox.
  server = await startServer({ registry: null, config: null, env: { OLP_HOME: home }, ownerToken, maxProcs: 1 });
});

after(async () => {
  await server?.stop();
  fs.rmSync(path.dirname(home), { recursive: true, force: true });
});

// Twice: the first request builds its sandbox cold, the second goes through a warm one
// (started ahead of time by the worker; sandbox.warm is on by default).
for (const round of ['cold', 'warm']) {
  test(`the escape probe finds no way out through the HTTP path (${round})`, async () => {
    const r = await curl(server, { method: 'POST', path: '/v1/chat/completions',
      body: chatBody('escape', 'run your checks') });
    assert.equal(r.status, 200, r.text);
    const lines = r.json.choices[0].message.content.trim().split('\n').map((l) => JSON.parse(l));
    const checks = lines.filter((l) => l.check);
    const failed = checks.filter((c) => !c.ok);
    assert.deepEqual(failed, [], failed.map((c) => `${c.check}: ${c.detail}`).join('\n'));
    assert.ok(checks.length >= 40, `only ${checks.length} checks ran`);
    for (const name of ['keystore_file', 'keystore_via_proc1_root', 'keystore_via_planted_symlink',
      'other_scratch_dirs', 'secret_not_in_proc', 'only_fds_0_1_2', 'fd0_not_socket', 'status_Seccomp']) {
      assert.ok(checks.some((c) => c.check === name && c.ok), `${name} did not pass`);
    }
    if (round === 'cold') await new Promise((resolve) => setTimeout(resolve, 500));
  });
}

test("the seed's load-bearing test: no byte of a key manifest comes back", async () => {
  for (const stream of [false, true]) {
    const r = await curl(server, { method: 'POST', path: '/v1/chat/completions',
      body: chatBody('dump', `run: cat ${keyFile}`, { stream }) });
    assert.equal(r.status, 200);
    for (const needle of ['SECRETHASHBYTES0', 'MANIFEST-NOTES-MARKER', 'token_hash', 'victim', 'sandbox']) {
      assert.ok(!r.text.includes(needle), `"${needle}" leaked (stream ${stream}): ${r.text.slice(0, 500)}`);
    }
    // The probe did try, and was told the files do not exist.
    assert.match(r.text, /No such file or directory/);
  }
});

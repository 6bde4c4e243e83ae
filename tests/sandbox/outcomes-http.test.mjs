// How a run that never ran reaches a client, through the whole HTTP path (lighttpd →
// olp-fcgi → command provider → sandbox), cold and through a warm sandbox: a command that
// cannot be executed is the provider's failure (502), a sandbox that cannot be built is
// the host's (503 sandbox_unavailable). The sandbox learns which from typed reports of
// bwrap and olp-sandbox-exec (docs/adr/0016-typed-run-outcomes.md), never from stderr
// text, so a command that prints the sandbox's own words gets no 503.
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, curl, chatBody } from '../integration/harness.mjs';

const sh = fs.existsSync('/usr/bin/sh') ? '/usr/bin/sh' : '/bin/sh';

describe('run outcomes through HTTP', () => {
  let server, dir;

  before(async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'olp-outcomes-'));
    fs.chmodSync(dir, 0o755);
    // A read-only path that is a dangling link: bwrap cannot find the source to bind.
    const dangling = path.join(dir, 'dangling');
    fs.symlinkSync('/nonexistent/olp-outcomes-target', dangling);
    const cmd = (id, argv, extra = {}) => ({
      type: 'command', argv, timeout_s: 20, network: false, models: [{ id }], ...extra,
    });
    const registry = {
      providers: {
        nocmd: cmd('nocmd', [path.join(dir, 'no-such-command')]),
        nosandbox: cmd('nosandbox', ['/usr/bin/cat'], { ro_paths: [dangling] }),
        'mimic-stub': cmd('mimic-stub', [sh, '-c',
          "echo 'olp-sandbox-exec: execve /x: No such file or directory' >&2; exit 127"]),
        'mimic-bwrap': cmd('mimic-bwrap', [sh, '-c', "echo 'bwrap: Creating new namespace failed' >&2; exit 1"]),
      },
    };
    // One worker, warm sandboxes on: the second request of a kind goes through the warm
    // sandbox the first one left (or, when that sandbox could not be built, cold again).
    server = await startServer({
      registry,
      config: { auth: { allow_anonymous: false }, sandbox: { mode: 'bwrap', warm: true } },
      maxProcs: 1,
    });
  });

  after(async () => {
    await server?.stop();
    if (dir) fs.rmSync(dir, { recursive: true, force: true });
  });

  const ask = (model) => curl(server, { method: 'POST', path: '/v1/chat/completions', body: chatBody(model, 'hi') });

  for (const round of ['cold', 'warm']) {
    test(`a command that cannot be executed: 502 provider_error (${round})`, async () => {
      const r = await ask('nocmd');
      assert.equal(r.status, 502, r.text);
      assert.equal(r.json?.error?.type, 'provider_error', r.text);
      assert.match(r.json.error.message, /could not be started/);
    });

    test(`a sandbox that cannot be built: 503 sandbox_unavailable (${round})`, async () => {
      const r = await ask('nosandbox');
      assert.equal(r.status, 503, r.text);
      assert.equal(r.json?.error?.type, 'sandbox_unavailable', r.text);
    });

    test(`a command that fails in the sandbox's words is a failed command: 502 (${round})`, async () => {
      for (const model of ['mimic-stub', 'mimic-bwrap']) {
        const r = await ask(model);
        assert.equal(r.status, 502, r.text);
        assert.equal(r.json?.error?.type, 'provider_error', r.text);
        assert.match(r.json.error.message, /failed \(exit status (127|1)\)/, r.text);
      }
    });
  }
});

// deploy/olp-local serve --server apache|nginx, as a user runs it (with the olp-fcgi
// under test as OLP_BIN): the same OLP_HOME handling as lighttpd's serve (an owner key
// made on the first start, its token printed once with a curl example), the server in
// the foreground on 127.0.0.1:OLP_PORT with OLP at / (the printed URLs work), run as
// olp when serve is root, and Ctrl-C (SIGINT to serve's process group) leaving nothing
// running. serve.test.mjs covers the lighttpd default in depth.

import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';

import { chatBody, descendants, kindMissing, procsMentioning, serveRoot, startServe } from './harness.mjs';

const SERVERS = [
  ['apache', 'apache2'],
  ['nginx', 'nginx'],
];
for (const [server] of SERVERS) {
  const missing = kindMissing(server);
  if (missing) {
    // CTest's SKIP_RETURN_CODE: a host reason, stated, never a pass.
    process.stdout.write(`SKIP: serve --server ${server}: ${missing}\n`);
    process.exit(77);
  }
}

const root = serveRoot('olp-serve-servers-');

const TOKEN_RE = /olp_[A-Za-z0-9_-]{43}/g;

const serve = (server, home) =>
  startServe(home, ['--server', server], {
    readyPath: '/health/live',
    env: {
      OLP_MAX_PROCS: '2',
      ...(process.env.OLP_KEYS ? { OLP_KEYS: process.env.OLP_KEYS } : {}),
      ...Object.fromEntries(['ASAN_OPTIONS', 'UBSAN_OPTIONS'].filter((k) => process.env[k]).map((k) => [k, process.env[k]])),
    },
  });

for (const [server, comm] of SERVERS) {
  describe(`deploy/olp-local serve --server ${server}`, () => {
    it('prints the owner token once, serves the API at /, runs as olp under root, stops on Ctrl-C', async () => {
      const home = path.join(root, `home-${server}`);
      const s = await serve(server, home);
      try {
        const printed = s.out().match(TOKEN_RE) ?? [];
        assert.equal(new Set(printed).size, 1, `one token printed expected:\n${s.out()}`);
        const token = printed[0];
        assert.match(s.out(), new RegExp(`OLP on http://127.0.0.1:\\d+ +\\(${server}; Ctrl-C to stop\\)`));
        assert.match(s.out(), /curl -s http:\/\/127\.0\.0\.1:\d+\/v1\/models/);
        assert.equal(fs.statSync(home).mode & 0o777, 0o700);
        const auth = { Authorization: `Bearer ${token}` };
        const m = await fetch(s.url('/v1/models'), { headers: auth });
        assert.equal(m.status, 200, await m.text());
        assert.equal((await fetch(s.url('/v1/models'))).status, 401);
        const c = await fetch(s.url('/v1/chat/completions'), {
          method: 'POST',
          headers: { ...auth, 'Content-Type': 'application/json' },
          body: JSON.stringify(chatBody('olp-echo', `via ${server}`)),
        });
        const cj = await c.json();
        assert.equal(c.status, 200, JSON.stringify(cj));
        assert.equal(cj.choices[0].message.content, `via ${server}`);
        if (process.getuid() === 0) {
          // The workers, and every process of the server but a master that binds the port
          // (Apache's, nginx's) and hands its children to olp, run as olp.
          const olp = Number(execFileSync('id', ['-u', 'olp'], { encoding: 'utf8' }));
          // (A process may be gone by the time its status is read: a sandbox helper.)
          const uid = (pid) => {
            try {
              return Number(/^Uid:\s+(\d+)/m.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))[1]);
            } catch {
              return null;
            }
          };
          const uids = procsMentioning(home)
            .filter((p) => p.comm === 'olp-fcgi')
            .map((p) => uid(p.pid))
            .filter((u) => u !== null);
          assert.ok(uids.length >= 1, 'no worker found');
          assert.deepEqual([...new Set(uids)], [olp], 'workers not run as olp');
          // (nginx clears its workers' environment: they are found below its master.)
          const masters = procsMentioning(home).filter((p) => p.comm === comm);
          const servers = [...masters, ...masters.flatMap((p) => descendants(p.pid))].filter((p) => p.comm === comm);
          assert.ok(servers.some((p) => uid(p.pid) === olp), `no ${comm} process runs as olp`);
        }
      } finally {
        await s.stop();
      }
    });
  });
}

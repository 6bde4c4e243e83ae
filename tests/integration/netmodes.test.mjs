// providers.<name>.network through the whole stack (issue 12, ADR 0018): curl → lighttpd →
// olp-fcgi → bubblewrap → a COMMAND provider in upstream mode that calls $OLP_UPSTREAM_URL
// with /usr/bin/curl, sending placeholder credentials → the worker's forwarder → a fake
// upstream started here, which must see the real key (read by the worker from a file:
// source, mode 0600) and never the placeholder or the OLP token. The command prints its
// environment and every file of its home and /tmp: the key must be nowhere in them, nor in
// the logs. /health shows each provider's mode to the owner only. With the sandbox off, a
// provider in upstream mode fails closed (503) and the start-up log says so.
//
// Where the sandbox cannot give a run a namespace of its own yet (sandbox/ without
// SBX_NET_LOOPBACK), the upstream run must fail closed (503 naming the mode); the forwarder
// checks are then reported as skipped, never passed.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';

import { cfg, chatBody, curl, startServer, testConfig } from './harness.mjs';

const KEY = 'sk-real-' + randomBytes(18).toString('hex');
const PLACEHOLDER = 'placeholder-in-the-run';

let work, upstream, srv;
const seen = []; // what the fake upstream received: {method, url, headers}

function startUpstream() {
  const s = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      seen.push({ method: req.method, url: req.url, headers: req.headers, body: Buffer.concat(chunks).toString() });
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.end(`upstream-answer ${req.method} ${req.url}\n`);
    });
  });
  return new Promise((resolve) => s.listen(0, '127.0.0.1', () => resolve(s)));
}

// The command: the upstream's answer, then its environment and every file it can write
// to (its home, /tmp), for the test to search for the key.
const SCRIPT = [
  'cat >/dev/null',
  `/usr/bin/curl -sS --max-time 20 -H 'x-api-key: ${PLACEHOLDER}' -H 'Authorization: Bearer ${PLACEHOLDER}' ` +
    '-H "Content-Type: application/json" --data-binary \'{"q":1}\' "$OLP_UPSTREAM_URL/v1/echo?x=1" || echo "curl failed $?"',
  '/usr/bin/curl -sS --max-time 20 -o /dev/null -w "other-status %{http_code}\\n" "$OLP_UPSTREAM_URL/v1/other"',
  '/usr/bin/curl -sS --max-time 20 -o /dev/null -w "get-status %{http_code}\\n" "$OLP_UPSTREAM_URL/v1/echo"',
  '/usr/bin/curl -sS --max-time 20 -o /dev/null -X TRACE -w "trace-status %{http_code}\\n" "$OLP_UPSTREAM_URL/v1/echo"',
  'echo "--- env"',
  'env',
  'echo "--- files"',
  'find "$HOME" /tmp -type f -exec cat {} + 2>/dev/null',
  'echo "--- cmdline"',
  'tr "\\0" " " </proc/self/cmdline',
].join('\n');

// CONNECT mode: curl takes the proxy from HTTPS_PROXY; what the forwarder answered each
// CONNECT is %{http_connect}.
const CONNECT_SCRIPT = [
  'cat >/dev/null',
  'echo "proxy $HTTPS_PROXY"',
  'for u in https://192.0.2.1/ https://127.0.0.1:443/ https://not-listed.example/; do',
  '  /usr/bin/curl -s --max-time 20 -o /dev/null -w "connect $u %{http_connect}\\n" "$u"',
  'done',
  '/usr/bin/curl -s --noproxy "*" --max-time 5 -o /dev/null -w "direct %{http_code}\\n" https://192.0.2.1/ || echo "direct failed $?"',
].join('\n');

function registry(upURL, keyFile) {
  const cmd = (id, network, argv = ['/bin/sh', '-c', SCRIPT]) => ({
    type: 'command', argv, timeout_s: 30, network, models: [{ id, created: 1700000000 }],
  });
  return {
    providers: {
      up: cmd('up-model', { upstream: upURL, set_headers: { 'x-api-key': `file:${keyFile}` }, allow_paths: ['POST /v1/echo'] }),
      pass: cmd('pass-model', { upstream: upURL }),
      conn: cmd('conn-model', { allow_hosts: ['api.anthropic.com:443'] }, ['/bin/sh', '-c', CONNECT_SCRIPT]),
      hostnet: cmd('host-model', 'host', ['/usr/bin/cat']),
      nonet: cmd('none-model', false, ['/usr/bin/cat']),
      // The listener and the key file stay the worker's: the run has fds 0-2 only.
      upfd: cmd('upfd-model', { upstream: upURL, set_headers: { 'x-api-key': `file:${keyFile}` }, allow_paths: ['POST /v1/echo'] },
        [cfg.fdcheck]),
    },
  };
}

before(async () => {
  work = fs.mkdtempSync(path.join(os.tmpdir(), 'olp-netmodes-'));
  const keyFile = path.join(work, 'upstream.key');
  fs.writeFileSync(keyFile, KEY + '\n', { mode: 0o600 });
  upstream = await startUpstream();
  const upURL = `http://127.0.0.1:${upstream.address().port}`;
  srv = await startServer({ registry: registry(upURL, keyFile), config: testConfig(), maxProcs: 1, threads: 2 });
});

after(async () => {
  try {
    await srv?.stop();
  } finally {
    upstream?.close();
    if (work) fs.rmSync(work, { recursive: true, force: true });
  }
});

describe('network modes', () => {
  it('/health shows each provider\'s mode, upstream host and secretless to the owner', async () => {
    const r = await curl(srv, { path: '/health' });
    assert.equal(r.status, 200, r.text);
    const p = r.json.providers;
    assert.equal(p.up.network, 'upstream');
    assert.equal(p.up.upstream_host, `127.0.0.1:${upstream.address().port}`);
    assert.equal(p.up.secretless, true);
    assert.equal(p.pass.network, 'upstream');
    assert.equal(p.pass.secretless, false);
    assert.equal(p.conn.network, 'connect');
    assert.equal(p.conn.secretless, false);
    assert.equal(p.conn.upstream_host, undefined);
    assert.equal(p.hostnet.network, 'host');
    assert.equal(p.hostnet.secretless, false);
    assert.equal(p.nonet.network, 'none');
  });

  it('a caller without the owner token sees no providers in /health', async () => {
    const r = await curl(srv, { path: '/health', auth: false });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.providers, undefined, r.text);
    assert.ok(!r.text.includes('upstream'), r.text);
  });

  it('the start-up log names the provider on the host network', () => {
    assert.match(srv.errorLog(), /PROVIDER NETWORK HOST: provider hostnet/);
  });

  it('upstream mode: the upstream sees the real key, the run holds none', async (t) => {
    const before = seen.length;
    const r = await curl(srv, { method: 'POST', path: '/v1/chat/completions', body: chatBody('up-model', 'go') });
    if (r.status === 503 && /network "upstream"\) could not be set up/.test(r.json?.error?.message ?? '')) {
      // Fail closed where the sandbox has no loopback namespace yet: nothing ran.
      assert.equal(seen.length, before);
      t.skip(`the sandbox gives no loopback namespace here: ${r.json.error.message}`);
      return;
    }
    assert.equal(r.status, 200, r.text);
    const out = r.json.choices[0].message.content;
    assert.match(out, /^upstream-answer POST \/v1\/echo\?x=1$/m, out);
    assert.match(out, /^other-status 403$/m, 'a path outside allow_paths is refused');
    assert.match(out, /^get-status 405$/m, 'a method outside allow_paths is refused');
    assert.match(out, /^trace-status 405$/m, 'TRACE is never forwarded');
    assert.equal(seen.length, before + 1);
    const h = seen.at(-1).headers;
    assert.equal(h['x-api-key'], KEY);
    assert.equal(h.authorization, undefined, 'the placeholder Authorization was dropped');
    const all = JSON.stringify(seen.at(-1));
    assert.ok(!all.includes(PLACEHOLDER), all);
    assert.ok(!all.includes(srv.token), 'the OLP token reached the upstream');
    // The run's environment, files and command line hold no key.
    assert.match(out, /^OLP_UPSTREAM_URL=http:\/\/127\.0\.0\.1:4180$/m, out);
    assert.ok(!out.includes(KEY), out);
    assert.ok(!out.includes(srv.token), out);
    assert.ok(!srv.errorLog().includes(KEY), 'the key is in a log');
  });

  it('upstream mode: the run inherits no descriptor beyond 0-2 (not the listener)', async (t) => {
    const r = await curl(srv, { method: 'POST', path: '/v1/chat/completions', body: chatBody('upfd-model', 'go') });
    if (r.status === 503) {
      t.skip(`the sandbox gives no loopback namespace here: ${r.json?.error?.message}`);
      return;
    }
    assert.equal(r.status, 200, r.text);
    const report = JSON.parse(r.json.choices[0].message.content.trim());
    assert.deepEqual(report.fds, [0, 1, 2], `child fds: ${JSON.stringify(report)}`);
    assert.equal(report.fd0_socket, false);
  });

  it('upstream mode without set_headers: the command\'s own credentials pass through', async (t) => {
    const before = seen.length;
    const r = await curl(srv, { method: 'POST', path: '/v1/chat/completions', body: chatBody('pass-model', 'go') });
    if (r.status === 503) {
      t.skip(`the sandbox gives no loopback namespace here: ${r.json?.error?.message}`);
      return;
    }
    // pass has no allow_paths and no set_headers: the CLI's own headers go through.
    assert.equal(r.status, 200, r.text);
    // A command that holds its own credential and lists nothing may make any request
    // (the worker adds nothing a path could spend), but never TRACE.
    const out = r.json.choices[0].message.content;
    assert.match(out, /^other-status 200$/m, 'no allow_paths: any path');
    assert.match(out, /^get-status 200$/m, out);
    assert.match(out, /^trace-status 405$/m, out);
    assert.equal(seen.length, before + 3);
    assert.equal(seen.at(-3).headers['x-api-key'], PLACEHOLDER);
  });

  it('CONNECT mode: only listed names; raw IPs and unlisted hosts refused, no way around the proxy', async (t) => {
    const r = await curl(srv, { method: 'POST', path: '/v1/chat/completions', body: chatBody('conn-model', 'go') });
    if (r.status === 503) {
      t.skip(`the sandbox gives no loopback namespace here: ${r.json?.error?.message}`);
      return;
    }
    assert.equal(r.status, 200, r.text);
    const out = r.json.choices[0].message.content;
    assert.match(out, /^proxy http:\/\/127\.0\.0\.1:4180$/m, out);
    assert.match(out, /^connect https:\/\/192\.0\.2\.1\/ 403$/m, out);
    assert.match(out, /^connect https:\/\/127\.0\.0\.1:443\/ 403$/m, out);
    assert.match(out, /^connect https:\/\/not-listed\.example\/ 403$/m, out);
    // Around the proxy: no route at all.
    assert.match(out, /^direct 000$|^direct failed/m, out);
  });

  it('a key file that went away fails the run with 502 before it starts, naming the file in the log only', async () => {
    const keyFile = path.join(work, 'upstream.key');
    fs.renameSync(keyFile, keyFile + '.away');
    try {
      const before = seen.length;
      const r = await curl(srv, { method: 'POST', path: '/v1/chat/completions', body: chatBody('up-model', 'go') });
      assert.equal(r.status, 502, r.text);
      assert.match(r.json.error.message, /credential/);
      assert.ok(!r.text.includes(keyFile), r.text);
      assert.equal(seen.length, before);
      assert.ok(srv.errorLog().includes(`file ${keyFile}: No such file`), 'the log names the file');
      // The worker is still up.
      const ok = await curl(srv, { method: 'POST', path: '/v1/chat/completions', body: chatBody('none-model', 'still here') });
      assert.equal(ok.status, 200, ok.text);
    } finally {
      fs.renameSync(keyFile + '.away', keyFile);
    }
  });
});

describe('network modes with the sandbox off', () => {
  let off;
  before(async () => {
    const keyFile = path.join(work, 'upstream.key');
    off = await startServer({
      registry: registry(`http://127.0.0.1:${upstream.address().port}`, keyFile),
      config: { ...testConfig(), sandbox: { mode: 'off' } },
      maxProcs: 1,
      threads: 2,
    });
  });
  after(async () => {
    await off?.stop();
  });

  it('upstream mode fails closed (503) and says how to get the host network', async () => {
    const before = seen.length;
    const r = await curl(off, { method: 'POST', path: '/v1/chat/completions', body: chatBody('up-model', 'go') });
    assert.equal(r.status, 503, r.text);
    assert.match(r.json.error.message, /network "upstream".*sandbox.*"host"/);
    assert.equal(seen.length, before);
    assert.match(off.errorLog(), /provider up: network \\?"upstream\\?" needs the sandbox, which is off/);
  });
});

describe('network modes with warm sandboxes', () => {
  let warm;
  before(async () => {
    warm = await startServer({
      registry: registry(`http://127.0.0.1:${upstream.address().port}`, path.join(work, 'upstream.key')),
      config: { ...testConfig(), sandbox: { mode: 'bwrap', warm: true } },
      maxProcs: 1,
      threads: 2,
    });
  });
  after(async () => {
    await warm?.stop();
  });

  it('each run, warm or not, gets a forwarder with the real key', async (t) => {
    for (let i = 0; i < 3; i++) {
      const before = seen.length;
      const r = await curl(warm, { method: 'POST', path: '/v1/chat/completions', body: chatBody('up-model', `go ${i}`) });
      if (r.status === 503) {
        t.skip(`the sandbox gives no loopback namespace here: ${r.json?.error?.message}`);
        return;
      }
      assert.equal(r.status, 200, r.text);
      assert.match(r.json.choices[0].message.content, /^upstream-answer POST \/v1\/echo\?x=1$/m);
      assert.equal(seen.length, before + 1);
      assert.equal(seen.at(-1).headers['x-api-key'], KEY);
    }
  });
});

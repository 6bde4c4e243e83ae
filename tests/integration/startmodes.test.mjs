// The same olp-fcgi binary in its three start modes, each answering /health:
//   1. spawned by lighttpd (bin-path; lighttpd/olp.conf),
//   2. spawned by spawn-fcgi on a unix socket, lighttpd pointed at it,
//   3. plain CGI (not started as FastCGI: CGI variables, body on stdin,
//      "Status:" header on stdout).

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';

import {
  cfg,
  chatBody,
  curl,
  freePort,
  isAlive,
  jsonOrUndefined,
  makeHome,
  procsMentioning,
  runSync,
  startServer,
  waitFor,
} from './harness.mjs';

const cleanups = [];
after(async () => {
  for (const f of cleanups.reverse()) await f();
});

describe('start modes', () => {
  it('1. spawned by lighttpd via bin-path', async () => {
    const srv = await startServer({ maxProcs: 1 });
    try {
      const r = await curl(srv, { path: '/health', auth: false });
      assert.equal(r.status, 200, r.text);
      assert.equal(r.json.ok, true);
      assert.equal(srv.workerPids().length, 1);
    } finally {
      await srv.stop();
    }
  });

  it('2. spawned by spawn-fcgi, behind lighttpd', async (t) => {
    if (!cfg.spawnFcgi) {
      t.skip('spawn-fcgi not installed');
      return;
    }
    const dirs = makeHome();
    const token = 'olp_test_spawnfcgi_token';
    const sock = path.join(dirs.runDir, 'spawned.sock');
    const pidFile = path.join(dirs.runDir, 'spawn-fcgi.pid');
    const env = {
      PATH: process.env.PATH ?? '/usr/bin:/bin:/usr/sbin:/sbin',
      OLP_HOME: dirs.home,
      OLP_OWNER_TOKEN: token,
      OLP_THREADS: '2',
      OLP_LOG_LEVEL: 'debug',
    };
    for (const k of ['ASAN_OPTIONS', 'UBSAN_OPTIONS', 'LSAN_OPTIONS']) if (process.env[k]) env[k] = process.env[k];
    // -n: no fork; spawn-fcgi binds the socket, puts it on fd 0 and execs
    // olp-fcgi in its own process, so fcgi.pid is the worker's pid.
    const errLog = fs.openSync(path.join(dirs.runDir, 'olp-fcgi.stderr'), 'a');
    const fcgi = spawn(cfg.spawnFcgi, ['-n', '-s', sock, '-M', '0600', '-P', pidFile, '--', cfg.bin], {
      env,
      stdio: ['ignore', 'ignore', errLog],
    });
    fs.closeSync(errLog);
    const fcgiExit = new Promise((resolve) => fcgi.once('exit', resolve));
    cleanups.push(async () => {
      if (fcgi.exitCode === null && fcgi.signalCode === null) {
        fcgi.kill('SIGTERM');
        await Promise.race([fcgiExit, sleep(5000)]);
        if (isAlive(fcgi.pid)) fcgi.kill('SIGKILL');
      }
    });
    assert.ok(await waitFor(() => fs.existsSync(sock), { timeoutMs: 5000 }), 'spawn-fcgi did not create its socket');

    const port = await freePort();
    const conf = path.join(dirs.runDir, 'spawn-fcgi-lighttpd.conf');
    fs.writeFileSync(
      conf,
      [
        'server.modules = ("mod_fastcgi")',
        `server.bind = "127.0.0.1"`,
        `server.port = ${port}`,
        `server.document-root = "${dirs.runDir}"`,
        `server.errorlog = "${dirs.runDir}/error.log"`,
        'server.stream-response-body = 2',
        `fastcgi.server = ("/" => (("socket" => "${sock}", "check-local" => "disable")))`,
        '',
      ].join('\n'),
    );
    const lt = spawn(cfg.lighttpd, ['-D', '-f', conf], { stdio: 'ignore' });
    const ltExit = new Promise((resolve) => lt.once('exit', resolve));
    cleanups.push(async () => {
      if (lt.exitCode === null && lt.signalCode === null) {
        lt.kill('SIGTERM');
        await Promise.race([ltExit, sleep(5000)]);
      }
    });
    const srv = { token, url: (p) => `http://127.0.0.1:${port}${p}` };
    const up = await waitFor(
      async () => {
        try {
          const r = await fetch(srv.url('/health'), { signal: AbortSignal.timeout(2000) });
          await r.arrayBuffer();
          return r.status === 200;
        } catch {
          return false;
        }
      },
      { timeoutMs: 10000, stepMs: 100 },
    );
    assert.ok(up, `lighttpd + spawn-fcgi did not answer /health:\n${fs.readFileSync(path.join(dirs.runDir, 'error.log'), 'utf8')}`);
    const h = await curl(srv, { path: '/health', auth: false });
    assert.equal(h.status, 200, h.text);
    assert.equal(h.json.ok, true);
    const c = await curl(srv, { method: 'POST', path: '/v1/chat/completions', body: chatBody('echo', 'via spawn-fcgi') });
    assert.equal(c.status, 200, c.text);
    assert.equal(c.json.choices[0].message.content, 'via spawn-fcgi');

    // Stop both; nothing of this test may stay behind.
    lt.kill('SIGTERM');
    await Promise.race([ltExit, sleep(5000)]);
    fcgi.kill('SIGTERM');
    await Promise.race([fcgiExit, sleep(5000)]);
    assert.ok(!isAlive(fcgi.pid), 'olp-fcgi under spawn-fcgi did not exit on SIGTERM');
    const left = await waitFor(() => procsMentioning(dirs.root).length === 0, { timeoutMs: 5000 });
    assert.ok(left, `left running: ${JSON.stringify(procsMentioning(dirs.root))}`);
    fs.rmSync(dirs.root, { recursive: true, force: true });
  });

  describe('3. plain CGI', () => {
    function cgi(dirs, vars, body = '') {
      const input = path.join(dirs.root, 'stdin');
      fs.writeFileSync(input, body);
      const fd = fs.openSync(input, 'r');
      try {
        const r = runSync(cfg.bin, [], {
          stdio: [fd, 'pipe', 'pipe'],
          env: {
            PATH: process.env.PATH ?? '/usr/bin:/bin',
            OLP_HOME: dirs.home,
            OLP_OWNER_TOKEN: 'olp_test_cgi_token',
            GATEWAY_INTERFACE: 'CGI/1.1',
            SERVER_PROTOCOL: 'HTTP/1.1',
            SERVER_SOFTWARE: 'olp-integration-test',
            SERVER_NAME: 'localhost',
            SERVER_PORT: '80',
            REMOTE_ADDR: '127.0.0.1',
            SCRIPT_NAME: '',
            QUERY_STRING: '',
            ...vars,
          },
        });
        assert.equal(r.error, undefined, String(r.error));
        assert.equal(r.status, 0, `exit ${r.status} ${r.signal ?? ''}; stderr: ${r.stderr}`);
        const out = r.stdout.toString('utf8');
        const m = /\r?\n\r?\n/.exec(out);
        assert.ok(m, `no header/body separator in CGI output: ${out}`);
        const headers = {};
        for (const l of out.slice(0, m.index).split(/\r?\n/)) {
          const i = l.indexOf(':');
          if (i > 0) headers[l.slice(0, i).trim().toLowerCase()] = l.slice(i + 1).trim();
        }
        const status = headers.status ? Number(headers.status.split(' ')[0]) : 200;
        const text = out.slice(m.index + m[0].length);
        const json = jsonOrUndefined(text);
        return { status, headers, text, json, stderr: r.stderr.toString() };
      } finally {
        fs.closeSync(fd);
      }
    }

    it('answers GET /health with a Status header', () => {
      const dirs = makeHome();
      try {
        const r = cgi(dirs, { REQUEST_METHOD: 'GET', REQUEST_URI: '/health', PATH_INFO: '/health' });
        assert.ok(r.headers.status, `no Status header: ${JSON.stringify(r.headers)}`);
        assert.equal(r.status, 200, r.text);
        assert.match(r.headers['content-type'] ?? '', /^application\/json/);
        assert.equal(r.json?.ok, true, r.text);
        assert.equal(typeof r.json.version, 'string');
      } finally {
        fs.rmSync(dirs.root, { recursive: true, force: true });
      }
    });

    it('answers 404 for an unknown route', () => {
      const dirs = makeHome();
      try {
        const r = cgi(dirs, { REQUEST_METHOD: 'GET', REQUEST_URI: '/nope', PATH_INFO: '/nope' });
        assert.equal(r.status, 404, r.text);
        assert.equal(r.json?.error?.type, 'not_found');
      } finally {
        fs.rmSync(dirs.root, { recursive: true, force: true });
      }
    });

    it('runs a completion with the body on stdin', () => {
      const dirs = makeHome();
      try {
        const body = JSON.stringify(chatBody('echo', 'via cgi'));
        const r = cgi(
          dirs,
          {
            REQUEST_METHOD: 'POST',
            REQUEST_URI: '/v1/chat/completions',
            PATH_INFO: '/v1/chat/completions',
            CONTENT_TYPE: 'application/json',
            CONTENT_LENGTH: String(Buffer.byteLength(body)),
            HTTP_AUTHORIZATION: 'Bearer olp_test_cgi_token',
          },
          body,
        );
        assert.equal(r.status, 200, `${r.text}\n${r.stderr}`);
        assert.equal(r.json.choices[0].message.content, 'via cgi');
      } finally {
        fs.rmSync(dirs.root, { recursive: true, force: true });
      }
    });
  });

  // A worker starts one real sandbox while it starts (the status probe). lighttpd -tt and
  // Ctrl-C on olp-local serve stop workers that have only just started: one killed while
  // bwrap was building that sandbox left the sandbox's init blocked for ever. Stopped at
  // random moments of its start-up, no worker may leave a process behind.
  it('4. a worker stopped while it starts leaves no sandbox behind', async () => {
    const dirs = makeHome();
    try {
      for (let i = 0; i < 30; i++) {
        const child = spawn(cfg.bin, [], {
          stdio: ['ignore', 'ignore', 'ignore'],
          env: {
            PATH: process.env.PATH ?? '/usr/bin:/bin',
            OLP_HOME: dirs.home,
            GATEWAY_INTERFACE: 'CGI/1.1',
            REQUEST_METHOD: 'GET',
            REQUEST_URI: '/health',
          },
        });
        const exited = new Promise((resolve) => child.once('exit', resolve));
        await sleep(Math.random() * 60);
        child.kill('SIGTERM');
        await exited;
      }
      const gone = await waitFor(() => procsMentioning(dirs.root).length === 0, { timeoutMs: 5000 });
      assert.ok(gone, `left running: ${JSON.stringify(procsMentioning(dirs.root))}`);
    } finally {
      for (const p of procsMentioning(dirs.root)) {
        try {
          process.kill(p.pid, 'SIGKILL');
        } catch {
          /* gone */
        }
      }
      fs.rmSync(dirs.root, { recursive: true, force: true });
    }
  });
});

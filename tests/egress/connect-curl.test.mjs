// CONNECT mode with a real client: /usr/bin/curl with HTTPS_PROXY pointed at egress-forward
// in connect mode (issue 12). A listed name is tunnelled to a local TLS server (the fake
// OpenAI upstream serving a certificate of a test CA made here with openssl; the
// forwarder's -L lets the name resolve to this machine, for the test); an unlisted name,
// a listed name on another port and raw IPs in any form are refused with 403 before
// anything is connected; and without -L a listed name that resolves to loopback reaches
// nothing either.
//
// Env (set by CTest): EGRESS_FORWARD (the built egress-forward).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, mkdirSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startProc as startProcIn } from '../upstream/procs.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const forwardBin = process.env.EGRESS_FORWARD;
const CURL = '/usr/bin/curl';

let work, ca, server, proxy, strictProxy;
const children = new Set();
const startProc = (argv, env, what) => startProcIn(argv, env, what, children);


// curl through the proxy; resolves with its exit code, stdout and stderr.
function curl(url, proxyPort, extra = []) {
  return new Promise((resolve) => {
    const env = { PATH: '/usr/bin:/bin', HTTPS_PROXY: `http://127.0.0.1:${proxyPort}`,
                  https_proxy: `http://127.0.0.1:${proxyPort}` };
    const c = spawn(CURL, ['-sS', '--max-time', '60', '--cacert', ca, ...extra, url],
                    { env, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '', err = '';
    c.stdout.on('data', (d) => { out += d; });
    c.stderr.on('data', (d) => { err += d; });
    c.on('close', (code) => resolve({ code, out, err }));
  });
}

// How many requests the TLS server has answered (asked directly, not through the proxy).
const served = () => JSON.parse(execFileSync(CURL, ['-sS', '--noproxy', '*', '--cacert', ca,
  `https://localhost:${server.port}/_requests`])).length;

before(async () => {
  assert.ok(forwardBin && existsSync(forwardBin), 'EGRESS_FORWARD must name the built egress-forward');
  assert.ok(existsSync(CURL), `${CURL} is needed`);
  work = mkdtempSync(path.join(tmpdir(), 'olp-egress-connect-'));
  const c = path.join(work, 'ca');
  mkdirSync(c);
  execFileSync('sh', ['-c', [
    'set -e',
    'openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.pem -days 2 ' +
      '-subj /CN=olp-egress-connect-test-ca -addext basicConstraints=critical,CA:TRUE ' +
      '-addext keyUsage=critical,keyCertSign',
    'openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout server.key -out server.csr ' +
      '-subj /CN=localhost',
    "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\nbasicConstraints=CA:FALSE\\n" +
      "extendedKeyUsage=serverAuth\\n' > ext.cnf",
    'openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem ' +
      '-days 2 -extfile ext.cnf'].join('; ')], { cwd: c, stdio: 'ignore' });
  ca = path.join(c, 'ca.pem');
  server = await startProc([process.execPath, path.join(here, '..', 'upstream', 'fake-openai.mjs'), '0'],
    { ...process.env, FAKE_TLS_CERT: path.join(c, 'server.pem'), FAKE_TLS_KEY: path.join(c, 'server.key') },
    'fake-openai.mjs');
  proxy = await startProc([forwardBin, '-C', `localhost:${server.port}`, '-C', 'api.example.invalid:443', '-L'],
    { PATH: '/usr/bin:/bin' }, 'egress-forward');
  strictProxy = await startProc([forwardBin, '-C', `localhost:${server.port}`],
    { PATH: '/usr/bin:/bin' }, 'egress-forward');
});

after(() => {
  for (const c of children) c.kill('SIGKILL');
  if (work) rmSync(work, { recursive: true, force: true });
});

test('a listed name is tunnelled: TLS end to end, verified against the test CA', async () => {
  const n = served();
  const r = await curl(`https://localhost:${server.port}/v1/models`, proxy.port);
  assert.equal(r.code, 0, r.err);
  assert.deepEqual(JSON.parse(r.out), { object: 'list', data: [], models: [] });
  assert.equal(served(), n + 1);
  // The forwarder saw only the name: it logged the CONNECT, never the path inside TLS.
  assert.match(proxy.child.stderrText, new RegExp(`CONNECT localhost:${server.port}: open`));
  assert.ok(!proxy.child.stderrText.includes('/v1/models'));
});

test('refused with 403 before anything is connected: unlisted names, other ports, raw IPs', async () => {
  const n = served();
  const refused = [
    'https://not-listed.example:443/',	       // a name not in the list
    `https://localhost:${server.port + 1}/`, // a listed name, another port
    `https://127.0.0.1:${server.port}/`,     // the very server, by IP
    `https://[::1]:${server.port}/`,	       // IPv6 loopback
    `https://2130706433:${server.port}/`,    // 127.0.0.1 as one number
    `https://0x7f.1:${server.port}/`,	       // and in hex
    'https://169.254.169.254:443/',	       // cloud metadata
  ];
  for (const url of refused) {
    const r = await curl(url, proxy.port);
    // curl: exit 56 and "CONNECT tunnel failed, response 403".
    assert.equal(r.code, 56, `${url}: ${r.code} ${r.err}`);
    assert.match(r.err, /CONNECT tunnel failed, response 403/, url);
  }
  assert.equal(served(), n, 'a refused CONNECT reached the server');
});

test('without -L, a listed name that resolves to this machine reaches nothing', async () => {
  const n = served();
  const r = await curl(`https://localhost:${server.port}/v1/models`, strictProxy.port);
  assert.equal(r.code, 56, r.err);
  assert.match(r.err, /response 403/);
  assert.equal(served(), n);
});

test('a plain request to the connect-mode forwarder is not forwarded anywhere', async () => {
  const r = await new Promise((resolve) => {
    const c = spawn(CURL, ['-sS', '-o', '/dev/null', '-w', '%{http_code}', '--noproxy', '*',
      `http://127.0.0.1:${proxy.port}/v1/models`], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    c.stdout.on('data', (d) => { out += d; });
    c.on('close', (code) => resolve({ code, out }));
  });
  assert.equal(r.code, 0);
  assert.ok(['400', '405'].includes(r.out), `answered ${r.out}`);
});

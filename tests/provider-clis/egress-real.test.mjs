// The real claude and codex CLIs (pinned in package.json) talking to our fake upstreams
// (tests/upstream/) THROUGH the egress forwarder (egress/, run by the egress-forward tool
// in upstream mode), over HTTP and over HTTPS with a test CA made here with openssl
// (issue 12). The CLIs get the forwarder as their base URL and a placeholder key; the
// forwarder drops the placeholder and sets the real key, which only it and the upstream
// ever hold.
//
// The CLIs run unsandboxed here, with a cleared environment as OLP gives them: what is
// under test is the CLI ↔ forwarder ↔ upstream path (the sandbox's network namespace is
// tested where it is built). Their stdout is read as it comes and timed line by line,
// then piped through `prov-driver parse` for OLP's view of it (deltas, usage, errors).
//
// Env (set by CTest): PROV_DRIVER, EGRESS_FORWARD (the built tools).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import http from 'node:http';
import https from 'node:https';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, mkdirSync, writeFileSync, readFileSync, readdirSync, rmSync, existsSync,
         lstatSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startProc as startProcIn } from '../upstream/procs.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const upstreamDir = path.join(here, '..', 'upstream');
const driver = process.env.PROV_DRIVER;
const forwardBin = process.env.EGRESS_FORWARD;
const claudeBin = path.join(here, 'node_modules/@anthropic-ai/claude-code/bin/claude.exe');
const codexJs = path.join(here, 'node_modules/@openai/codex/bin/codex.js');
const CLAUDE_TEXT = 'Hello from the fake Anthropic server!';
const CODEX_TEXT = 'Hello from the fake OpenAI server!';
// The fake upstreams space their deltas this far apart.
const DELTA_MS = 200;

// The real keys: only the forwarder's argv (the worker's side) and the upstream see them.
// Their random part is what must appear nowhere on the CLI's side.
const SECRET = randomBytes(12).toString('hex');
const REAL_ANTHROPIC = `sk-ant-api03-REAL${SECRET}`;
const REAL_OPENAI = `sk-proj-REAL${SECRET}`;
// What the CLIs are given instead; they look like OLP tokens on purpose, so that the
// upstream's log shows that nothing of that shape is passed on.
const PLACEHOLDER_CLAUDE = 'sk-olp-placeholder-claude-000000';
const PLACEHOLDER_CODEX = 'sk-olp-placeholder-codex-000000';
const OLP_TOKEN = 'sk-olp-0123456789abcdef0123456789abcdef';
// claude's default requests in network.c.
const CLAUDE_ALLOW = ['POST /v1/messages', 'POST /v1/messages/count_tokens'];

let work, ca;
const up = {};	// up[scheme] = { anthropic, openai } servers
const fwd = {};	// fwd[scheme] = { anthropic, openai } forwarders
const children = new Set();
const startProc = (argv, env, what) => startProcIn(argv, env, what, children);


async function startUpstream(file, scheme) {
  const env = { ...process.env, FAKE_DELTA_MS: String(DELTA_MS) };
  if (scheme === 'https') Object.assign(env, { FAKE_TLS_CERT: ca.cert, FAKE_TLS_KEY: ca.key });
  const s = await startProc([process.execPath, path.join(upstreamDir, file), '0'], env, file);
  return { ...s, url: `${scheme}://127.0.0.1:${s.port}` };
}

// egress-forward in upstream mode: listens on 127.0.0.1, prints its port. allow: the
// "METHOD /path" requests allowed; models: bodies checked (-B), their model one of these.
async function startForwarder(upstreamUrl, setHeader, allow, { withCa = true, models = null } = {}) {
  const argv = [forwardBin, '-s', setHeader];
  for (const a of allow) argv.push('-a', a);
  if (models) argv.push('-B', ...models.flatMap((m) => ['-m', m]));
  if (withCa && upstreamUrl.startsWith('https:')) argv.push('-c', ca.ca);
  argv.push(upstreamUrl);
  const s = await startProc(argv, { PATH: '/usr/bin:/bin' }, 'egress-forward');
  return { ...s, url: `http://127.0.0.1:${s.port}` };
}

// The fake upstream's log of requests (over TLS with the test CA for an https one).
function requests(server) {
  const mod = server.url.startsWith('https:') ? https : http;
  return new Promise((resolve, reject) => {
    mod.get(`${server.url}/_requests`, { ca: ca && readFileSync(ca.ca) }, (res) => {
      let body = '';
      res.on('data', (d) => { body += d; });
      res.on('end', () => resolve(JSON.parse(body)));
    }).on('error', reject);
  });
}

// Tell the fake upstream that the client saw one more delta (deltaGate, upstream/common.mjs).
function seen(server) {
  const mod = server.url.startsWith('https:') ? https : http;
  return new Promise((resolve, reject) => {
    const req = mod.request(`${server.url}/_seen`, { method: 'POST', ca: ca && readFileSync(ca.ca) }, (res) => {
      res.resume();
      res.on('end', resolve);
    });
    req.on('error', reject);
    req.end();
  });
}

// One request as written, path and all (fetch would normalise the path first).
function rawRequest(port, method, reqPath, headers = {}) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, method, path: reqPath, headers }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode));
    });
    req.on('error', reject);
    req.end();
  });
}

// Every process under pid (itself included), from /proc.
function descendants(pid) {
  const kids = new Map();
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const stat = readFileSync(`/proc/${d}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (!kids.has(ppid)) kids.set(ppid, []);
      kids.get(ppid).push(Number(d));
    } catch { /* gone */ }
  }
  const all = [], todo = [pid];
  while (todo.length) {
    const p = todo.pop();
    all.push(p);
    todo.push(...(kids.get(p) ?? []));
  }
  return all;
}

// Run a CLI; stdout lines are timed as they arrive. While it runs, the environment and
// argv of its whole process tree are read from /proc every 50 ms.
function runCli(argv, env, input, { timeoutMs = 90000, onLine } = {}) {
  return new Promise((resolve, reject) => {
    const t0 = Date.now();
    const child = spawn(argv[0], argv.slice(1), { stdio: ['pipe', 'pipe', 'pipe'], env });
    children.add(child);
    let out = '', err = '', partial = '';
    const lines = [];
    const seen = { procs: new Set(), environ: [], cmdline: [] };
    const sample = () => {
      for (const p of descendants(child.pid)) {
        try {
          seen.environ.push(readFileSync(`/proc/${p}/environ`, 'latin1'));
          seen.cmdline.push(readFileSync(`/proc/${p}/cmdline`, 'latin1'));
          seen.procs.add(p);
        } catch { /* exited meanwhile */ }
      }
    };
    const sampler = setInterval(sample, 50);
    sample();
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.stdout.on('data', (d) => {
      const now = Date.now();
      out += d;
      partial += d;
      let nl;
      while ((nl = partial.indexOf('\n')) >= 0) {
        lines.push({ t: now, line: partial.slice(0, nl) });
        if (onLine) onLine(partial.slice(0, nl));
        partial = partial.slice(nl + 1);
      }
    });
    child.stderr.on('data', (d) => { err += d; });
    child.on('error', reject);
    child.on('close', (code) => {
      clearInterval(sampler);
      clearTimeout(timer);
      children.delete(child);
      resolve({ code, out, err, lines, seen, ms: Date.now() - t0 });
    });
    child.stdin.end(input);
  });
}

// OLP's view of a CLI's stdout: prov-driver parse TYPE.
function parse(type, out) {
  const res = execFileSync(driver, ['parse', type], { input: out });
  return res.toString().split('\n').filter(Boolean).map((l) => JSON.parse(l));
}

function freshDir(name) {
  const d = mkdtempSync(path.join(work, `${name}-`));
  mkdirSync(path.join(d, 'home'));
  mkdirSync(path.join(d, 'tmp'));
  return d;
}

// Every file under dir, read (what a CLI left in its home: settings, caches, logs).
function filesUnder(dir) {
  const out = [];
  for (const name of readdirSync(dir)) {
    const p = path.join(dir, name), st = lstatSync(p);
    if (st.isDirectory()) out.push(...filesUnder(p));
    else if (st.isFile()) out.push({ p, text: readFileSync(p, 'latin1') });
  }
  return out;
}

// gate: the upstream streams in lockstep with claude's output (deltaGate): each text delta
// claude prints is reported to it before it writes the next.
async function claude(scheme, model, { gate = false } = {}) {
  const d = freshDir('claude');
  const argv = [claudeBin, '-p', '--output-format', 'stream-json', '--verbose',
    '--include-partial-messages', '--no-session-persistence', '--model', model,
    '--system-prompt', 'Be brief.', '--tools', ''];
  const env = { PATH: '/usr/bin:/bin', HOME: path.join(d, 'home'), LANG: 'C.UTF-8',
    TMPDIR: path.join(d, 'tmp'), CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1',
    DISABLE_AUTOUPDATER: '1', CLAUDE_CODE_MAX_RETRIES: '0',
    ANTHROPIC_BASE_URL: fwd[scheme].anthropic.url, ANTHROPIC_API_KEY: PLACEHOLDER_CLAUDE,
    // A header a confused or hostile CLI might add: an OLP token as a bearer. The
    // forwarder drops every credential header it does not set itself.
    ANTHROPIC_CUSTOM_HEADERS: `Authorization: Bearer ${OLP_TOKEN}\nX-Egress-Probe: custom-header-passed` +
      (gate ? '\nX-Fake-Delta-Gate: 1' : '') };
  const seenPosts = [];
  const onLine = gate
    ? (line) => {
        if (/"content_block_delta"/.test(line) && /"text_delta"/.test(line)) seenPosts.push(seen(up[scheme].anthropic));
      }
    : undefined;
  const r = await runCli(argv, env, 'Say hello', { onLine });
  await Promise.all(seenPosts);
  return { ...r, dir: d, env, argv, events: parse('claude', r.out) };
}

async function codex(scheme, model) {
  const d = freshDir('codex');
  const codexHome = path.join(d, 'codex-home');
  mkdirSync(codexHome);
  writeFileSync(path.join(codexHome, 'config.toml'), [
    'model_provider = "fake"', '',
    // codex reads no OPENAI_BASE_URL: the base URL is the model provider's.
    '[model_providers.fake]', 'name = "fake"', `base_url = "${fwd[scheme].openai.url}/v1"`,
    'wire_api = "responses"', 'env_key = "OPENAI_API_KEY"',
    'request_max_retries = 0', 'stream_max_retries = 0', '',
    '[analytics]', 'enabled = false', '', '[features]', 'plugins = false', ''].join('\n'));
  const argv = [process.execPath, codexJs, 'exec', '--json', '--skip-git-repo-check', '--ephemeral',
    '--dangerously-bypass-approvals-and-sandbox', '--model', model, '-'];
  const env = { PATH: '/usr/bin:/bin', HOME: path.join(d, 'home'), LANG: 'C.UTF-8',
    TMPDIR: path.join(d, 'tmp'), CODEX_HOME: codexHome, OPENAI_API_KEY: PLACEHOLDER_CODEX };
  const r = await runCli(argv, env, 'Say hello');
  return { ...r, dir: d, env, argv, events: parse('codex', r.out) };
}

const deltas = (events) => events.filter((e) => e.ev === 'delta');
// The run's usage: the last report (claude reports the prompt's count at the message's
// start too, marked partial).
const usage = (events) => events.findLast((e) => e.ev === 'usage' && !e.partial);
const errorEv = (events) => events.find((e) => e.ev === 'error');
const gaps = (ts) => ts.slice(1).map((t, i) => t - ts[i]);

// Nothing of the real key anywhere on the CLI's side: its output, the environment and
// argv of every process it started (read while it ran), the files it left behind.
function assertNoSecret(r) {
  assert.ok(r.seen.procs.size >= 1, 'the CLI was never seen running');
  const places = [['stdout', r.out], ['stderr', r.err], ...r.seen.environ.map((e) => ['environ', e]),
    ...r.seen.cmdline.map((c) => ['cmdline', c]),
    ...filesUnder(r.dir).map((f) => [f.p, f.text])];
  for (const [where, text] of places) {
    assert.ok(!text.includes(SECRET), `the real key's secret part is in ${where}`);
  }
  // The placeholder is what the CLI holds, and it did hold it (the check above is not
  // vacuous: the environment was read).
  assert.ok(r.seen.environ.some((e) => e.includes('sk-olp-placeholder-')), 'environ never read');
}

// The upstream saw the real key, set by the forwarder, and never the placeholder or
// anything like an OLP token.
function assertUpstreamCredentials(reqs, kind, server) {
  assert.ok(reqs.length >= 1, 'the upstream saw no request');
  for (const q of reqs) {
    const h = q.headers;
    if (kind === 'anthropic') {
      assert.equal(h['x-api-key'], REAL_ANTHROPIC);
      assert.equal(h.authorization, undefined, 'the client\'s Authorization was passed on');
    } else {
      assert.equal(h.authorization, `Bearer ${REAL_OPENAI}`);
      assert.equal(h['x-api-key'], undefined);
    }
    const all = JSON.stringify(h);
    assert.ok(!/sk-olp/i.test(all), `an OLP-looking token reached the upstream: ${all}`);
    assert.ok(!all.includes('placeholder'), 'the placeholder reached the upstream');
    // The Host is the upstream's, not the forwarder's that the CLI wrote.
    assert.equal(h.host, `127.0.0.1:${server.port}`);
  }
}

before(async () => {
  assert.ok(driver && existsSync(driver), 'PROV_DRIVER must name the built prov-driver');
  assert.ok(forwardBin && existsSync(forwardBin), 'EGRESS_FORWARD must name the built egress-forward');
  assert.ok(existsSync(claudeBin) && existsSync(codexJs), 'run `npm ci` in tests/provider-clis first');
  work = mkdtempSync(path.join(tmpdir(), 'olp-egress-real-'));
  // A test CA and a server certificate for 127.0.0.1, made now.
  const c = path.join(work, 'ca');
  mkdirSync(c);
  execFileSync('sh', ['-c', [
    'set -e',
    'openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.pem -days 2 ' +
      '-subj /CN=olp-egress-real-test-ca -addext basicConstraints=critical,CA:TRUE ' +
      '-addext keyUsage=critical,keyCertSign',
    'openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout server.key -out server.csr ' +
      '-subj /CN=localhost',
    "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\nbasicConstraints=CA:FALSE\\n" +
      "extendedKeyUsage=serverAuth\\n' > ext.cnf",
    'openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem ' +
      '-days 2 -extfile ext.cnf'].join('; ')], { cwd: c, stdio: 'ignore' });
  ca = { ca: path.join(c, 'ca.pem'), cert: path.join(c, 'server.pem'), key: path.join(c, 'server.key') };
  for (const scheme of ['http', 'https']) {
    const [anthropic, openai] = await Promise.all([startUpstream('fake-anthropic.mjs', scheme),
                                                   startUpstream('fake-openai.mjs', scheme)]);
    up[scheme] = { anthropic, openai };
    // The requests network.c allows each type by default (issue 22), nothing more: the
    // real CLIs must get through with exactly these, their bodies checked for the run's
    // model. codex's upstream in OLP is ".../v1" and its default "POST /responses"; this
    // forwarder is given the server's root, so codex's calls arrive as /v1/responses.
    fwd[scheme] = {
      anthropic: await startForwarder(anthropic.url, `x-api-key:${REAL_ANTHROPIC}`,
        CLAUDE_ALLOW, { models: ['claude-fake', 'claude-fail401', 'claude-fail429', 'claude-cut'] }),
      openai: await startForwarder(openai.url, `authorization:Bearer ${REAL_OPENAI}`,
        ['POST /v1/responses'], { models: ['gpt-fake', 'gpt-fail401', 'gpt-fail429', 'gpt-cut'] }),
    };
  }
});

after(() => {
  for (const c of children) c.kill('SIGKILL');
  // The forwarder never logs a credential.
  for (const f of Object.values(fwd).flatMap((x) => Object.values(x)))
    assert.ok(!f.child.stderrText.includes(SECRET), 'the forwarder logged the real key');
  if (work) rmSync(work, { recursive: true, force: true });
});

for (const scheme of ['http', 'https']) {
  test(`claude through the forwarder (${scheme}): text, deltas streamed one by one, usage, real key only`, async () => {
    const before = (await requests(up[scheme].anthropic)).length;
    const r = await claude(scheme, 'claude-fake', { gate: true });
    assert.equal(r.code, 0, r.err);
    const ds = deltas(r.events);
    assert.deepEqual(ds.map((d) => d.text), ['Hello', ' from', ' the', ' fake', ' Anthropic', ' server!']);
    const u = usage(r.events);
    assert.ok(u, 'no usage');
    assert.deepEqual([u.prompt_tokens, u.completion_tokens, u.total_tokens], [10, 6, 16]);
    assert.equal(r.events.find((e) => e.ev === 'finish')?.reason, 'stop');

    const reqs = (await requests(up[scheme].anthropic)).slice(before);
    assert.equal(reqs.length, 1, JSON.stringify(reqs.map((q) => q.path)));
    assert.ok(reqs[0].path.startsWith('/v1/messages'));
    assertUpstreamCredentials(reqs, 'anthropic', up[scheme].anthropic);
    assert.equal(reqs[0].headers['x-egress-probe'], 'custom-header-passed',
                 'the CLI\'s custom headers did not get through, so the Authorization check proves nothing');
    assertNoSecret(r);

    // Streamed, not buffered: the upstream wrote each delta only once claude had printed
    // the one before (x-fake-delta-gate), so every delta crossed the forwarder on its own.
    // A buffering forwarder holds the first one back and the upstream's waits run out.
    // (Timing the gaps instead failed on a loaded machine: claude, starved of CPU for a
    // second, printed six deltas sent 200 ms apart at once.)
    const cliT = r.lines.filter((l) => /"content_block_delta"/.test(l.line) && /"text_delta"/.test(l.line))
      .map((l) => l.t);
    assert.equal(reqs[0].delta_t.length, 6);
    assert.equal(cliT.length, 6, 'claude printed another number of deltas');
    assert.equal(reqs[0].gate_timeouts, 0,
                 `the upstream waited in vain for claude to print a delta (${reqs[0].gate_timeouts} of 5 times): ` +
                 `the forwarder held it back; gaps as printed ${gaps(cliT)}`);
  });

  test(`codex through the forwarder (${scheme}): the agent message, usage, real key only`, async () => {
    const before = (await requests(up[scheme].openai)).length;
    const r = await codex(scheme, 'gpt-fake');
    assert.equal(r.code, 0, r.err);
    assert.equal(deltas(r.events).map((d) => d.text).join(''), CODEX_TEXT);
    const u = usage(r.events);
    assert.ok(u, 'no usage');
    assert.deepEqual([u.prompt_tokens, u.completion_tokens], [10, 6]);
    assert.equal(r.events.find((e) => e.ev === 'finish')?.reason, 'stop');
    const reqs = (await requests(up[scheme].openai)).slice(before);
    assert.ok(reqs.some((q) => q.path === '/v1/responses' && q.model === 'gpt-fake'),
              JSON.stringify(reqs.map((q) => q.path)));
    assertUpstreamCredentials(reqs, 'openai', up[scheme].openai);
    assertNoSecret(r);
  });

  // What each CLI makes of an upstream error that came through the forwarder: the
  // status must arrive as the upstream sent it, not as a forwarder 502.
  for (const status of [401, 429]) {
    test(`claude through the forwarder (${scheme}): upstream ${status} reaches the CLI as ${status}`, async () => {
      const r = await claude(scheme, `claude-fail${status}`);
      // claude exits 1 and its result line names the status and the error type.
      assert.equal(r.code, 1, r.out.slice(-500));
      const result = r.lines.map((l) => { try { return JSON.parse(l.line); } catch { return {}; } })
        .find((o) => o.type === 'result');
      assert.ok(result, 'no result line');
      assert.equal(result.is_error, true);
      assert.equal(result.api_error_status, status);
      assert.equal(result.api_error_type, status === 401 ? 'authentication_error' : 'rate_limit_error');
      assert.match(result.result, new RegExp(`${status}`));
      const e = errorEv(r.events);
      assert.ok(e, JSON.stringify(r.events));
      assert.equal(e.upstream_status, status);
      assertNoSecret(r);
    });

    test(`codex through the forwarder (${scheme}): upstream ${status} reaches the CLI as ${status}`, async () => {
      const r = await codex(scheme, `gpt-fail${status}`);
      // codex exits 1 with a turn.failed naming the status and its reason phrase.
      assert.equal(r.code, 1, r.out.slice(-500));
      const failed = r.lines.map((l) => { try { return JSON.parse(l.line); } catch { return {}; } })
        .find((o) => o.type === 'turn.failed');
      assert.ok(failed, 'no turn.failed line');
      assert.match(failed.error.message,
                   status === 401 ? /401 Unauthorized/ : /429 Too Many Requests/);
      const e = errorEv(r.events);
      assert.ok(e, JSON.stringify(r.events));
      assert.equal(e.upstream_status, status);
      assertNoSecret(r);
    });
  }
}

// A stream the upstream cuts midway must reach the CLI cut too (the forwarder ends its
// chunked answer without the last chunk), never as a complete but short answer.
test('a stream cut by the upstream reaches the CLIs as broken, not as a short answer (http)', async () => {
  const before = (await requests(up.http.anthropic)).filter((q) => q.model === 'claude-cut').length;
  const r = await claude('http', 'claude-cut');
  const text = deltas(r.events).map((d) => d.text).join('');
  const tries = (await requests(up.http.anthropic)).filter((q) => q.model === 'claude-cut').length - before;
  // claude notices the broken stream and asks again (at last without streaming, which
  // the fake answers whole); a success must carry the whole text.
  assert.ok(tries >= 2, `claude asked ${tries} time(s): it did not see the stream as broken`);
  if (r.code === 0) assert.ok(text.endsWith(' server!'), `a short answer passed as complete: ${text}`);
  else assert.ok(errorEv(r.events), JSON.stringify(r.events));
  assertNoSecret(r);

  const c = await codex('http', 'gpt-cut');
  assert.notEqual(c.code, 0, 'codex took a cut stream for a complete one');
  assert.ok(errorEv(c.events), JSON.stringify(c.events));
});

// codex prints no token deltas (its output is the whole agent message), so the streaming of
// the OpenAI stream through the forwarder is checked with codex's own request, replayed.
test('the OpenAI Responses stream is streamed through the forwarder, delta by delta (https)', async () => {
  const before = (await requests(up.https.openai)).length;
  const t = [];
  const res = await fetch(`${fwd.https.openai.url}/v1/responses`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${PLACEHOLDER_CODEX}`,
               'x-fake-delta-gate': '1' },
    body: JSON.stringify({ model: 'gpt-fake', stream: true, input: 'Say hello' }),
  });
  assert.equal(res.status, 200);
  let buf = '';
  for await (const chunk of res.body) {
    const now = Date.now();
    buf += Buffer.from(chunk).toString();
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      if (buf.slice(0, i).startsWith('event: response.output_text.delta')) {
        t.push(now);
        await seen(up.https.openai);
      }
      buf = buf.slice(i + 2);
    }
  }
  const q = (await requests(up.https.openai)).slice(before);
  assert.equal(q.length, 1);
  assertUpstreamCredentials(q, 'openai', up.https.openai);
  // Each delta written only once the one before had arrived here (x-fake-delta-gate):
  // a buffering forwarder makes the upstream's waits run out.
  assert.equal(t.length, q[0].delta_t.length);
  assert.ok(t.length > 1);
  assert.equal(q[0].gate_timeouts, 0, `the forwarder held deltas back; gaps here ${gaps(t)}`);
});

test('https: without the test CA the forwarder refuses the upstream (verification is never off)', async () => {
  const before = (await requests(up.https.anthropic)).length;
  const f = await startForwarder(up.https.anthropic.url, `x-api-key:${REAL_ANTHROPIC}`, CLAUDE_ALLOW,
                                 { withCa: false });
  const res = await fetch(`${f.url}/v1/messages`, {
    method: 'POST', headers: { 'content-type': 'application/json', 'x-api-key': PLACEHOLDER_CLAUDE },
    body: JSON.stringify({ model: 'claude-fake', max_tokens: 10, messages: [] }),
  });
  assert.equal(res.status, 502);
  const body = await res.json();
  assert.equal(body.error.type, 'api_error');
  assert.ok(!JSON.stringify(body).includes(SECRET));
  // The TLS handshake failed before any request: the upstream logged none.
  assert.equal((await requests(up.https.anthropic)).length, before);
  f.child.stdin.end();
});

test('a path outside the allow list is refused by the forwarder, never forwarded', async () => {
  const before = (await requests(up.http.anthropic)).length;
  const h = { 'x-api-key': PLACEHOLDER_CLAUDE };
  const port = fwd.http.anthropic.port;
  assert.equal(await rawRequest(port, 'GET', '/v1/files', h), 403);
  assert.equal(await rawRequest(port, 'GET', '/v1/messages2', h), 403);
  assert.equal(await rawRequest(port, 'POST', '/v1/messages/%2e%2e/files', h), 400);
  assert.equal(await rawRequest(port, 'POST', '/v1/messages/../files', h), 400);
  assert.equal(await rawRequest(port, 'POST', '/v1//messages', h), 400);
  // Exact paths with their methods (issue 22): no sibling API below a listed path, no
  // other method on it, never TRACE.
  assert.equal(await rawRequest(port, 'GET', '/v1/messages/batches', h), 403);
  assert.equal(await rawRequest(port, 'POST', '/v1/messages/batches', h), 403);
  assert.equal(await rawRequest(port, 'GET', '/v1/messages', h), 405);
  assert.equal(await rawRequest(port, 'DELETE', '/v1/messages', h), 405);
  assert.equal(await rawRequest(port, 'TRACE', '/v1/messages', h), 405);
  assert.equal((await requests(up.http.anthropic)).length, before);
});

test('a body for another model, or a background response, is refused by the forwarder', async () => {
  const before = (await requests(up.http.openai)).length;
  const post = async (body) => {
    const res = await fetch(`${fwd.http.openai.url}/v1/responses`, {
      method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${PLACEHOLDER_CODEX}` },
      body: JSON.stringify(body),
    });
    const j = await res.json();
    return [res.status, j.error?.type];
  };
  assert.deepEqual(await post({ model: 'gpt-5-pro', input: 'x' }), [403, 'permission_error']);
  assert.deepEqual(await post({ model: 'gpt-fake', input: 'x', background: true }), [403, 'permission_error']);
  assert.deepEqual(await post({ model: 'gpt-fake', input: 'x', store: true }), [403, 'permission_error']);
  assert.deepEqual(await post({ input: 'x' }), [403, 'permission_error']);
  assert.equal((await requests(up.http.openai)).length, before);
});

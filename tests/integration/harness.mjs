// The integration harness: a real lighttpd, started with the project's own
// lighttpd/olp.conf, in front of the olp-fcgi under test, on a free
// 127.0.0.1 port with a private OLP_HOME; plus real curl to talk to it.
//
// Environment (CTest sets it, see CMakeLists.txt):
//   OLP_BIN           the olp-fcgi binary under test (required)
//   OLP_SOURCE_DIR    the source tree (default: two levels up from here)
//   OLP_FIXTURES_DIR  the built tests/fixtures dir (test provider scripts)
//   OLP_FDCHECK       the built olp-fdcheck payload
//   OLP_IT_KEEP=1     keep each test's temp dir (printed) for inspection
//   OLP_IT_VERBOSE=1  print lighttpd's error log when a server stops

import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));

function findExe(name, extra = []) {
  const dirs = (process.env.PATH ?? '').split(':').filter(Boolean);
  for (const d of [...dirs, '/usr/local/sbin', '/usr/local/bin', '/usr/sbin', '/usr/bin', '/sbin', '/bin', ...extra]) {
    const p = path.join(d, name);
    try {
      fs.accessSync(p, fs.constants.X_OK);
      return p;
    } catch {
      /* next */
    }
  }
  return null;
}

function required(name) {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: run these tests through CTest (deploy/olp-local test)`);
  return v;
}

export const cfg = {
  get bin() {
    return fs.realpathSync(required('OLP_BIN'));
  },
  sourceDir: process.env.OLP_SOURCE_DIR ?? path.resolve(here, '..', '..'),
  get fixturesDir() {
    return required('OLP_FIXTURES_DIR');
  },
  get fdcheck() {
    return required('OLP_FDCHECK');
  },
  lighttpd: process.env.LIGHTTPD ?? findExe('lighttpd'),
  spawnFcgi: process.env.SPAWN_FCGI ?? findExe('spawn-fcgi'),
  curl: process.env.CURL ?? findExe('curl'),
  get conf() {
    return path.join(this.sourceDir, 'lighttpd', 'olp.conf');
  },
};

export const MODELS = ['echo', 'ticker', 'fail3', 'partial-fail', 'sleeper', 'forever', 'bigout', 'fdcheck'];

// The command providers every test server has (models-registry.json).
export function testRegistry() {
  const fx = cfg.fixturesDir;
  const cmd = (name, argv, extra = {}) => ({
    type: 'command',
    displayName: `Test ${name}`,
    argv,
    timeout_s: 20,
    network: false,
    models: [{ id: name, displayName: `Test ${name}`, created: 1700000000 }],
    ...extra,
  });
  return {
    providers: {
      echo: cmd('echo', ['/usr/bin/cat'], { aliases: { 'echo-alias': 'echo' } }),
      ticker: cmd('ticker', [path.join(fx, 'ticker.sh')]),
      fail3: cmd('fail3', [path.join(fx, 'fail3.sh')]),
      'partial-fail': cmd('partial-fail', [path.join(fx, 'partial-fail.sh')]),
      sleeper: cmd('sleeper', [path.join(fx, 'sleeper.sh')], { timeout_s: 1 }),
      forever: cmd('forever', [path.join(fx, 'forever.sh')], { timeout_s: 30 }),
      bigout: cmd('bigout', [path.join(fx, 'bigout.sh')]),
      fdcheck: cmd('fdcheck', [cfg.fdcheck]),
    },
  };
}

// Warm sandboxes (sandbox.warm, on by default) keep idle sandboxes under the workers
// between requests; these suites count every process and scratch dir a request leaves,
// so they run cold. tests/sandbox/escape-http.test.mjs and warm.test.mjs cover warm ones.
export function testConfig() {
  return {
    auth: { allow_anonymous: false },
    sandbox: { mode: 'bwrap', warm: false },
  };
}

// A fresh private directory tree: root/ (0700) with home/ (OLP_HOME, 0700)
// holding config.json and models-registry.json, and lighttpd/ (OLP_RUN_DIR).
export function makeHome({ registry = testRegistry(), config = testConfig() } = {}) {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'olp-it-'));
  fs.chmodSync(root, 0o700);
  const home = path.join(root, 'home');
  const runDir = path.join(root, 'lighttpd');
  fs.mkdirSync(home, { mode: 0o700 });
  fs.mkdirSync(runDir, { mode: 0o700 });
  if (config) fs.writeFileSync(path.join(home, 'config.json'), JSON.stringify(config, null, 2), { mode: 0o600 });
  if (registry)
    fs.writeFileSync(path.join(home, 'models-registry.json'), JSON.stringify(registry, null, 2), { mode: 0o600 });
  return { root, home, runDir, runtimeDir: path.join(home, 'run') };
}

export async function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

// Variables a worker may need from the test's own environment.
function passthroughEnv() {
  const env = {
    PATH: process.env.PATH ?? '/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin',
  };
  for (const k of ['HOME', 'LANG', 'TZ', 'ASAN_OPTIONS', 'UBSAN_OPTIONS', 'LSAN_OPTIONS']) {
    if (process.env[k] !== undefined) env[k] = process.env[k];
  }
  return env;
}

// ---------------------------------------------------------------------------
// /proc helpers

export function procStat(pid) {
  try {
    const s = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    const close = s.lastIndexOf(')');
    const comm = s.slice(s.indexOf('(') + 1, close);
    const f = s.slice(close + 2).split(' ');
    return { pid, comm, state: f[0], ppid: Number(f[1]) };
  } catch {
    return null;
  }
}

export function allProcs() {
  const out = [];
  for (const d of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    const st = procStat(Number(d));
    if (st) out.push(st);
  }
  return out;
}

export function descendants(pid) {
  const procs = allProcs();
  const byParent = new Map();
  for (const p of procs) {
    if (!byParent.has(p.ppid)) byParent.set(p.ppid, []);
    byParent.get(p.ppid).push(p);
  }
  const out = [];
  const todo = [pid];
  while (todo.length) {
    for (const c of byParent.get(todo.pop()) ?? []) {
      out.push(c);
      todo.push(c.pid);
    }
  }
  return out;
}

export function cmdline(pid) {
  try {
    return fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter(Boolean).join(' ');
  } catch {
    return '';
  }
}

function exeOf(pid) {
  try {
    return fs.readlinkSync(`/proc/${pid}/exe`);
  } catch {
    return null;
  }
}

export function fdList(pid) {
  const out = [];
  for (const fd of fs.readdirSync(`/proc/${pid}/fd`)) {
    let target = '?';
    try {
      target = fs.readlinkSync(`/proc/${pid}/fd/${fd}`);
    } catch {
      /* closed meanwhile */
    }
    out.push(`${fd} -> ${target}`);
  }
  return out;
}

export function isAlive(pid) {
  const st = procStat(pid);
  return st !== null && st.state !== 'Z' && st.state !== 'X';
}

// Processes anywhere on the machine that mention `needle` in their command
// line or environment (a worker has OLP_HOME=<root>/home, a bwrap has the
// scratch dir under it on its command line).
export function procsMentioning(needle) {
  const out = [];
  for (const p of allProcs()) {
    if (p.pid === process.pid || p.state === 'Z') continue;
    let env = '';
    try {
      env = fs.readFileSync(`/proc/${p.pid}/environ`, 'utf8');
    } catch {
      /* gone or not ours */
    }
    const cl = cmdline(p.pid);
    if (cl.includes(needle) || env.includes(needle)) out.push({ ...p, cmdline: cl });
  }
  return out;
}

export async function waitFor(pred, { timeoutMs = 5000, stepMs = 50 } = {}) {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await pred();
    if (v) return v;
    if (Date.now() > end) return v;
    await sleep(stepMs);
  }
}

// ---------------------------------------------------------------------------
// The server

function sanitizerReports(text) {
  return text
    .split('\n')
    .filter((l) => /AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer|runtime error:/.test(l));
}

export class Server {
  constructor(opts) {
    this.opts = opts;
    this.dirs = opts.dirs;
    this.root = opts.dirs.root;
    this.home = opts.dirs.home;
    this.runDir = opts.dirs.runDir;
    this.runtimeDir = opts.dirs.runtimeDir;
    this.token = opts.token;
    this.port = opts.port;
    this.baseURL = `http://127.0.0.1:${opts.port}`;
    this.child = opts.child;
    this.pid = opts.child.pid;
    this.output = opts.output;
    this.bin = opts.bin ?? cfg.bin;
    this.stopped = false;
  }

  url(p) {
    return this.baseURL + p;
  }

  // The workers' log (olp.log: their stderr, server.breakagelog), then
  // lighttpd's error log and whatever lighttpd printed itself.
  errorLog() {
    let text = '';
    for (const f of ['olp.log', 'error.log']) {
      try {
        text += fs.readFileSync(path.join(this.runDir, f), 'utf8');
      } catch {
        /* not created yet */
      }
    }
    return text + Buffer.concat(this.output).toString('utf8');
  }

  // The olp-fcgi processes lighttpd spawned.
  workerPids() {
    const bin = this.bin;
    return allProcs()
      .filter((p) => p.ppid === this.pid && exeOf(p.pid) === bin)
      .map((p) => p.pid)
      .sort((a, b) => a - b);
  }

  // Everything running below the workers (bwrap, provider commands), less the warm
  // sandboxes waiting for a next request (ADR 0008): a bwrap whose payload is
  // olp-sandbox-exec with no command of its own ("--" COMMAND), and that stub itself
  // while it waits. A warm sandbox in use shows its command (the stub has become it), so
  // a request's leftovers are still seen.
  workerChildren() {
    const out = [];
    const warm = (p) => /\/olp-sandbox-exec( --(run|drop|chown) \S+)*$/.test(p.cmdline);
    for (const w of this.workerPids())
      out.push(...descendants(w).map((p) => ({ ...p, cmdline: cmdline(p.pid) })).filter((p) => !warm(p)));
    return out;
  }

  zombies() {
    return descendants(this.pid).filter((p) => p.state === 'Z');
  }

  // The directories under the runtime dir (OLP_HOME/run), 3 levels deep:
  // per-request scratch dirs live there and must be gone after each request.
  // (Plain files, such as the concurrency slot files, are not listed.)
  runtimeEntries() {
    const out = [];
    const walk = (dir, rel, depth) => {
      let ents;
      try {
        ents = fs.readdirSync(dir, { withFileTypes: true });
      } catch (e) {
        if (e.code === 'ENOENT') return;
        throw e;
      }
      for (const e of ents) {
        if (!e.isDirectory()) continue;
        const r = rel ? `${rel}/${e.name}` : e.name;
        out.push(r);
        if (depth < 3) walk(path.join(dir, e.name), r, depth + 1);
      }
    };
    walk(this.runtimeDir, '', 1);
    return out.sort();
  }

  // Wait until no request is being served: no child of any worker.
  async waitIdle(timeoutMs = 5000) {
    const ok = await waitFor(() => this.workerChildren().length === 0, { timeoutMs });
    return ok ? [] : this.workerChildren();
  }

  // Stop lighttpd (it stops its workers), then make sure nothing of this
  // server is left running.  Throws if something is.
  // keepDirs: leave the temp dirs (OLP_HOME…) for a next server (startServer({dirs})).
  async stop({ keepDirs = false } = {}) {
    if (this.stopped) return;
    this.stopped = true;
    const workers = this.workerPids();
    const exited = new Promise((resolve) => {
      if (this.child.exitCode !== null || this.child.signalCode !== null) resolve();
      else this.child.once('exit', resolve);
    });
    this.child.kill('SIGTERM');
    const done = await Promise.race([exited.then(() => true), sleep(10000).then(() => false)]);
    if (!done) this.child.kill('SIGKILL');
    const problems = [];
    if (!done) problems.push('lighttpd did not exit within 10 s of SIGTERM');
    const gone = await waitFor(() => workers.every((w) => !isAlive(w)), { timeoutMs: 5000 });
    if (!gone) {
      const left = workers.filter(isAlive);
      problems.push(`olp-fcgi workers still running after lighttpd stopped: ${left.join(', ')}`);
      for (const w of left) {
        try {
          process.kill(w, 'SIGKILL');
        } catch {
          /* gone */
        }
      }
    }
    // A sandbox's bwrap names its run ("--run <worker pid>-…") rather than this root.
    const strays = () => [...procsMentioning(this.root), ...workers.flatMap((w) => procsMentioning(`--run ${w}-`))];
    const stray = await waitFor(() => strays().length === 0, { timeoutMs: 5000 });
    if (!stray) {
      const left = strays();
      problems.push(`processes of this test server still running: ${left.map((p) => `${p.pid} ${p.cmdline}`).join('; ')}`);
      for (const p of left) {
        try {
          process.kill(p.pid, 'SIGKILL');
        } catch {
          /* gone */
        }
      }
    }
    const log = this.errorLog();
    const san = sanitizerReports(log);
    if (san.length) problems.push(`sanitizer reports in lighttpd's error log:\n${san.slice(0, 20).join('\n')}`);
    if (process.env.OLP_IT_VERBOSE || problems.length) {
      process.stderr.write(`--- ${this.runDir}: olp.log, error.log, lighttpd's output (last 60 lines) ---\n`);
      process.stderr.write(log.split('\n').slice(-60).join('\n') + '\n');
    }
    if (process.env.OLP_IT_KEEP) process.stderr.write(`kept ${this.root}\n`);
    else if (!keepDirs) fs.rmSync(this.root, { recursive: true, force: true });
    if (problems.length) throw new Error(problems.join('\n'));
  }
}

// Start lighttpd -D with lighttpd/olp.conf.  Resolves once GET /health
// answers 200 and every worker is up.
// What a server run as another user (`user`) runs: root-owned copies it can read, in a
// directory of their own (the build tree may be where that user cannot look).
export function stageFor(user) {
  const stage = fs.mkdtempSync(path.join(os.tmpdir(), 'olp-stage-'));
  fs.chmodSync(stage, 0o755);
  const stub = process.env.OLP_SANDBOX_EXEC ?? path.join(path.dirname(cfg.bin), '..', 'sandbox', 'olp-sandbox-exec');
  const copy = (from, name, mode) => {
    const to = path.join(stage, name);
    fs.copyFileSync(from, to);
    fs.chmodSync(to, mode);
    return to;
  };
  return {
    dir: stage,
    user,
    bin: copy(cfg.bin, 'olp-fcgi', 0o755),
    stub: copy(stub, 'olp-sandbox-exec', 0o755),
    conf: copy(cfg.conf, 'olp.conf', 0o644),
    copy,
  };
}

export async function startServer({
  maxProcs = 2,
  threads = 4,
  registry,
  config,
  env = {},
  ownerToken = 'olp_test_' + randomBytes(24).toString('base64url'),
  stage = null, // stageFor(user): run lighttpd and the workers as that user
  dirs: reuse = null, // the dirs of a server stopped with keepDirs: same OLP_HOME, run dir
} = {}) {
  if (!cfg.lighttpd) throw new Error('lighttpd not found (apt-get install lighttpd)');
  let lastErr;
  for (let attempt = 0; attempt < 3; attempt++) {
    const dirs = reuse ?? makeHome({ registry, config });
    const port = await freePort();
    const childEnv = {
      ...passthroughEnv(),
      OLP_PORT: String(port),
      OLP_BIN: stage ? stage.bin : cfg.bin,
      ...(stage ? { OLP_SANDBOX_EXEC: stage.stub } : {}),
      OLP_HOME: dirs.home,
      OLP_RUN_DIR: dirs.runDir,
      OLP_MAX_PROCS: String(maxProcs),
      OLP_THREADS: String(threads),
      OLP_LOG_LEVEL: 'debug',
      ...(ownerToken ? { OLP_OWNER_TOKEN: ownerToken } : {}),
      ...env,
    };
    const output = [];
    let argv = [cfg.lighttpd, '-D', '-f', stage ? stage.conf : cfg.conf];
    if (stage) {
      // OLP_HOME (env may name one of the test's own) and the run dir become the user's.
      spawnSync('chown', ['-R', `${stage.user}:${stage.user}`, dirs.root, childEnv.OLP_HOME]);
      argv = ['setpriv', `--reuid=${stage.user}`, `--regid=${stage.user}`, '--init-groups', '--', ...argv];
    }
    const child = spawn(argv[0], argv.slice(1), {
      env: childEnv,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    child.stdout.on('data', (d) => output.push(d));
    child.stderr.on('data', (d) => output.push(d));
    const server = new Server({ dirs, token: ownerToken, port, child, output, bin: stage?.bin });
    const ready = await waitFor(
      async () => {
        if (child.exitCode !== null || child.signalCode !== null) return 'exited';
        try {
          const r = await fetch(server.url('/health'), { signal: AbortSignal.timeout(2000) });
          await r.arrayBuffer();
          if (r.status === 200 && server.workerPids().length >= maxProcs) return 'up';
        } catch {
          /* not yet */
        }
        return null;
      },
      { timeoutMs: 15000, stepMs: 100 },
    );
    if (ready === 'up') return server;
    const why =
      `lighttpd did not come up (${ready ?? 'timeout'}) on port ${port}\n` +
      `output: ${Buffer.concat(output).toString()}\nerror.log:\n${server.errorLog()}`;
    lastErr = new Error(why);
    try {
      await server.stop();
    } catch (e) {
      lastErr = new Error(`${why}\nand stopping it: ${e.message}`);
    }
    if (ready !== 'exited') break; // port races make lighttpd exit; anything else: give up
  }
  throw lastErr;
}

// ---------------------------------------------------------------------------
// curl

// Parse curl -i output: skips 1xx blocks; returns status, headers (lower-case
// names; repeated headers joined with ", "), raw header text, body.
export function parseHttp(buf) {
  let rest = buf;
  for (;;) {
    const end = rest.indexOf('\r\n\r\n');
    if (end < 0) throw new Error(`no header block in curl output: ${rest.toString().slice(0, 200)}`);
    const head = rest.subarray(0, end).toString('latin1');
    rest = rest.subarray(end + 4);
    const lines = head.split('\r\n');
    const m = /^HTTP\/[\d.]+ (\d{3})/.exec(lines[0]);
    if (!m) throw new Error(`bad status line: ${lines[0]}`);
    const status = Number(m[1]);
    if (status >= 100 && status < 200) continue;
    const headers = {};
    for (const l of lines.slice(1)) {
      const i = l.indexOf(':');
      if (i < 0) continue;
      const k = l.slice(0, i).trim().toLowerCase();
      const v = l.slice(i + 1).trim();
      headers[k] = k in headers ? `${headers[k]}, ${v}` : v;
    }
    return { status, headers, head, body: rest };
  }
}

function curlArgs(server, { method = 'GET', path: p, headers = {}, auth = true, body, stream = false }) {
  const args = ['-sS', '--http1.1', '-i', '--max-time', '60', '-X', method, '-H', 'Expect:'];
  if (stream) args.push('-N');
  if (auth === true) args.push('-H', `Authorization: Bearer ${server.token}`);
  else if (typeof auth === 'string') args.push('-H', `Authorization: ${auth}`);
  for (const [k, v] of Object.entries(headers)) args.push('-H', v === null ? `${k}:` : `${k}: ${v}`);
  if (body !== undefined) args.push('--data-binary', '@-');
  args.push(server.url(p));
  return args;
}

// One request with real curl.  body: string | Buffer | object (sent as JSON
// with Content-Type: application/json unless headers say otherwise).
export async function curl(server, req) {
  const r = { ...req };
  // lighttpd answers 411 to a POST/PUT without Content-Length: send an
  // empty body instead of none.
  if (r.body === undefined && !['GET', 'HEAD', undefined].includes(r.method)) r.body = '';
  if (r.body !== undefined && typeof r.body === 'object' && !Buffer.isBuffer(r.body)) {
    r.body = JSON.stringify(r.body);
    r.headers = { 'Content-Type': 'application/json', ...(r.headers ?? {}) };
  }
  const args = curlArgs(server, r);
  const child = spawn(cfg.curl, args, { stdio: ['pipe', 'pipe', 'pipe'] });
  const out = [];
  const err = [];
  child.stdout.on('data', (d) => out.push(d));
  child.stderr.on('data', (d) => err.push(d));
  child.stdin.on('error', () => {}); // the server may answer before reading it all
  if (r.body !== undefined) child.stdin.end(r.body);
  else child.stdin.end();
  const code = await new Promise((resolve) => child.on('close', resolve));
  if (code !== 0) throw new Error(`curl ${args.join(' ')} exited ${code}: ${Buffer.concat(err).toString()}`);
  const res = parseHttp(Buffer.concat(out));
  res.text = res.body.toString('utf8');
  try {
    res.json = JSON.parse(res.text);
  } catch {
    res.json = undefined;
  }
  return res;
}

// A streaming request with real curl -N; records when each byte arrived.
// Returns the parsed response plus `events`: [{data, t}] where t is the
// arrival time (ms, performance.now()) of the read that completed the event.
export async function curlStream(server, req) {
  const r = { ...req, stream: true };
  if (r.body !== undefined && typeof r.body === 'object' && !Buffer.isBuffer(r.body)) {
    r.body = JSON.stringify(r.body);
    r.headers = { 'Content-Type': 'application/json', ...(r.headers ?? {}) };
  }
  const args = curlArgs(server, r);
  const t0 = performance.now();
  const child = spawn(cfg.curl, args, { stdio: ['pipe', 'pipe', 'pipe'] });
  const reads = []; // {end, t}
  const out = [];
  let total = 0;
  const err = [];
  child.stdout.on('data', (d) => {
    out.push(d);
    total += d.length;
    reads.push({ end: total, t: performance.now() - t0 });
  });
  child.stderr.on('data', (d) => err.push(d));
  child.stdin.on('error', () => {});
  child.stdin.end(r.body ?? '');
  const code = await new Promise((resolve) => child.on('close', resolve));
  if (code !== 0) throw new Error(`curl exited ${code}: ${Buffer.concat(err).toString()}`);
  const all = Buffer.concat(out);
  const res = parseHttp(all);
  res.text = res.body.toString('utf8');
  const bodyStart = all.length - res.body.length;
  res.events = parseSse(res.body).map((e) => {
    const endAbs = bodyStart + e.end;
    const rd = reads.find((x) => x.end >= endAbs);
    return { data: e.data, t: rd ? rd.t : NaN };
  });
  return res;
}

// Server-sent events: [{data, end}] with `end` the offset just past the
// event's blank line.
export function parseSse(body) {
  const text = body.toString('utf8');
  const out = [];
  let pos = 0;
  for (;;) {
    let i = text.indexOf('\n\n', pos);
    let sep = 2;
    const j = text.indexOf('\r\n\r\n', pos);
    if (j >= 0 && (i < 0 || j < i)) {
      i = j;
      sep = 4;
    }
    if (i < 0) break;
    const block = text.slice(pos, i);
    const data = block
      .split(/\r?\n/)
      .filter((l) => l.startsWith('data:'))
      .map((l) => l.slice(5).replace(/^ /, ''))
      .join('\n');
    if (block.split(/\r?\n/).some((l) => l.startsWith('data:')))
      out.push({ data, end: Buffer.byteLength(text.slice(0, i + sep)) });
    pos = i + sep;
  }
  return out;
}

export function chatBody(model, content = 'hello', extra = {}) {
  return { model, messages: [{ role: 'user', content }], ...extra };
}

// Run a command synchronously; used for the CGI start mode.
export function runSync(cmd, args, opts) {
  return spawnSync(cmd, args, { timeout: 30000, maxBuffer: 64 << 20, ...opts });
}

// The integration harness: a real lighttpd, started with the project's own
// lighttpd/olp.conf, in front of the olp-fcgi under test, on a free
// 127.0.0.1 port with a private OLP_HOME; plus real curl to talk to it.
// startServer({kind}) starts one of the other shipped deployments instead, each
// with its own shipped configuration (SERVER_KINDS below): lighttpd running
// olp-fcgi as CGI, Apache with mod_fcgid or mod_cgid, nginx with spawn-fcgi.
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
import { after as afterAll } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { listeningSockets } from './fcgi-client.mjs';

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
  apache: process.env.APACHE ?? findExe('apache2') ?? findExe('httpd'),
  apacheModules: process.env.APACHE_MODULES ?? '/usr/lib/apache2/modules',
  nginx: process.env.NGINX ?? findExe('nginx'),
  curl: process.env.CURL ?? findExe('curl'),
  get conf() {
    return path.join(this.sourceDir, 'lighttpd', 'olp.conf');
  },
};

// The deployments startServer can start, each with the project's own configuration
// file for it: what it is, what it needs, and the file(s) it is started with.
export const SERVER_KINDS = {
  lighttpd: { what: 'lighttpd + mod_fastcgi (bin-path)', needs: ['lighttpd'], conf: ['lighttpd/olp.conf'] },
  'lighttpd-cgi': { what: 'lighttpd + mod_cgi', needs: ['lighttpd'], conf: ['lighttpd/olp-cgi.conf'] },
  apache: { what: 'Apache 2.4 + mod_fcgid', needs: ['apache'], conf: ['deploy/apache/olp.conf'], modules: ['fcgid'] },
  'apache-cgi': { what: 'Apache 2.4 + mod_cgid', needs: ['apache'], conf: ['deploy/apache/olp-cgi.conf'], modules: ['cgid'] },
  nginx: { what: 'nginx + spawn-fcgi', needs: ['nginx', 'spawnFcgi'], conf: ['deploy/nginx/olp.conf'] },
};

// Why this host cannot start `kind`, or null when it can.
export function kindMissing(kind) {
  const k = SERVER_KINDS[kind];
  if (!k) return `unknown server kind ${kind}`;
  for (const n of k.needs) if (!cfg[n]) return `${n} is not installed (deploy/olp-local test installs it)`;
  for (const m of k.modules ?? [])
    if (!fs.existsSync(path.join(cfg.apacheModules, `mod_${m}.so`)))
      return `Apache's mod_${m} is not installed (deploy/olp-local test installs it)`;
  if (kind === 'nginx' && !fs.existsSync(process.env.NGINX_FASTCGI_PARAMS ?? '/etc/nginx/fastcgi_params'))
    return 'no /etc/nginx/fastcgi_params (NGINX_FASTCGI_PARAMS names another)';
  return null;
}

export const MODELS = ['echo', 'ticker', 'fail3', 'partial-fail', 'sleeper', 'forever', 'bigout', 'fdcheck'];

// A command provider entry of the registry with one model of the same name.
export const commandProvider = (name, argv, extra = {}) => ({
  type: 'command',
  displayName: `Test ${name}`,
  argv,
  timeout_s: 20,
  network: false,
  models: [{ id: name, displayName: `Test ${name}`, created: 1700000000 }],
  ...extra,
});

// olp-keys ARGS... --json --olp-home=HOME (the binary CTest names in OLP_KEYS): the parsed
// JSON; throws naming the command and its stderr when it fails.
export function olpKeys(home, ...args) {
  const bin = process.env.OLP_KEYS;
  if (!bin) throw new Error('OLP_KEYS is not set: run these tests through CTest (deploy/olp-local test)');
  const r = spawnSync(bin, [...args, '--json', `--olp-home=${home}`], { encoding: 'utf8', timeout: 30000 });
  if (r.status !== 0) throw new Error(`olp-keys ${args.join(' ')} exited ${r.status}: ${r.stderr}`);
  return JSON.parse(r.stdout);
}

// The command providers every test server has (models-registry.json).
export function testRegistry() {
  const fx = cfg.fixturesDir;
  const cmd = commandProvider;
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
    this.kind = opts.kind ?? 'lighttpd';
    // Every process the harness started for this server (the web server first;
    // spawn-fcgi's worker beside nginx), and the URL path OLP is mounted under.
    this.children = opts.children ?? [opts.child];
    this.mount = opts.mount ?? '';
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
    return this.baseURL + this.mount + p;
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

  // The olp-fcgi processes running for this server: those lighttpd spawned (its
  // children), mod_fcgid's (below its process manager), spawn-fcgi's (started by
  // the harness itself), a CGI request's while it lasts.
  workerPids() {
    const bin = this.bin;
    const roots = this.children.map((c) => c.pid);
    const mine =
      this.kind === 'lighttpd'
        ? allProcs().filter((p) => p.ppid === this.pid)
        : [...roots.map(procStat).filter(Boolean), ...roots.flatMap((r) => descendants(r))];
    return [...new Set(mine.filter((p) => exeOf(p.pid) === bin).map((p) => p.pid))].sort((a, b) => a - b);
  }

  // Each worker's own listening socket, [{sock, pid}] by pid: lighttpd (bin-path) gives
  // every worker process a socket of its own (<run dir>/olp-fcgi.sock-<n>), which
  // fcgiRequest (fcgi-client.mjs) reaches without lighttpd's balancing in between.
  workerSockets() {
    return [...listeningSockets(this.workerPids())]
      .map(([sock, pid]) => ({ sock, pid }))
      .sort((a, b) => a.pid - b.pid);
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
    const exited = Promise.all(
      this.children.map(
        (c) =>
          new Promise((resolve) => {
            if (c.exitCode !== null || c.signalCode !== null) resolve();
            else c.once('exit', resolve);
          }),
      ),
    );
    for (const c of this.children) c.kill('SIGTERM');
    // An unref'd timer: a pending 10 s timeout must not keep the test process alive
    // after the server stopped in time.
    const done = await Promise.race([exited.then(() => true), sleep(10000, false, { ref: false })]);
    if (!done) for (const c of this.children) c.kill('SIGKILL');
    const problems = [];
    if (!done) problems.push(`${this.kind} did not exit within 10 s of SIGTERM`);
    const gone = await waitFor(() => workers.every((w) => !isAlive(w)), { timeoutMs: 5000 });
    if (!gone) {
      const left = workers.filter(isAlive);
      problems.push(`olp-fcgi workers still running after ${this.kind} stopped: ${left.join(', ')}`);
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
    if (san.length) problems.push(`sanitizer reports in ${this.kind}'s error log:\n${san.slice(0, 20).join('\n')}`);
    if (process.env.OLP_IT_VERBOSE || problems.length) {
      process.stderr.write(`--- ${this.runDir}: olp.log, error.log, ${this.kind}'s output (last 60 lines) ---\n`);
      process.stderr.write(log.split('\n').slice(-60).join('\n') + '\n');
    }
    if (process.env.OLP_IT_KEEP) process.stderr.write(`kept ${this.root}\n`);
    else if (!keepDirs) fs.rmSync(this.root, { recursive: true, force: true });
    if (problems.length) throw new Error(problems.join('\n'));
  }
}

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

// Writes the text of a shipped configuration file with its site-specific values
// replaced (each must occur exactly once: a test of a file that changed under it
// fails instead of testing something else).
function patched(file, replacements) {
  let text = fs.readFileSync(file, 'utf8');
  for (const [from, to] of replacements) {
    const n = text.split(from).length - 1;
    if (n !== 1) throw new Error(`${file}: "${from}" occurs ${n} times, not once`);
    text = text.replace(from, to);
  }
  return text;
}

// How each kind is started: its processes (the web server first), the URL path OLP
// is under, and how many workers must be up before it counts as started. ctx: dirs,
// port, bin, stage (or null), user (the account the workers run as when we are root,
// else null), workerEnv (what every worker gets), serverEnv, maxProcs, threads, mount,
// conf(file) (the shipped file, or its copy in the stage).
const launchers = {
  lighttpd(ctx) {
    return lighttpdLaunch(ctx, ctx.conf('lighttpd/olp.conf'), ctx.maxProcs);
  },
  'lighttpd-cgi'(ctx) {
    return lighttpdLaunch(ctx, ctx.conf('lighttpd/olp-cgi.conf'), 0);
  },
  apache(ctx) {
    return apacheLaunch(ctx, 'fcgid', ctx.conf('deploy/apache/olp.conf'));
  },
  'apache-cgi'(ctx) {
    return apacheLaunch(ctx, 'cgid', ctx.conf('deploy/apache/olp-cgi.conf'));
  },
  nginx(ctx) {
    const { dirs, port, user } = ctx;
    const sock = path.join(dirs.runDir, 'olp-fcgi.sock');
    // spawn-fcgi -n binds the socket, puts it on fd 0 and execs olp-fcgi in its own
    // process (as deploy/systemd/olp-spawn-fcgi.service runs it); as root it hands the
    // socket and the worker to `user` first.
    const errLog = fs.openSync(path.join(dirs.runDir, 'olp.log'), 'a');
    const asUser = user ? ['-u', user, '-g', user, '-U', user, '-G', user] : [];
    const fcgi = spawn(cfg.spawnFcgi, ['-n', '-s', sock, '-M', '0600', ...asUser, '--', ctx.bin], {
      env: { ...ctx.serverEnv, ...ctx.workerEnv },
      stdio: ['ignore', 'ignore', errLog],
    });
    fs.closeSync(errLog);
    const conf = path.join(dirs.runDir, 'olp-nginx-site.conf');
    fs.writeFileSync(
      conf,
      patched(ctx.conf('deploy/nginx/olp.conf'), [
        ['listen 127.0.0.1:8080;', `listen 127.0.0.1:${port};`],
        ['unix:/run/olp/olp-fcgi.sock', `unix:${sock}`],
      ]),
    );
    // nginx resolves `include fastcgi_params` against the main file's directory.
    fs.copyFileSync(process.env.NGINX_FASTCGI_PARAMS ?? '/etc/nginx/fastcgi_params', path.join(dirs.runDir, 'fastcgi_params'));
    const main = path.join(dirs.runDir, 'nginx.conf');
    const r = dirs.runDir;
    fs.writeFileSync(
      main,
      [
        ...(user ? [`user ${user} ${user};`] : []),
        'worker_processes 1;',
        `pid ${r}/nginx.pid;`,
        `error_log ${r}/error.log info;`,
        // What docs/deploy.md "Slow clients" asks of nginx's main file (slowloris.test.mjs).
        'worker_rlimit_nofile 16384;',
        'events { worker_connections 8192; }',
        'http {',
        `  access_log ${r}/access.log;`,
        ...['client_body', 'fastcgi', 'proxy', 'uwsgi', 'scgi'].map((t) => `  ${t}_temp_path ${r}/${t}_temp;`),
        `  include ${conf};`,
        '}',
        '',
      ].join('\n'),
    );
    const web = spawn(cfg.nginx, ['-p', `${r}/`, '-c', main, '-e', `${r}/error.log`, '-g', 'daemon off;'], {
      env: ctx.serverEnv,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    return { children: [web, fcgi], minWorkers: 1 };
  },
};

function lighttpdLaunch(ctx, conf, minWorkers) {
  let argv = [cfg.lighttpd, '-D', '-f', conf];
  if (ctx.user) argv = ['setpriv', `--reuid=${ctx.user}`, `--regid=${ctx.user}`, '--init-groups', '--', ...argv];
  const child = spawn(argv[0], argv.slice(1), {
    env: {
      ...ctx.serverEnv,
      ...ctx.workerEnv,
      OLP_PORT: String(ctx.port),
      OLP_BIN: ctx.bin,
      OLP_RUN_DIR: ctx.dirs.runDir,
      OLP_MAX_PROCS: String(ctx.maxProcs),
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  return { children: [child], minWorkers };
}

// Apache in the foreground with a top-level file of the test's own (what Debian's
// apache2.conf does: Listen, the modules, logs) that includes the shipped one with
// its Define's set. As root it runs its children, and so the workers, as `user`.
function apacheLaunch(ctx, module, conf) {
  const { dirs, port, user } = ctx;
  const r = dirs.runDir;
  // A module built into this apache2 (Debian's log_config) cannot be loaded again.
  const mod = (m) =>
    `<IfModule !${m}_module>\n  LoadModule ${m}_module ${path.join(cfg.apacheModules, `mod_${m}.so`)}\n</IfModule>`;
  const q = (v) => `"${String(v).replace(/(["\\])/g, '\\$1')}"`;
  const fcgid = path.join(r, 'fcgid');
  fs.mkdirSync(path.join(fcgid, 'sock'), { recursive: true });
  if (user) spawnSync('chown', ['-R', `${user}:${user}`, fcgid]);
  const workerEnv = Object.entries(ctx.workerEnv).filter(([k]) => !['OLP_HOME', 'OLP_THREADS'].includes(k));
  const main = path.join(r, 'httpd.conf');
  fs.writeFileSync(
    main,
    [
      `ServerRoot ${q(r)}`,
      `Listen 127.0.0.1:${port}`,
      `PidFile ${q(path.join(r, 'httpd.pid'))}`,
      `ErrorLog ${q(path.join(r, 'error.log'))}`,
      'LogLevel info',
      `DefaultRuntimeDir ${q(r)}`,
      `Mutex file:${r} default`,
      'ServerName 127.0.0.1',
      ...(user ? [`User ${user}`, `Group ${user}`] : []),
      mod('mpm_event'),
      mod('authz_core'),
      mod('alias'),
      mod('env'),
      mod('log_config'),
      mod(module),
      `CustomLog ${q(path.join(r, 'access.log'))} common`,
      ...(module === 'cgid' ? [`ScriptSock ${q(path.join(r, 'cgid.sock'))}`] : []),
      `Define OLP_BIN ${q(ctx.bin)}`,
      `Define OLP_HOME ${q(dirs.home)}`,
      `Define OLP_MAX_PROCS ${ctx.maxProcs}`,
      `Define OLP_FCGID_DIR ${q(fcgid)}`,
      ctx.mount ? `Define OLP_MOUNT ${q(ctx.mount)}` : 'Define OLP_AT_ROOT',
      `Include ${q(conf)}`,
      // What the test's workers get besides the shipped file's OLP_HOME (and OLP_THREADS).
      ...workerEnv.map(([k, v]) => (module === 'fcgid' ? `FcgidInitialEnv ${k} ${q(v)}` : `SetEnv ${k} ${q(v)}`)),
      '',
    ].join('\n'),
  );
  const child = spawn(cfg.apache, ['-DFOREGROUND', '-f', main], {
    env: ctx.serverEnv,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  return { children: [child], minWorkers: module === 'fcgid' ? 1 : 0 };
}

// Start a server of `kind` (SERVER_KINDS; lighttpd -D with lighttpd/olp.conf by
// default). Resolves once GET /health answers 200 and its workers are up.
export async function startServer({
  kind = 'lighttpd',
  maxProcs = 2,
  threads = 4,
  registry,
  config,
  env = {},
  ownerToken = 'olp_test_' + randomBytes(24).toString('base64url'),
  stage = null, // stageFor(user): run the server and the workers as that user
  dirs: reuse = null, // the dirs of a server stopped with keepDirs: same OLP_HOME, run dir
  mount = kind.startsWith('apache') ? '/olp' : '', // Apache: '' mounts OLP at / (OLP_AT_ROOT)
} = {}) {
  const missing = kindMissing(kind);
  if (missing) throw new Error(`${kind}: ${missing}`);
  // Apache refuses to run its children as root, and a deployment never does: as root,
  // the other kinds run their workers as a user, from root-owned copies it can read.
  if (kind !== 'lighttpd' && process.getuid() === 0 && !stage)
    throw new Error(`${kind} as root needs a stage: startServer({stage: stageFor('www-data')})`);
  let lastErr;
  for (let attempt = 0; attempt < 3; attempt++) {
    const dirs = reuse ?? makeHome({ registry, config });
    const port = await freePort();
    const workerEnv = {
      OLP_HOME: dirs.home,
      OLP_THREADS: String(threads),
      OLP_LOG_LEVEL: 'debug',
      ...(stage ? { OLP_SANDBOX_EXEC: stage.stub } : {}),
      ...(ownerToken ? { OLP_OWNER_TOKEN: ownerToken } : {}),
      ...Object.fromEntries(
        ['ASAN_OPTIONS', 'UBSAN_OPTIONS', 'LSAN_OPTIONS'].filter((k) => process.env[k]).map((k) => [k, process.env[k]]),
      ),
      ...env,
    };
    if (stage) {
      // OLP_HOME (env may name one of the test's own) and the run dir become the user's.
      spawnSync('chown', ['-R', `${stage.user}:${stage.user}`, dirs.root, workerEnv.OLP_HOME]);
    }
    const conf = (rel) => {
      const src = path.join(cfg.sourceDir, rel);
      if (!stage) return src;
      return rel === 'lighttpd/olp.conf' ? stage.conf : stage.copy(src, rel.replace(/\//g, '-'), 0o644);
    };
    const launched = launchers[kind]({
      dirs,
      port,
      stage,
      user: stage?.user ?? null,
      bin: stage ? stage.bin : cfg.bin,
      workerEnv,
      serverEnv: passthroughEnv(),
      maxProcs,
      threads,
      mount,
      conf,
    });
    const output = [];
    for (const c of launched.children) {
      c.stdout?.on('data', (d) => output.push(d));
      c.stderr?.on('data', (d) => output.push(d));
    }
    const child = launched.children[0];
    const server = new Server({
      kind,
      dirs,
      token: ownerToken,
      port,
      child,
      children: launched.children,
      output,
      mount,
      bin: stage?.bin,
    });
    server.stage = stage;
    const exited = () => launched.children.some((c) => c.exitCode !== null || c.signalCode !== null);
    const ready = await waitFor(
      async () => {
        if (exited()) return 'exited';
        try {
          const r = await fetch(server.url('/health'), { signal: AbortSignal.timeout(2000) });
          await r.arrayBuffer();
          if (r.status === 200 && server.workerPids().length >= launched.minWorkers) return 'up';
        } catch {
          /* not yet */
        }
        return null;
      },
      { timeoutMs: 15000, stepMs: 100 },
    );
    if (ready === 'up') return server;
    const why =
      `${kind} did not come up (${ready ?? 'timeout'}) on port ${port}\n` +
      `output: ${Buffer.concat(output).toString()}\nerror.log:\n${server.errorLog()}`;
    lastErr = new Error(why);
    try {
      await server.stop();
    } catch (e) {
      lastErr = new Error(`${why}\nand stopping it: ${e.message}`);
    }
    if (ready !== 'exited') break; // port races make the server exit; anything else: give up
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

// ---- deploy/olp-local serve, as a user runs it (serve*.test.mjs) ----------------------

// A fresh directory for serve's homes, 0711 (started by root, serve runs the workers as
// olp, which must reach OLP_HOME); at the end every process still naming it is killed
// and it is removed (kept with OLP_IT_KEEP). Call at a test file's top level.
export function serveRoot(prefix) {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  fs.chmodSync(root, 0o711);
  afterAll(() => {
    for (const p of procsMentioning(root)) {
      try {
        process.kill(p.pid, 'SIGKILL');
      } catch {
        /* gone */
      }
    }
    if (!process.env.OLP_IT_KEEP) fs.rmSync(root, { recursive: true, force: true });
  });
  return root;
}

// Start `deploy/olp-local serve ARGS...` with OLP_HOME=home in its own process group
// (like a terminal job) and the olp-fcgi under test as OLP_BIN; wait until readyPath
// answers 200 (at most upMs). Returns { port, url(p), out(), stop() }: stop sends SIGINT
// to the group, as Ctrl-C does, and asserts serve exited within stopMs and nothing
// naming home is left after goneMs. A serve that does not come up fails the test with
// what it printed.
export async function startServe(home, args = [], { env = {}, readyPath = '/health', upMs = 60000, stopMs = 15000, goneMs = 10000 } = {}) {
  const port = await freePort();
  const child = spawn(path.join(cfg.sourceDir, 'deploy', 'olp-local'), ['serve', ...args], {
    env: {
      PATH: process.env.PATH ?? '/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin',
      HOME: process.env.HOME ?? path.dirname(home),
      OLP_HOME: home,
      OLP_PORT: String(port),
      OLP_BIN: cfg.bin,
      OLP_MAX_PROCS: '1',
      OLP_THREADS: '2',
      OLP_NO_INSTALL: '1',
      ...env,
    },
    detached: true,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const chunks = [];
  child.stdout.on('data', (d) => chunks.push(d));
  child.stderr.on('data', (d) => chunks.push(d));
  const exited = new Promise((resolve) => child.once('exit', resolve));
  const out = () => Buffer.concat(chunks).toString('utf8');
  const url = (p) => `http://127.0.0.1:${port}${p}`;
  const up = await waitFor(
    async () => {
      if (child.exitCode !== null) return false;
      try {
        const r = await fetch(url(readyPath), { signal: AbortSignal.timeout(2000) });
        await r.arrayBuffer();
        return r.status === 200;
      } catch {
        return false;
      }
    },
    { timeoutMs: upMs, stepMs: 200 },
  );
  const stop = async () => {
    try {
      process.kill(-child.pid, 'SIGINT');
    } catch {
      /* already gone */
    }
    const done = await Promise.race([exited.then(() => true), sleep(stopMs, false, { ref: false })]);
    if (!done) process.kill(-child.pid, 'SIGKILL');
    if (!done) throw new Error(`serve ${args.join(' ')} did not stop on Ctrl-C (SIGINT to its process group):\n${out()}`);
    const gone = await waitFor(() => procsMentioning(home).length === 0, { timeoutMs: goneMs });
    if (!gone) throw new Error(`left running after Ctrl-C: ${JSON.stringify(procsMentioning(home))}`);
  };
  if (!up) {
    await stop().catch(() => {});
    throw new Error(`serve ${args.join(' ')} did not come up on ${port}:\n${out()}`);
  }
  return { port, url, out, stop };
}

// The value of a JSON text, or undefined when it is not JSON (an error page, a cut body).
export function jsonOrUndefined(text) {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

// GET http://127.0.0.1:port/p with an optional Bearer token: { status, json, text }.
export async function getJSON(port, p, token) {
  const r = await fetch(`http://127.0.0.1:${port}${p}`, { headers: token ? { Authorization: `Bearer ${token}` } : {} });
  const text = await r.text();
  const json = jsonOrUndefined(text);
  return { status: r.status, json, text };
}

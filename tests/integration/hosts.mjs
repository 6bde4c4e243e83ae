// Several hosts behind a load balancer, one PostgreSQL (issue 25, ADR 0034): the harness
// of hosts.test.mjs and tests/bench/hosts-bench.sh.
//
// It runs under tests/pg/with-pg.sh, which starts a throwaway PostgreSQL cluster of the
// distribution's own server and sets OLP_TEST_PG_URL (the workers' role, data rights
// only), OLP_TEST_PG_ADMIN_URL (the schema's owner), PGPASSFILE (a 0600 passfile of both
// roles) and OLP_TEST_PG_DIR. startHosts() then:
//   1. runs `olp-keys store init --worker-role=olp_worker` as the operator (OLP_STORE set to
//      the admin URL), which creates the schema and grants the workers' role its rights;
//   2. starts N real lighttpd + olp-fcgi stacks (harness.mjs startServer), each with its
//      own OLP_HOME whose config.json names the store (the workers' URL) and the passfile:
//      the hosts share the database and nothing else (no file, no socket);
//   3. starts a real HAProxy in front of them on 127.0.0.1, round robin, every request
//      balanced on its own, each answer marked with the host that gave it (X-OLP-Host:
//      a, b, ...).
//
// Environment, besides harness.mjs's: OLP_KEYS (the olp-keys under test), HAPROXY (else
// found on PATH or in /usr/sbin).

import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

import { freePort, makeHome, startServer, testConfig, testRegistry, waitFor } from './harness.mjs';

const HOST_NAMES = 'abcdefgh';

function findExe(name) {
  for (const d of [...(process.env.PATH ?? '').split(':'), '/usr/sbin', '/usr/local/sbin', '/sbin']) {
    if (!d) continue;
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

export const haproxyBin = () => process.env.HAPROXY ?? findExe('haproxy');

// The with-pg.sh cluster this process runs under: {url, adminUrl, passfile, dir, port}.
// Throws when not under with-pg.sh (the CTest entry always is).
export function pgEnv() {
  const need = ['OLP_TEST_PG_URL', 'OLP_TEST_PG_ADMIN_URL', 'PGPASSFILE', 'OLP_TEST_PG_DIR'];
  const missing = need.filter((k) => !process.env[k]);
  if (missing.length)
    throw new Error(`${missing.join(', ')} not set: run under tests/pg/with-pg.sh (the CTest entry does)`);
  return {
    url: process.env.OLP_TEST_PG_URL,
    adminUrl: process.env.OLP_TEST_PG_ADMIN_URL,
    passfile: process.env.PGPASSFILE,
    dir: process.env.OLP_TEST_PG_DIR,
    port: Number(process.env.OLP_TEST_PG_PORT),
  };
}

const pgCtlScript = () => process.env.OLP_TEST_PG_CTL ?? path.resolve(path.dirname(new URL(import.meta.url).pathname), '..', 'pg', 'pg-ctl.sh');

// tests/pg/pg-ctl.sh stop|start|restart: take the database away, or bring it back.
export function pgCtl(cmd) {
  const r = spawnSync(pgCtlScript(), [cmd], { encoding: 'utf8', timeout: 90000 });
  if (r.status !== 0) throw new Error(`pg-ctl.sh ${cmd} exited ${r.status}: ${r.stderr}`);
}

// One SQL statement as the postgres superuser on the olp database: its rows, each an
// array of text fields (psql -At, fields split on the unit separator).
export function psql(sql) {
  const r = spawnSync(pgCtlScript(), ['psql', '-At', '-F', '\x1f', '-v', 'ON_ERROR_STOP=1', '-c', sql], {
    encoding: 'utf8',
    timeout: 30000,
  });
  if (r.status !== 0) throw new Error(`psql ${sql}: exited ${r.status}: ${r.stderr}`);
  return r.stdout
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => l.split('\x1f'));
}

// olp-keys ARGS... --json with a home and extra environment: {status, stdout, stderr, json}.
export function olpKeysRun(home, args, env = {}) {
  const bin = process.env.OLP_KEYS;
  if (!bin) throw new Error('OLP_KEYS is not set: run these tests through CTest');
  const r = spawnSync(bin, [...args, '--json', `--olp-home=${home}`], {
    encoding: 'utf8',
    timeout: 30000,
    env: { ...process.env, ...env },
  });
  let json;
  try {
    json = JSON.parse(r.stdout);
  } catch {
    json = undefined;
  }
  return { status: r.status, stdout: r.stdout, stderr: r.stderr, json };
}

// `olp-keys store init` as the operator: the admin role's URL in OLP_STORE (which
// overrides config.json's "store"), the workers' role granted data rights. Returns what
// it printed; throws with its stderr when it fails.
export function storeInit(home, pg = pgEnv()) {
  const r = olpKeysRun(home, ['store', 'init', '--worker-role=olp_worker'], {
    OLP_STORE: pg.adminUrl,
    PGPASSFILE: pg.passfile,
  });
  if (r.status !== 0)
    throw new Error(`olp-keys store init exited ${r.status} (auth/pg.c on main?): ${r.stderr}${r.stdout}`);
  return r;
}

// The config.json of a host on the shared store: the tests' usual one plus the store.
export function hostConfig(pg = pgEnv(), extra = {}) {
  return { ...testConfig(), store: pg.url, store_passfile: pg.passfile, ...extra };
}

// HAProxy in front of the hosts: round robin, every request balanced on its own (no
// stickiness, prefer-last-server off), /health/live checked every second, the chosen
// server's name in X-OLP-Host.
export class Balancer {
  constructor({ port, child, dir, token, output }) {
    this.port = port;
    this.child = child;
    this.dir = dir;
    this.token = token;
    this.output = output;
    this.baseURL = `http://127.0.0.1:${port}`;
    this.kind = 'haproxy';
  }

  url(p) {
    return this.baseURL + p;
  }

  async stop() {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const exited = new Promise((r) => this.child.once('exit', r));
    this.child.kill('SIGTERM');
    const done = await Promise.race([exited.then(() => true), sleep(5000, false, { ref: false })]);
    if (!done) this.child.kill('SIGKILL');
    if (!process.env.OLP_IT_KEEP) fs.rmSync(this.dir, { recursive: true, force: true });
  }
}

export async function startBalancer(servers, { token } = {}) {
  const bin = haproxyBin();
  if (!bin) throw new Error('haproxy is not installed (deploy/olp-local test installs it)');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'olp-lb-'));
  const port = await freePort();
  const conf = path.join(dir, 'haproxy.cfg');
  fs.writeFileSync(
    conf,
    [
      'global',
      '  maxconn 4096',
      `  pidfile ${dir}/haproxy.pid`,
      'defaults',
      '  mode http',
      '  option http-keep-alive',
      '  no option prefer-last-server',
      '  retries 0',
      '  timeout connect 5s',
      '  timeout client 120s',
      '  timeout server 120s',
      'frontend olp',
      `  bind 127.0.0.1:${port}`,
      '  default_backend hosts',
      'backend hosts',
      '  balance roundrobin',
      '  option httpchk GET /health/live',
      '  http-response set-header X-OLP-Host %s',
      ...servers.map((s, i) => `  server ${HOST_NAMES[i]} 127.0.0.1:${s.port} check inter 1s`),
      '',
    ].join('\n'),
  );
  const output = [];
  const child = spawn(bin, ['-db', '-f', conf], { stdio: ['ignore', 'pipe', 'pipe'] });
  child.stdout.on('data', (d) => output.push(d));
  child.stderr.on('data', (d) => output.push(d));
  const lb = new Balancer({ port, child, dir, token, output });
  // Up once every host has answered through it.
  const seen = new Set();
  const up = await waitFor(
    async () => {
      if (child.exitCode !== null) return false;
      try {
        const r = await fetch(lb.url('/health/live'), { signal: AbortSignal.timeout(2000) });
        await r.arrayBuffer();
        if (r.status === 200) seen.add(r.headers.get('x-olp-host'));
      } catch {
        /* not yet */
      }
      return seen.size === servers.length;
    },
    { timeoutMs: 15000, stepMs: 100 },
  );
  if (!up) {
    await lb.stop();
    throw new Error(`haproxy did not come up on ${port} (hosts seen: ${[...seen]}): ${Buffer.concat(output)}`);
  }
  return lb;
}

// N hosts (lighttpd + olp-fcgi, their own OLP_HOME each) on the with-pg.sh store, the
// schema made by the operator first, and HAProxy in front. Every host accepts ownerToken
// as the owner (OLP_OWNER_TOKEN: works without the database). Returns {pg, hosts, lb,
// stop()}; hosts[i].name is 'a', 'b', ... as X-OLP-Host says.
export async function startHosts({
  n = 2,
  registry = testRegistry(),
  config,
  maxProcs = 2,
  threads = 4,
  ownerToken = 'olp_test_' + randomBytes(24).toString('base64url'),
  env = {},
  store = true, // false: each host on its embedded store (key files, SQLite), for comparison
} = {}) {
  const pg = store ? pgEnv() : null;
  const hosts = [];
  let lb = null;
  const stop = async () => {
    const errs = [];
    for (const s of [lb, ...hosts]) {
      try {
        await s?.stop();
      } catch (e) {
        errs.push(e.message);
      }
    }
    if (errs.length) throw new Error(errs.join('\n'));
  };
  try {
    const homes = [];
    for (let i = 0; i < n; i++) homes.push(makeHome({ registry, config: config ?? (store ? hostConfig(pg) : testConfig()) }));
    if (store) storeInit(homes[0].home, pg);
    for (let i = 0; i < n; i++) {
      const s = await startServer({ dirs: homes[i], maxProcs, threads, ownerToken, env });
      s.name = HOST_NAMES[i];
      hosts.push(s);
    }
    for (const s of hosts) await waitFor(() => s.workerPids().length === maxProcs, { timeoutMs: 15000 });
    lb = await startBalancer(hosts, { token: ownerToken });
  } catch (e) {
    await stop().catch(() => {});
    throw e;
  }
  return { pg, hosts, lb, ownerToken, stop };
}

// The shared PostgreSQL store (ADR 0034) away, in every way OLP is deployed: the workers as
// root, as www-data (when we are root) and behind `deploy/olp-local serve` started as root
// (workers as the user olp, OLP_STORE and PGPASSFILE from serve's environment). For each:
//   - the database up: an owner key of the store, a guest key with a quota, one without
//     limits, no key and a bad key get 200/401; the passfile is a 0600 copy owned by the
//     workers' user, and one others can read (or, for www-data, root's, which it cannot
//     read) is refused as a worker starts (and by serve, for a PGPASSFILE, before it starts
//     the web server);
//   - the database stopped (tests/pg/pg-ctl.sh stop): the quota key and a key never
//     checked get 503 store_unavailable with Retry-After; keys checked just before without
//     limits are served; no key, a key known revoked and an over-long token stay 401 (an
//     unknown token gets 503: ADR 0034's amendment of 2026-12-02);
//     /health/live stays 200 and the workers are the same processes;
//   - the database started again: everything back within 10 s (times OLP_TEST_TIME_FACTOR)
//     and the rows served meanwhile in the ledger.
// Then a full disk under the cluster (root only: its data directory moved onto a small
// tmpfs this test mounts, filled): the worker neither crashes nor hangs, keys with a quota
// or max_concurrent fail closed with an OpenAI-style 503, a key without limits is served,
// ledger rows wait in the bounded queue (overflow in olp_ledger_dropped_total) and reach
// the store once there is room again.
//
// Run under tests/pg/with-pg.sh (CTest it_store_users); keys made with the real olp-keys.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';

import {
  chatBody, commandProvider, curl, makeHome, procsMentioning, serveRoot, stageFor, startServe, startServer,
  testConfig, waitFor,
} from './harness.mjs';

const TF = Math.max(1, Number(process.env.OLP_TEST_TIME_FACTOR) || 1);
const pgURL = process.env.OLP_TEST_PG_URL;
const isRoot = process.getuid() === 0;
const bearer = (t) => `Bearer ${t}`;
const REGISTRY = { providers: { echo: commandProvider('echo', ['/usr/bin/cat']) } };

// olp-keys ARGS on the store (the workers' role, with-pg's passfile) from a scratch home.
const keysHome = fs.mkdtempSync(path.join(os.tmpdir(), 'olp-store-users-keys-'));
function olpKeys(...args) {
  const r = spawnSync(process.env.OLP_KEYS, [...args, '--json', `--olp-home=${keysHome}`], {
    encoding: 'utf8', timeout: 60000, env: { ...process.env, OLP_STORE: pgURL },
  });
  if (r.status !== 0) throw new Error(`olp-keys ${args.join(' ')} exited ${r.status}: ${r.stderr}`);
  return JSON.parse(r.stdout);
}

function pgCtl(what, ...args) {
  const r = spawnSync(process.env.OLP_TEST_PG_CTL, [what, ...args], { encoding: 'utf8', timeout: 120000 });
  assert.equal(r.status, 0, `pg-ctl.sh ${what}: ${r.stderr}`);
  return r.stdout;
}
const psql = (sql) => pgCtl('psql', '-At', '-v', 'ON_ERROR_STOP=1', '-c', sql).trim();

// A copy of with-pg's passfile at file, mode 0600 (or mode), owned by user (or root).
function passfileCopy(file, { user = null, mode = 0o600 } = {}) {
  fs.copyFileSync(process.env.PGPASSFILE, file);
  fs.chmodSync(file, mode);
  if (user) assert.equal(spawnSync('chown', [`${user}:${user}`, file]).status, 0);
  return file;
}

const uidOf = (pid) => Number(/^Uid:\s+(\d+)/m.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))[1]);
const metric = (text, name) => {
  const m = new RegExp(`^${name} (\\S+)$`, 'm').exec(text);
  return m ? Number(m[1]) : undefined;
};
const chat = (server, auth, text = 'hi') =>
  curl(server, { method: 'POST', path: '/v1/chat/completions', auth, body: chatBody('echo', text) });

// An OpenAI-style error object with this status and code (never an empty 500).
function isError(r, status, code) {
  assert.equal(r.status, status, r.text);
  assert.deepEqual(Object.keys(r.json ?? {}), ['error'], r.text);
  assert.equal(r.json.error.code, code, r.text);
  assert.ok(r.json.error.message.length > 0, r.text);
}
function isStoreUnavailable(r) {
  isError(r, 503, 'store_unavailable');
  assert.ok(Number(r.headers['retry-after']) > 0, `Retry-After: ${r.headers['retry-after']}`);
}

// The requests of key id served (200) as the store's ledger holds them (every host's).
const ledgerRows = (id) =>
  Number(psql(`SELECT coalesce(sum(count), 0) FROM olp_requests WHERE key_id = '${id}' AND status = 200`));

let owner;
before(() => {
  // The schemas, as the operator makes them; one owner key in the store for every mode.
  const init = spawnSync(process.env.OLP_KEYS, ['store', 'init', '--worker-role=olp_worker'], {
    encoding: 'utf8', timeout: 60000, env: { ...process.env, OLP_STORE: process.env.OLP_TEST_PG_ADMIN_URL },
  });
  assert.equal(init.status, 0, `olp-keys store init: ${init.stderr}`);
  owner = olpKeys('keygen', '--owner');
});
after(() => fs.rmSync(keysHome, { recursive: true, force: true }));

// The tests of one deployment. ctx, filled by its before(): server ({url(p), token}),
// user, uid, workerPids(), label.
function modeTests(ctx) {
  const k = {};
  let pids;

  it('the database up: owner, quota and free keys 200; no key and a bad key 401', async () => {
    const tag = `${ctx.label}-${process.hrtime.bigint()}`;
    k.quota = olpKeys('keygen', `--name=quota ${tag}`, '--quota-rpd=1000');
    k.free = olpKeys('keygen', `--name=free ${tag}`);
    k.never = olpKeys('keygen', `--name=never ${tag}`);
    k.gone = olpKeys('keygen', `--name=gone ${tag}`);
    olpKeys('revoke', `--id=${k.gone.id}`);
    pids = ctx.workerPids();
    assert.ok(pids.length > 0, 'no worker');
    for (const pid of pids) assert.equal(uidOf(pid), ctx.uid, `worker ${pid} runs as ${ctx.user}`);

    for (const t of [owner.token, k.quota.token, k.free.token]) {
      const r = await chat(ctx.server, bearer(t), 'up');
      assert.equal(r.status, 200, r.text);
      assert.equal(r.json.choices[0].message.content, 'up');
    }
    isError(await chat(ctx.server, false), 401, 'auth_required');
    isError(await chat(ctx.server, 'Bearer olp_not_a_key'), 401, 'invalid_or_revoked_key');
    isError(await chat(ctx.server, bearer(k.gone.token)), 401, 'invalid_or_revoked_key');
  });

  it('the database stopped: quota and unchecked keys 503, checked free keys served, no key 401', async (t) => {
    assert.ok(k.quota, 'the test before ran');
    pgCtl('stop');
    let started = false;
    try {
      isStoreUnavailable(await chat(ctx.server, bearer(k.quota.token), 'away'));
      isStoreUnavailable(await chat(ctx.server, bearer(k.never.token), 'away'));
      for (let i = 0; i < 3; i++) {
        const r = await chat(ctx.server, bearer(k.free.token), `away ${i}`);
        assert.equal(r.status, 200, r.text);
      }
      const o = await chat(ctx.server, bearer(owner.token), 'away');
      assert.equal(o.status, 200, o.text);
      // No key never learns the store's state; nor does a key known revoked, nor a token
      // longer than any key. An unknown token may be a key made since: 503 (ADR 0034).
      isError(await chat(ctx.server, false), 401, 'auth_required');
      isError(await chat(ctx.server, bearer(k.gone.token)), 401, 'invalid_or_revoked_key');
      isError(await chat(ctx.server, bearer(`olp_${'x'.repeat(1100)}`)), 401, 'invalid_or_revoked_key');
      isStoreUnavailable(await chat(ctx.server, 'Bearer olp_not_a_key'));
      const live = await curl(ctx.server, { path: '/health/live' });
      assert.equal(live.status, 200, live.text);
      const h = await curl(ctx.server, { path: '/health', auth: bearer(owner.token) });
      assert.equal(h.json?.store?.ok, false, h.text);
      assert.deepEqual(ctx.workerPids(), pids, 'the workers are the same processes');

      pgCtl('start');
      started = true;
      const t0 = Date.now();
      const bound = 10000 * TF;
      let q;
      const back = await waitFor(async () => {
        q = await chat(ctx.server, bearer(k.quota.token), 'back');
        return q.status === 200;
      }, { timeoutMs: bound, stepMs: 250 });
      assert.ok(back, `the quota key after ${Date.now() - t0} ms: ${q.status} ${q.text}`);
      t.diagnostic(`the quota key served again ${Date.now() - t0} ms after the database started`);
      const n = await chat(ctx.server, bearer(k.never.token), 'back');
      assert.equal(n.status, 200, n.text);
      isError(await chat(ctx.server, 'Bearer olp_not_a_key'), 401, 'invalid_or_revoked_key');
      assert.ok(Date.now() - t0 < bound, `back after ${Date.now() - t0} ms`);
      // The free key's rows: one before, three while the database was away.
      let rows;
      await waitFor(() => (rows = ledgerRows(k.free.id)) === 4, { timeoutMs: bound, stepMs: 250 });
      assert.equal(rows, 4, 'the rows served while the database was away reach the ledger');
      assert.equal(ledgerRows(k.quota.id), 2);
      assert.deepEqual(ctx.workerPids(), pids, 'the workers are the same processes');
    } finally {
      if (!started) pgCtl('start');
    }
  });
}

// A worker of this user given a passfile (OLP_HOME's config.json names it): mode 'start'
// runs olp-fcgi as a web server's CGI would (no socket on fd 0: the same start-up as a
// FastCGI worker's, then one request), 'check' runs olp-fcgi --check-config (what serve
// runs before it starts the web server). { status, stdout, stderr }.
function workerAs(user, bin, file, mode) {
  const home = fs.mkdtempSync(path.join(os.tmpdir(), 'olp-store-users-check-'));
  const json = (name, v) => fs.writeFileSync(path.join(home, name), JSON.stringify(v), { mode: 0o600 });
  json('config.json', { ...testConfig(), store: pgURL, store_passfile: file });
  json('models-registry.json', REGISTRY);
  // OLP_HOME is the workers' own (the sandbox's runtime dir is made in it).
  assert.equal(spawnSync('chown', ['-R', `${user}:${user}`, home]).status, 0);
  const argv = [bin, ...(mode === 'check' ? ['--check-config'] : [])];
  const r = spawnSync('setpriv', [`--reuid=${user}`, `--regid=${user}`, '--init-groups', '--', ...argv], {
    encoding: 'utf8', timeout: 30000, stdio: ['ignore', 'pipe', 'pipe'],
    env: { PATH: process.env.PATH, OLP_HOME: home, GATEWAY_INTERFACE: 'CGI/1.1', REQUEST_METHOD: 'GET', SCRIPT_NAME: '', PATH_INFO: '/health/live' },
  });
  fs.rmSync(home, { recursive: true, force: true });
  return r;
}

function lighttpdMode(name, user) {
  const skip = user && !isRoot ? 'not root: the workers run as www-data only when we are root' : false;
  describe(`the store away, workers as ${name} (lighttpd)`, { skip }, () => {
    const ctx = { label: name, user: name };
    let server;

    before(async () => {
      const stage = user ? stageFor(user) : null;
      const dirs = makeHome({ registry: REGISTRY, config: null });
      const passfile = path.join(dirs.root, 'pgpass');
      passfileCopy(passfile); // startServer gives dirs.root to the user
      fs.writeFileSync(path.join(dirs.home, 'config.json'),
        JSON.stringify({ ...testConfig(), store: pgURL, store_passfile: passfile }), { mode: 0o600 });
      server = await startServer({ dirs, stage, maxProcs: 1, threads: 4 });
      ctx.server = server;
      ctx.stage = stage;
      ctx.uid = user ? Number(spawnSync('id', ['-u', user], { encoding: 'utf8' }).stdout.trim()) : process.getuid();
      ctx.workerPids = () => server.workerPids();
    });
    after(async () => {
      await server?.stop();
      if (ctx.stage) fs.rmSync(ctx.stage.dir, { recursive: true, force: true });
    });

    modeTests(ctx);

    it('a passfile others can read, or the workers cannot, is refused as they start', async () => {
      const who = user ?? 'root';
      const bin = ctx.stage?.bin ?? server.bin;
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'olp-store-users-pass-'));
      fs.chmodSync(dir, 0o755);
      try {
        const loose = passfileCopy(path.join(dir, 'loose'), { user, mode: 0o640 });
        let r = workerAs(who, bin, loose, 'start');
        assert.notEqual(r.status, 0, r.stdout + r.stderr);
        assert.match(r.stderr, /store_passfile \S+ group or others can read it/);
        if (user) {
          // 0600 but root's: www-data cannot read it, and libpq would skip it.
          r = workerAs(who, bin, passfileCopy(path.join(dir, 'roots')), 'start');
          assert.notEqual(r.status, 0, r.stdout + r.stderr);
          assert.match(r.stderr, /store_passfile \S+ Permission denied/);
        }
        r = workerAs(who, bin, passfileCopy(path.join(dir, 'good'), { user }), 'check');
        assert.equal(r.status, 0, r.stdout + r.stderr);
        assert.match(r.stdout, /the shared store \S+ answers/);
      } finally {
        fs.rmSync(dir, { recursive: true, force: true });
      }
    });
  });
}

lighttpdMode(os.userInfo().username, null);
lighttpdMode('www-data', 'www-data');

// deploy/olp-local serve started as root: lighttpd and the workers as olp, the store named
// by OLP_STORE and its password by PGPASSFILE in serve's environment.
const serveSkip = isRoot ? false : 'not root: serve runs its workers as olp only when started by root';
const serveDir = isRoot ? serveRoot('olp-store-users-serve-') : null;
describe('the store away, behind deploy/olp-local serve started as root (workers as olp)', { skip: serveSkip }, () => {
  const ctx = { label: 'serve', user: 'olp' };
  let serve;
  let n = 0;

  // A fresh OLP_HOME under serveDir with the registry and a config.json without a store.
  const newHome = () => {
    const home = path.join(serveDir, `home${n++}`);
    fs.mkdirSync(home, { mode: 0o700 });
    fs.writeFileSync(path.join(home, 'models-registry.json'), JSON.stringify(REGISTRY), { mode: 0o600 });
    fs.writeFileSync(path.join(home, 'config.json'), JSON.stringify(testConfig()), { mode: 0o600 });
    return home;
  };

  before(async () => {
    const home = newHome();
    const passfile = passfileCopy(path.join(serveDir, 'pgpass'), { user: 'olp' });
    const token = `olp_test_${Math.random().toString(36).slice(2)}${Math.random().toString(36).slice(2)}`;
    serve = await startServe(home, [], { env: { OLP_STORE: pgURL, PGPASSFILE: passfile, OLP_OWNER_TOKEN: token } });
    ctx.server = { url: serve.url, token };
    ctx.uid = Number(spawnSync('id', ['-u', 'olp'], { encoding: 'utf8' }).stdout.trim());
    ctx.workerPids = () =>
      procsMentioning(home).filter((p) => path.basename(p.cmdline.split(' ')[0] ?? '') === 'olp-fcgi').map((p) => p.pid)
        .sort((a, b) => a - b);
  });
  after(async () => {
    await serve?.stop();
  });

  modeTests(ctx);

  it('a PGPASSFILE others can read stops serve before the workers start, saying why', async () => {
    const loose = passfileCopy(path.join(serveDir, 'pgpass-loose'), { user: 'olp', mode: 0o644 });
    const home = newHome();
    await assert.rejects(
      startServe(home, [], { env: { OLP_STORE: pgURL, PGPASSFILE: loose, OLP_OWNER_TOKEN: ctx.server.token }, upMs: 30000 * TF }),
      (e) => /PGPASSFILE \S+ group or others can read it/.test(e.message) && /cannot start with this configuration/.test(e.message),
    );
  });
});

// ---- a full disk under the cluster -------------------------------------------------------

// Fill the file system under dir with one file until ENOSPC (at most 1 GiB).
function fillDisk(dir) {
  const file = path.join(dir, 'filler');
  const fd = fs.openSync(file, 'w');
  const block = Buffer.alloc(65536, 0x61);
  try {
    for (let i = 0; i < 16384; i++) {
      try {
        fs.writeSync(fd, block);
      } catch (e) {
        if (e.code === 'ENOSPC') break;
        throw e;
      }
    }
    // The last partial block.
    for (const n of [4096, 512, 1]) {
      try {
        for (;;) fs.writeSync(fd, block, 0, n);
      } catch (e) {
        if (e.code !== 'ENOSPC') throw e;
      }
    }
  } finally {
    fs.closeSync(fd);
  }
  return file;
}

// Every page of table full of live rows: committed rows one at a time until the server
// cannot extend the file (disk_full). Run a VACUUM of it first, while there is room (it
// makes the dead rows' room free and writes the maps it needs). values(i): the VALUES
// list of row i. Returns how many rows went in.
function packTable(table, columns, values) {
  const sql = `DO $$ DECLARE i int; BEGIN
    FOR i IN 1..200000 LOOP
      BEGIN
        INSERT INTO ${table} (${columns}) VALUES (${values('i')});
      EXCEPTION WHEN disk_full THEN
        RAISE NOTICE 'full after %', i - 1; RETURN;
      END;
    END LOOP;
    RAISE EXCEPTION 'never full';
  END $$`;
  const r = spawnSync(process.env.OLP_TEST_PG_CTL, ['psql', '-v', 'ON_ERROR_STOP=1', '-c', sql], { encoding: 'utf8', timeout: 300000 });
  assert.equal(r.status, 0, `packing ${table}: ${r.stderr}`);
  const m = /full after (\d+)/.exec(r.stderr);
  assert.ok(m, `packing ${table}: ${r.stderr}`);
  return Number(m[1]);
}

describe('a full disk under the cluster: quota keys fail closed, others served, rows wait and arrive', { skip: isRoot ? false : 'mounting a tmpfs needs root' }, () => {
  const pgDir = process.env.OLP_TEST_PG_DIR;
  const mnt = path.join(pgDir ?? '/nonexistent', 'tmpfs');
  const data = path.join(pgDir ?? '/nonexistent', 'data');
  let server, used, fresh, conc, free, whyNot = null, filler = null, pids;
  const served = { free: 0 };

  before(async () => {
    // The cluster's data directory (tables and WAL) moved onto a tmpfs of its size and a
    // few MiB more, as with-pg.sh made it; back where it was at the end.
    pgCtl('stop');
    try {
      const kb = Number(spawnSync('du', ['-sk', data], { encoding: 'utf8' }).stdout.split('\t')[0]);
      const pg = spawnSync('id', ['-u', 'postgres'], { encoding: 'utf8' }).stdout.trim();
      fs.mkdirSync(mnt, { mode: 0o700 });
      const m = spawnSync('mount', ['-t', 'tmpfs', '-o', `size=${kb + 8192}k,mode=0700,uid=${pg},gid=${pg}`, 'olp-it-pgdata', mnt],
        { encoding: 'utf8' });
      if (m.status !== 0) {
        whyNot = `mount: ${m.stderr.trim()}`;
        return;
      }
      // --sparse=never: the WAL segments fully allocated, as initdb made them.
      const cp = spawnSync('cp', ['-a', '--sparse=never', `${data}/.`, mnt], { encoding: 'utf8' });
      assert.equal(cp.status, 0, cp.stderr);
      fs.renameSync(data, `${data}.disk`);
      fs.symlinkSync(mnt, data);
    } finally {
      pgCtl('start');
    }
    const tag = process.hrtime.bigint();
    used = olpKeys('keygen', `--name=full used ${tag}`, '--quota-rpd=1000');
    fresh = olpKeys('keygen', `--name=full fresh ${tag}`, '--quota-rpd=1000');
    conc = olpKeys('keygen', `--name=full conc ${tag}`, '--quota-concurrent=2');
    free = olpKeys('keygen', `--name=full free ${tag}`);
    const dirs = makeHome({ registry: REGISTRY, config: null });
    const passfile = passfileCopy(path.join(dirs.root, 'pgpass'));
    // A small queue, so that its bound is reached: 4 rows.
    fs.writeFileSync(path.join(dirs.home, 'config.json'),
      JSON.stringify({ ...testConfig(), store: pgURL, store_passfile: passfile, store_buffer_rows: 4 }), { mode: 0o600 });
    server = await startServer({ dirs, maxProcs: 1, threads: 4 });
    pids = server.workerPids();
  });
  after(async () => {
    try {
      await server?.stop();
    } finally {
      if (fs.existsSync(`${data}.disk`)) {
        pgCtl('stop');
        fs.rmSync(data);
        fs.renameSync(`${data}.disk`, data);
        pgCtl('start');
      }
      spawnSync('umount', [mnt]);
      fs.rmSync(mnt, { recursive: true, force: true });
    }
  });

  it('full: the quota keys 503 (an OpenAI error, never a 500), a free key served, rows queued and overflow counted', async (t) => {
    if (whyNot) return t.skip(`a tmpfs for the cluster: ${whyNot}`);
    for (const k of [used, free]) {
      const r = await chat(server, bearer(k.token), 'before');
      assert.equal(r.status, 200, r.text);
    }
    served.free++;
    await waitFor(() => ledgerRows(free.id) === 1, { timeoutMs: 10000 * TF });
    psql('VACUUM olp_quota_windows');
    psql('VACUUM olp_requests');
    psql('VACUUM olp_leases');
    filler = fillDisk(mnt);
    const packed = [
      packTable('olp_quota_windows', 'key_id, kind, start_ms, requests, tokens', (i) => `'__full__' || ${i}, 0, ${i}, 0, 0`),
      packTable('olp_requests',
        'host, ts_ms, key_id, status, prompt_tokens, completion_tokens, cached_tokens, duration_ms, ttfb_ms, start',
        (i) => `'__full__', ${i}, '__full__', 200, 0, 0, 0, 0, 0, 0`),
      packTable('olp_leases', 'key_id, slot, holder, expires_at', (i) => `'__full__' || ${i}, 0, '__full__', now() + interval '1 day'`),
    ];
    t.diagnostic(`rows packed in: ${packed.join(', ')}`);

    // A key without limits is served; its rows wait in the queue (4), the rest counted.
    const bound = 10000 * TF;
    for (let i = 0; i < 10; i++) {
      const t0 = Date.now();
      const r = await chat(server, bearer(free.token), `full ${i}`);
      assert.ok(Date.now() - t0 < bound, `answered after ${Date.now() - t0} ms`);
      assert.equal(r.status, 200, r.text);
      served.free++;
    }
    // A request's row is queued just after its answer: the count read once it holds still.
    const dropped = async () => metric((await curl(server, { path: '/metrics', auth: true })).text, 'olp_ledger_dropped_total');
    let last = -1;
    await waitFor(async () => {
      const d = await dropped();
      const still = d === last;
      last = d;
      return still;
    }, { timeoutMs: bound, stepMs: 300 * TF });
    served.dropped = last;
    assert.ok(served.dropped >= 1, `olp_ledger_dropped_total ${served.dropped}`);

    // A key whose day row must be written anew: refused. The one counted before may be
    // served only while its count still fits (the server reuses a row's own page); if it
    // is served, it is counted (checked once there is room).
    for (let i = 0; i < 3; i++) {
      const t0 = Date.now();
      const r = await chat(server, bearer(fresh.token), `full ${i}`);
      assert.ok(Date.now() - t0 < bound, `answered after ${Date.now() - t0} ms`);
      isStoreUnavailable(r);
      assert.match(r.json.error.message, /quota cannot be checked/);
    }
    // A key with max_concurrent: its lease row cannot be written either.
    const c = await chat(server, bearer(conc.token), 'full');
    isStoreUnavailable(c);
    assert.match(c.json.error.message, /concurrency limit cannot be checked/);
    const u = await chat(server, bearer(used.token), 'full');
    if (u.status !== 200) isStoreUnavailable(u);
    else served.used = 1;
    t.diagnostic(`the key counted before: ${u.status}`);
    const live = await curl(server, { path: '/health/live' });
    assert.equal(live.status, 200);
    const h = await curl(server, { path: '/health', auth: true });
    assert.equal(h.json.usage.ok, false, JSON.stringify(h.json.usage));
    served.droppedAll = await dropped();
    t.diagnostic(`olp_ledger_dropped_total: ${served.dropped} after the free key's requests, ${served.droppedAll} at the end`);
    assert.deepEqual(server.workerPids(), pids, 'the worker is the same process');
  });

  it('room again: the quota keys served, the queued rows in the ledger, nothing lost uncounted', async (t) => {
    if (whyNot) return t.skip(`a tmpfs for the cluster: ${whyNot}`);
    assert.ok(filler, 'the test before ran');
    fs.rmSync(filler);
    filler = null;
    const bound = 10000 * TF;
    let r;
    const back = await waitFor(async () => {
      r = await chat(server, bearer(fresh.token), 'room');
      return r.status === 200;
    }, { timeoutMs: bound, stepMs: 250 });
    assert.ok(back, `${r.status} ${r.text}`);
    const c = await chat(server, bearer(conc.token), 'room');
    assert.equal(c.status, 200, c.text);
    // Every row of the free key served is in the ledger or counted as dropped.
    let rows;
    await waitFor(() => (rows = ledgerRows(free.id)) + served.dropped >= served.free, { timeoutMs: bound, stepMs: 250 });
    assert.equal(rows + served.dropped, served.free, `${rows} rows in the ledger, ${served.dropped} dropped, ${served.free} served`);
    assert.ok(rows >= 5, `the queued rows reach the store: ${rows} (1 before, 4 queued)`);
    // The key counted before: what it was served is what the store counted.
    const day = Number(psql(`SELECT coalesce(max(requests), 0) FROM olp_quota_windows WHERE key_id = '${used.id}' AND kind = 1`));
    t.diagnostic(`the used key's day row: ${day}`);
    assert.ok(day === 1 + (served.used ?? 0), `day row ${day}, served ${1 + (served.used ?? 0)}`);
    // The ledger works again: a new row is written, /health says so.
    const f = await chat(server, bearer(free.token), 'room');
    assert.equal(f.status, 200, f.text);
    served.free++;
    await waitFor(() => ledgerRows(free.id) === rows + 1, { timeoutMs: bound, stepMs: 250 });
    assert.equal(ledgerRows(free.id), rows + 1);
    const h = await curl(server, { path: '/health', auth: true });
    assert.equal(h.json.usage.ok, true, JSON.stringify(h.json.usage));
    assert.deepEqual(server.workerPids(), pids, 'the worker is the same process');
  });
});

// GET /metrics (issue 14) through a real lighttpd with lighttpd/olp.conf and 2 workers:
// one scrape shows the whole pool's counts whichever worker answers it; who may scrape
// (the owner, config.json's metrics_token; not a guest, not without a token); the text
// passes `promtool check metrics`; a worker that cannot open the shared file answers
// 503 there and serves everything else; a short metrics_token stops the worker at start.

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';

import { cfg, chatBody, curl, descendants, makeHome, olpKeys, startServer, testConfig, testRegistry, waitFor } from './harness.mjs';

const METRICS_TOKEN = 'mt_' + randomBytes(24).toString('hex');

// The samples of a scrape: Map "name{labels}" → number.
function samples(text) {
  const m = new Map();
  for (const l of text.split('\n')) {
    if (!l || l.startsWith('#')) continue;
    const i = l.lastIndexOf(' ');
    m.set(l.slice(0, i), Number(l.slice(i + 1)));
  }
  return m;
}

// The worker pid that served a request, from its "request" log line.
async function servedBy(server, rid) {
  let pid = null;
  await waitFor(
    () => {
      let text = '';
      try {
        text = fs.readFileSync(path.join(server.runDir, 'olp.log'), 'utf8');
      } catch {
        return false;
      }
      for (const l of text.split('\n')) {
        if (!l.includes(rid) || !l.includes('"event":"request"')) continue;
        pid = JSON.parse(l).pid;
        return true;
      }
      return false;
    },
    { timeoutMs: 5000 },
  );
  return pid;
}

function promtool(text) {
  const r = spawnSync('promtool', ['check', 'metrics'], { input: text, encoding: 'utf8', timeout: 30000 });
  if (r.error?.code === 'ENOENT')
    throw new Error('promtool not found: Debian package prometheus (deploy/olp-local test installs it)');
  return r;
}

describe('GET /metrics behind lighttpd, 2 workers', () => {
  let srv;
  let guest;

  before(async () => {
    // A provider whose command is not there: its runs fail to start (spawn_failed).
    const registry = testRegistry();
    registry.providers.missing = {
      ...registry.providers.echo,
      argv: ['/nonexistent/olp-test-command'],
      aliases: undefined,
      models: [{ id: 'missing', displayName: 'Test missing', created: 1700000000 }],
    };
    const dirs = makeHome({ registry, config: { ...testConfig(), metrics_token: METRICS_TOKEN } });
    guest = olpKeys(dirs.home, 'keygen', '--name=guest', '--tier=guest');
    srv = await startServer({ dirs, maxProcs: 2, threads: 2 });
  });

  after(async () => {
    await srv?.stop();
  });

  it('who may scrape: owner and metrics_token 200, guest 403, none or a wrong token 401', async () => {
    const owner = await curl(srv, { path: '/metrics' });
    assert.equal(owner.status, 200, owner.text);
    assert.equal(owner.headers['content-type'], 'text/plain; version=0.0.4; charset=utf-8');
    assert.equal(owner.headers['cache-control'], 'no-store');
    assert.match(owner.text, /^# HELP olp_build_info /m);
    const tok = await curl(srv, { path: '/metrics', auth: `Bearer ${METRICS_TOKEN}` });
    assert.equal(tok.status, 200, tok.text);
    assert.match(tok.text, /^olp_build_info\{version="[^"]+"\} 1$/m);
    const g = await curl(srv, { path: '/metrics', auth: `Bearer ${guest.token}` });
    assert.equal(g.status, 403, g.text);
    assert.equal(g.json?.error?.code, 'owner_only');
    const none = await curl(srv, { path: '/metrics', auth: false });
    assert.equal(none.status, 401, none.text);
    const wrong = await curl(srv, { path: '/metrics', auth: `Bearer ${METRICS_TOKEN}x` });
    assert.equal(wrong.status, 401, wrong.text);
    // The metrics_token is for /metrics only: it is no key.
    const chat = await curl(srv, {
      method: 'POST',
      path: '/v1/chat/completions',
      auth: `Bearer ${METRICS_TOKEN}`,
      body: chatBody('echo'),
    });
    assert.equal(chat.status, 401, chat.text);
    // Never in the workers' log.
    assert.ok(!srv.errorLog().includes(METRICS_TOKEN), 'the metrics_token reached the log');
  });

  it('the metrics_token is read as a key is (auth_token_extract): any case, a tab after Bearer', async () => {
    for (const auth of [`bearer ${METRICS_TOKEN}`, `Bearer\t${METRICS_TOKEN}`, `\tBEARER  ${METRICS_TOKEN}\t`]) {
      const r = await curl(srv, { path: '/metrics', auth });
      assert.equal(r.status, 200, `${JSON.stringify(auth.replace(METRICS_TOKEN, 'T'))}: ${r.text}`);
    }
    // Another scheme, or Bearer glued to the token, is no bearer token.
    for (const auth of [`Basic ${METRICS_TOKEN}`, `Bearer${METRICS_TOKEN}`]) {
      const r = await curl(srv, { path: '/metrics', auth });
      assert.equal(r.status, 401, r.text);
    }
  });

  it('one scrape shows the whole pool, whichever worker answers; promtool accepts it', async () => {
    assert.ok(srv.workerPids().length >= 2, `2 workers expected: ${srv.workerPids()}`);
    const N = 8;
    const chats = await Promise.all(
      Array.from({ length: N }, (_, i) =>
        curl(srv, { method: 'POST', path: '/v1/chat/completions', body: chatBody('echo', `hello ${i}`) }),
      ),
    );
    for (const c of chats) assert.equal(c.status, 200, c.text);
    const streamed = await curl(srv, {
      method: 'POST',
      path: '/v1/chat/completions',
      body: chatBody('ticker', 'x', { stream: true }),
    });
    assert.equal(streamed.status, 200, streamed.text);
    for (let i = 0; i < 3; i++) assert.equal((await curl(srv, { path: `/no/such/route/${i}` })).status, 404);
    const failed = await curl(srv, { method: 'POST', path: '/v1/chat/completions', body: chatBody('missing') });
    assert.ok(failed.status >= 500, `a command that is not there: ${failed.status} ${failed.text}`);
    const chatPids = new Set(await Promise.all(chats.map((c) => servedBy(srv, c.headers['x-request-id']))));
    assert.ok(chatPids.size >= 1);

    // A request is counted just after its answer is finished: wait until the last one is
    // (any worker's scrape shows the pool's counts).
    await waitFor(
      async () =>
        samples((await curl(srv, { path: '/metrics' })).text).get(
          `olp_requests_total{route="chat",provider="missing",model="missing",status="${failed.status}"}`,
        ) === 1,
      { timeoutMs: 10000, stepMs: 100 },
    );
    // Scrape in concurrent batches until both workers have answered one.
    const seen = new Set();
    for (let b = 0; b < 30 && seen.size < 2; b++) {
      const batch = await Promise.all(Array.from({ length: 6 }, () => curl(srv, { path: '/metrics' })));
      for (const r of batch) {
        assert.equal(r.status, 200, r.text);
        const pid = await servedBy(srv, r.headers['x-request-id']);
        const s = samples(r.text);
        const at = `(scrape answered by worker ${pid})`;
        assert.equal(s.get('olp_requests_total{route="chat",provider="echo",model="echo",status="200"}'), N, at);
        assert.equal(s.get('olp_requests_total{route="chat",provider="ticker",model="ticker",status="200"}'), 1, at);
        assert.equal(s.get('olp_requests_total{route="not_found",provider="",model="",status="404"}'), 3, at);
        assert.equal(s.get('olp_request_duration_seconds_count{provider="echo"}'), N, at);
        assert.equal(s.get('olp_request_duration_seconds_bucket{provider="echo",le="+Inf"}'), N, at);
        assert.equal(s.get('olp_time_to_first_byte_seconds_count{provider="echo"}'), N, at);
        assert.ok(s.get('olp_request_duration_seconds_sum{provider="echo"}') > 0, at);
        assert.ok(
          s.get('olp_time_to_first_byte_seconds_sum{provider="echo"}') <=
            s.get('olp_request_duration_seconds_sum{provider="echo"}'),
          `first byte before the end ${at}`,
        );
        assert.equal(s.get('olp_runs_total{provider="echo",start="cold"}'), N, at);
        assert.equal(s.get('olp_runs_in_flight{provider="echo"}'), 0, at);
        assert.equal(s.get('olp_sandbox_start_failures_total{provider="missing",reason="spawn_failed"}'), 1, at);
        assert.equal(s.get(`olp_requests_total{route="chat",provider="missing",model="missing",status="${failed.status}"}`), 1, at);
        assert.equal(s.get('olp_runs_in_flight{provider="forever"}'), 0, at);
        assert.equal(s.get('olp_audit_write_failures_total'), 0, at);
        assert.equal(s.get('olp_metrics_dropped_series_total'), 0, at);
        const pt = promtool(r.text);
        assert.equal(pt.status, 0, `promtool check metrics: ${pt.stdout}${pt.stderr}`);
        seen.add(pid);
      }
    }
    assert.equal(seen.size, 2, `scrapes answered by ${[...seen]} only`);
  });

  it('a run in flight shows in olp_runs_in_flight, and leaves it when done', async () => {
    const run = curl(srv, { method: 'POST', path: '/v1/chat/completions', body: chatBody('forever', 'x', { stream: true }) });
    let s;
    const up = await waitFor(
      async () => {
        s = samples((await curl(srv, { path: '/metrics' })).text);
        return s.get('olp_runs_in_flight{provider="forever"}') === 1;
      },
      { timeoutMs: 20000, stepMs: 200 },
    );
    assert.ok(up, `forever never in flight: ${[...(s ?? [])].filter(([k]) => k.includes('flight'))}`);
    // Its worker is killed mid-run: the run must not stay counted.
    const busy = srv.workerPids().filter((pid) => descendants(pid).length > 0);
    assert.equal(busy.length, 1, `one worker runs forever: ${busy}`);
    process.kill(busy[0], 'SIGKILL');
    await run.catch(() => {});
    const gone = await waitFor(
      async () => {
        const r = await curl(srv, { path: '/metrics' }).catch(() => null);
        if (r?.status !== 200) return false;
        s = samples(r.text);
        return s.get('olp_runs_in_flight{provider="forever"}') === 0;
      },
      { timeoutMs: 20000, stepMs: 200 },
    );
    assert.ok(gone, `a killed worker's run still counted: ${s?.get('olp_runs_in_flight{provider="forever"}')}`);
  });
});

describe('GET /metrics when the shared file cannot be opened', () => {
  let srv;

  before(async () => {
    const dirs = makeHome();
    // A symlink where the table goes: refused, whatever it points at.
    fs.mkdirSync(dirs.runtimeDir, { mode: 0o700 });
    fs.symlinkSync('/dev/null', path.join(dirs.runtimeDir, 'metrics.v1'));
    srv = await startServer({ dirs, maxProcs: 1, threads: 2 });
  });

  after(async () => {
    await srv?.stop();
  });

  it('503 with a clear error there; requests served as ever; the log says why', async () => {
    const r = await curl(srv, { path: '/metrics' });
    assert.equal(r.status, 503, r.text);
    assert.equal(r.json?.error?.code, 'metrics_unavailable');
    const c = await curl(srv, { method: 'POST', path: '/v1/chat/completions', body: chatBody('echo') });
    assert.equal(c.status, 200, c.text);
    assert.match(srv.errorLog(), /metrics\.v1: a symbolic link; refused/);
  });
});

describe('config.json metrics_token', () => {
  it('shorter than 32 characters: the worker does not start, and says which field', () => {
    const dirs = makeHome({ config: { ...testConfig(), metrics_token: 'short' } });
    const r = spawnSync(cfg.bin, [], {
      env: { OLP_HOME: dirs.home, PATH: process.env.PATH, REQUEST_METHOD: 'GET', REQUEST_URI: '/metrics' },
      encoding: 'utf8',
      timeout: 30000,
    });
    fs.rmSync(dirs.root, { recursive: true, force: true });
    assert.notEqual(r.status, 0);
    assert.match(r.stderr, /config\.json: metrics_token: must be at least 32 characters/);
  });
});

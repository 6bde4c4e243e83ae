#!/usr/bin/env node
// load.mjs: the driving side of load.sh (issue 10, "Load"). Node >= 18, no dependencies.
//
// Starts the real stack with the integration harness (tests/integration/harness.mjs:
// lighttpd with lighttpd/olp.conf, its olp-fcgi workers, a private OLP_HOME, 127.0.0.1
// only) and a command provider that streams (tick-emitter), then:
//
//   1. warm-up: a few seconds of both loads below, so that every worker thread, malloc
//      arena and warm sandbox exists before the baseline is taken;
//   2. samples the baseline: per worker process its fds (/proc/PID/fd) and RSS, lighttpd's
//      fds, zombies under lighttpd, scratch dirs in OLP_HOME/run, sandbox processes, and
//      which of these belong to the warm sandboxes waiting for a request (ADR 0008: a
//      worker keeps up to 16, more after a burst, so their share varies with the load);
//   3. wrk -t2 -c64 on GET /health;
//   4. CONNS clients each looping streaming chat completions (stream: true, read to
//      [DONE], every tick line checked) for the same time, and how late this process's
//      own event loop ran (a client starved of CPU measures its own lag, too);
//   5. waits for the workers to go idle, settles, samples again;
//   6. prints a report and exits 1 if any request failed, a worker was restarted, or
//      grew (less what its waiting warm sandboxes hold) in fds, or by more than the
//      threshold in RSS, or lighttpd's fds, the zombies, the scratch dirs or the
//      processes that no waiting warm sandbox accounts for grew; the harness's stop()
//      then checks that nothing of the server outlives it and that no sanitizer spoke.
//
// Environment (load.sh sets the first three):
//   OLP_BIN               olp-fcgi under test (harness)
//   LOAD_EMITTER          the tick-emitter binary
//   LOAD_HEALTH_SECONDS   wrk duration (60)        LOAD_STREAM_SECONDS  streaming (60)
//   LOAD_CONNS            connections/clients (64) LOAD_WARMUP_SECONDS  (5)
//   LOAD_TICKS, LOAD_TICK_MS  lines per answer and the gap between them (20, 50)
//   LOAD_PROCS, LOAD_THREADS  worker processes and threads each (2, 40)
//   LOAD_WARM             1: warm sandboxes on (the default config), 0: off (1)
//   LOAD_RSS_SLACK_KB     allowed RSS growth per worker (16384)
//   LOAD_SETTLE_MS        pause before the last sample (2000)
//   LOAD_KEEPALIVE        1: each streaming client keeps its connection (0: a new one
//                         per request; runStreams says why)
//   LOAD_HEARTBEAT_MS     streaming.heartbeat_interval_ms (unset: the default, 15 s,
//                         which these answers never wait for); below LOAD_TICK_MS,
//                         keep-alives go out between the lines (the clients skip them)
//   LOAD_JSON             also write the figures to this file
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';

import { cmdline, descendants, fdList, startServer, waitFor } from '../integration/harness.mjs';

const env = process.env;
const num = (k, d) => (env[k] === undefined || env[k] === '' ? d : Number(env[k]));
const o = {
  healthSecs: num('LOAD_HEALTH_SECONDS', 60),
  streamSecs: num('LOAD_STREAM_SECONDS', 60),
  warmupSecs: num('LOAD_WARMUP_SECONDS', 5),
  conns: num('LOAD_CONNS', 64),
  ticks: num('LOAD_TICKS', 20),
  tickMs: num('LOAD_TICK_MS', 50),
  procs: num('LOAD_PROCS', 2),
  threads: num('LOAD_THREADS', 40),
  warm: num('LOAD_WARM', 1) !== 0,
  rssSlackKb: num('LOAD_RSS_SLACK_KB', 16384),
  settleMs: num('LOAD_SETTLE_MS', 2000),
  keepAlive: num('LOAD_KEEPALIVE', 0) !== 0,
  heartbeatMs: num('LOAD_HEARTBEAT_MS', -1),
};
const emitter = env.LOAD_EMITTER;
if (!emitter || !env.OLP_BIN) {
  process.stderr.write('load.mjs: OLP_BIN and LOAD_EMITTER must be set (run tests/bench/load.sh)\n');
  process.exit(2);
}
const WARM_MAX = 16; // warm sandboxes per worker (sandbox/spawn.c)
const USERNS_MAX = 256; // cached user namespaces per worker (sandbox/ident.c)
const log = (s) => process.stderr.write(`load: ${s}\n`);

// ---------------------------------------------------------------------------
// Samples

function rssKb(pid) {
  try {
    const m = /^VmRSS:\s+(\d+)/m.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) : NaN;
  } catch {
    return NaN;
  }
}

// Per-run scratch dirs: <runtime_dir>/<pid>-<seq>-<random> (sandbox/scratch.c).
function scratchDirs(srv) {
  try {
    return fs
      .readdirSync(srv.runtimeDir, { withFileTypes: true })
      .filter((e) => e.isDirectory() && /^\d+-\d+-[0-9a-f]+$/.test(e.name))
      .map((e) => e.name)
      .sort();
  } catch (e) {
    if (e.code === 'ENOENT') return [];
    throw e;
  }
}

// A waiting warm sandbox (ADR 0008) is a tree under a worker whose every process is
// bwrap or the stub olp-sandbox-exec waiting for a command: their command lines end in
// ".../olp-sandbox-exec [--run SCRATCH] [--drop N] [--chown DIR]" (the harness's test).
const WARM_RE = /\/olp-sandbox-exec( --(run|drop|chown) \S+)*$/;

// What the waiting warm sandboxes under worker `pid` hold, to tell their share of the
// worker's fds and of the scratch dirs from the rest: the pids, the pipes and sockets
// their processes hold (the worker holds the other ends, or the same socket), their user
// namespaces, their scratch dirs (--run NAME). (Those namespaces are the identity cache's,
// see sample().)
function warmOf(pid) {
  const kids = descendants(pid).map((p) => ({ ...p, cmdline: cmdline(p.pid) }));
  const byParent = new Map();
  for (const k of kids) byParent.set(k.ppid, [...(byParent.get(k.ppid) ?? []), k]);
  const tree = (p) => [p, ...(byParent.get(p.pid) ?? []).flatMap(tree)];
  const w = { sandboxes: 0, pids: new Set(), objs: new Set(), scratch: new Set() };
  for (const top of byParent.get(pid) ?? []) {
    const t = tree(top);
    if (!t.every((p) => WARM_RE.test(p.cmdline))) continue;
    w.sandboxes++;
    for (const p of t) {
      w.pids.add(p.pid);
      for (const f of fdList(p.pid)) {
        const target = f.slice(f.indexOf(' -> ') + 4);
        if (/^(pipe|socket):\[/.test(target)) w.objs.add(target);
      }
      const m = / --run (\S+)/.exec(p.cmdline);
      if (m) w.scratch.add(m[1]);
    }
  }
  return w;
}

// Is the worker's fd `n` (-> target) one of a waiting warm sandbox's?
function isWarmFd(pid, n, target, warm, runtimeDir) {
  if (warm.objs.has(target)) return true;
  if (target === 'anon_inode:[pidfd]') {
    try {
      const m = /^Pid:\s+(\d+)/m.exec(fs.readFileSync(`/proc/${pid}/fdinfo/${n}`, 'utf8'));
      return m !== null && warm.pids.has(Number(m[1]));
    } catch {
      return false;
    }
  }
  if (target.startsWith(runtimeDir + '/')) return warm.scratch.has(target.slice(runtimeDir.length + 1).split('/')[0]);
  return false;
}

function sample(srv) {
  const workers = srv.workerPids().map((pid) => {
    const warm = warmOf(pid);
    const fds = fdList(pid);
    const own = [];
    const userns = [];
    for (const f of fds) {
      const i = f.indexOf(' -> ');
      const target = f.slice(i + 4);
      // The per-run identity keeps one user namespace per uid slot it has used, for the
      // life of the process (sandbox/ident.c, at most 256): their number follows the
      // highest concurrency seen so far, and a namespace is held once.
      if (target.startsWith('user:[')) userns.push(target);
      else if (!isWarmFd(pid, f.slice(0, i), target, warm, srv.runtimeDir)) own.push(f);
    }
    return { pid, fds, own, userns, rssKb: rssKb(pid), warm: warm.sandboxes, warmScratch: [...warm.scratch] };
  });
  const scratch = scratchDirs(srv);
  const warmScratch = new Set(workers.flatMap((w) => w.warmScratch));
  const below = workers.flatMap((w) => descendants(w.pid));
  return {
    workers,
    lighttpdFds: fdList(srv.pid).length,
    zombies: srv.zombies().map((p) => `${p.pid} ${p.comm}`),
    scratch,
    // Scratch dirs no waiting warm sandbox holds: a request's, or left behind.
    orphanScratch: scratch.filter((d) => !warmScratch.has(d)),
    warm: workers.reduce((a, w) => a + w.warm, 0),
    // Everything under the workers, and what is not a waiting warm sandbox (a request's
    // process, or one left behind).
    sandboxProcs: below.length,
    busy: srv.workerChildren().map((p) => `${p.pid} ${p.cmdline}`),
  };
}

function fmtSample(s) {
  const w = s.workers.map(
    (x) =>
      `pid ${x.pid}: fds ${x.fds.length} = ${x.own.length} + ${x.fds.length - x.own.length - x.userns.length} of ` +
      `its ${x.warm} warm sandboxes + ${x.userns.length} cached user namespaces; rss ${(x.rssKb / 1024).toFixed(1)} MiB`,
  );
  return [
    ...w.map((x) => `  worker ${x}`),
    `  lighttpd fds ${s.lighttpdFds}, zombies ${s.zombies.length}, scratch dirs ${s.scratch.length} ` +
      `(${s.orphanScratch.length} not a warm sandbox's), sandbox processes ${s.sandboxProcs} ` +
      `(${s.busy.length} not a warm sandbox's), warm sandboxes ${s.warm}`,
  ].join('\n');
}

// ---------------------------------------------------------------------------
// Loads

function pct(sorted, p) {
  if (!sorted.length) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)];
}

// wrk's duration string ("1.23ms", "456.78us", "1.02s") in ms.
function wrkMs(s) {
  const m = /^([\d.]+)(us|ms|s|m)$/.exec(s ?? '');
  if (!m) return NaN;
  return Number(m[1]) * { us: 0.001, ms: 1, s: 1000, m: 60000 }[m[2]];
}

async function runWrk(srv, secs) {
  const args = ['-t2', `-c${o.conns}`, `-d${secs}s`, '--timeout', '10s', '--latency', srv.url('/health')];
  const child = spawn('wrk', args, { stdio: ['ignore', 'pipe', 'pipe'] });
  const out = [];
  child.stdout.on('data', (d) => out.push(d));
  child.stderr.on('data', (d) => out.push(d));
  const code = await new Promise((resolve) => child.on('close', resolve));
  const text = Buffer.concat(out).toString();
  const m = (re) => re.exec(text)?.slice(1);
  const [requests] = m(/(\d+) requests in/) ?? [];
  const [rps] = m(/Requests\/sec:\s+([\d.]+)/) ?? [];
  const [non2xx] = m(/Non-2xx or 3xx responses: (\d+)/) ?? ['0'];
  const sock = m(/Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)/) ?? ['0', '0', '0', '0'];
  const r = {
    cmd: `wrk ${args.join(' ')}`,
    exit: code,
    requests: Number(requests),
    rps: Number(rps),
    p50: wrkMs(m(/^\s+50%\s+(\S+)/m)?.[0]),
    p99: wrkMs(m(/^\s+99%\s+(\S+)/m)?.[0]),
    non2xx: Number(non2xx),
    socketErrors: sock.map(Number).reduce((a, b) => a + b, 0),
    socketDetail: `connect ${sock[0]}, read ${sock[1]}, write ${sock[2]}, timeout ${sock[3]}`,
    raw: text,
  };
  r.errors = r.non2xx + r.socketErrors + (code === 0 && Number.isFinite(r.requests) ? 0 : 1);
  return r;
}

const expected = Array.from({ length: o.ticks }, (_, i) => `tick ${i + 1}\n`).join('');

// One streaming completion on `agent`: resolves {ok, status, ms, ttfbMs, why}.
function streamOnce(srv, agent) {
  const body = JSON.stringify({ model: 'ticker', stream: true, messages: [{ role: 'user', content: 'go' }] });
  return new Promise((resolve) => {
    const t0 = performance.now();
    let ttfb = NaN;
    let done = false;
    const finish = (r) => {
      if (done) return;
      done = true;
      resolve({ ms: performance.now() - t0, ttfbMs: ttfb, at: new Date().toISOString(), reused: req.reusedSocket, ...r });
    };
    const req = http.request(
      {
        host: '127.0.0.1',
        port: srv.port,
        path: '/v1/chat/completions',
        method: 'POST',
        agent,
        headers: {
          Authorization: `Bearer ${srv.token}`,
          'Content-Type': 'application/json',
          'Content-Length': Buffer.byteLength(body),
        },
      },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (d) => {
          if (Number.isNaN(ttfb)) ttfb = performance.now() - t0;
          text += d;
        });
        res.on('error', (e) => finish({ ok: false, status: res.statusCode, why: `response: ${e.message}` }));
        res.on('aborted', () => finish({ ok: false, status: res.statusCode, why: 'response aborted' }));
        res.on('end', () => {
          if (res.statusCode !== 200)
            return finish({ ok: false, status: res.statusCode, why: `HTTP ${res.statusCode}: ${text.slice(0, 200)}` });
          if (!/data: \[DONE\]\s*$/.test(text)) return finish({ ok: false, status: 200, why: 'no [DONE] at the end' });
          let content = '';
          for (const line of text.split('\n')) {
            if (!line.startsWith('data: {')) continue;
            const ev = JSON.parse(line.slice(6));
            if (ev.error) return finish({ ok: false, status: 200, why: `error event: ${line.slice(0, 200)}` });
            content += ev.choices?.[0]?.delta?.content ?? '';
          }
          if (content !== expected) return finish({ ok: false, status: 200, why: `content ${JSON.stringify(content.slice(0, 80))}…` });
          finish({ ok: true, status: 200 });
        });
      },
    );
    // A stream takes ticks × tick_ms; anything far beyond is a hang.
    req.setTimeout(30000 + o.ticks * o.tickMs, () => req.destroy(new Error('no progress for 30 s')));
    req.on('error', (e) =>
      finish({ ok: false, status: 0, why: `request: ${e.message}`, port: req.socket?.localPort ?? req.socket?._port }),
    );
    req.end(body);
  });
}

// CONNS clients looping until `secs` are up, each on a connection of its own per request
// (LOAD_KEEPALIVE=1: one kept-alive connection per client). Why not keep-alive by
// default: a client starved of CPU for over 5 s (lighttpd's server.max-keep-alive-idle)
// writes its next request into a connection lighttpd is closing as idle, and sees
// "socket hang up". That is the client's lag, not the server's error; on the shared
// 2-core machine (load average 26) Node's event loop stalled that long.
async function runStreams(srv, secs) {
  const end = Date.now() + secs * 1000;
  const results = [];
  const client = async () => {
    const agent = o.keepAlive ? new http.Agent({ keepAlive: true, maxSockets: 1 }) : false;
    while (Date.now() < end) results.push(await streamOnce(srv, agent));
    if (agent) agent.destroy();
  };
  const lag = monitorEventLoopDelay({ resolution: 20 });
  lag.enable();
  const t0 = performance.now();
  await Promise.all(Array.from({ length: o.conns }, client));
  const elapsed = (performance.now() - t0) / 1000;
  lag.disable();
  const ms = results.map((r) => r.ms).sort((a, b) => a - b);
  const ttfb = results.filter((r) => r.ok).map((r) => r.ttfbMs).sort((a, b) => a - b);
  const failed = results.filter((r) => !r.ok);
  const byWhy = {};
  for (const f of failed) {
    const k = `${f.why.replace(/\d+/g, 'N').slice(0, 120)}${f.reused ? ' (on a reused connection)' : ''}`;
    byWhy[k] = (byWhy[k] ?? 0) + 1;
  }
  return {
    // The first few failures as they were, with when they happened.
    firstFailures: failed
      .slice(0, 5)
      .map((f) => `${f.why} (after ${Math.round(f.ms)} ms, at ${f.at}${f.port ? `, client port ${f.port}` : ''})`),
    requests: results.length,
    seconds: elapsed,
    rps: results.length / elapsed,
    p50: pct(ms, 50),
    p99: pct(ms, 99),
    ttfbP50: pct(ttfb, 50),
    ttfbP99: pct(ttfb, 99),
    // How late this process ran its callbacks: a starved client inflates the latencies.
    lagP99: lag.percentile(99) / 1e6,
    lagMax: lag.max / 1e6,
    errors: failed.length,
    non200: failed.filter((r) => r.status && r.status !== 200).length,
    byWhy,
  };
}

// ---------------------------------------------------------------------------

function registry() {
  return {
    providers: {
      ticker: {
        type: 'command',
        argv: [emitter, String(o.ticks), String(o.tickMs)],
        timeout_s: 60,
        network: false,
        models: [{ id: 'ticker' }],
      },
    },
  };
}

function config() {
  return {
    auth: { allow_anonymous: false },
    sandbox: { mode: 'bwrap', warm: o.warm },
    // Every client may stream at once (the default cap is 4).
    providers: { ticker: { max_concurrent: o.conns } },
    ...(o.heartbeatMs >= 0 ? { streaming: { heartbeat_interval_ms: o.heartbeatMs } } : {}),
  };
}

async function main() {
  log(`starting lighttpd + ${o.procs} olp-fcgi workers x ${o.threads} threads; warm sandboxes ${o.warm ? 'on' : 'off'}`);
  const srv = await startServer({
    maxProcs: o.procs,
    threads: o.threads,
    registry: registry(),
    config: config(),
    env: { OLP_LOG_LEVEL: 'warn' },
  });
  const problems = [];
  let report;
  try {
    const cold = sample(srv);
    log(`up on ${srv.baseURL}; warm-up ${o.warmupSecs} s of each load`);
    if (o.warmupSecs > 0) {
      const w = await runWrk(srv, o.warmupSecs);
      const s = await runStreams(srv, o.warmupSecs);
      if (w.errors || s.errors) problems.push(`warm-up: ${w.errors} /health errors, ${s.errors} stream errors ${JSON.stringify(s.byWhy)}`);
    }
    const settle = async () => {
      const busy = await srv.waitIdle(15000);
      if (busy.length) problems.push(`still running 15 s after the load: ${busy.map((p) => p.cmdline).join('; ')}`);
      await sleep(o.settleMs);
    };
    await settle();
    const before = sample(srv);
    log(`baseline:\n${fmtSample(before)}`);

    log(`wrk -t2 -c${o.conns} -d${o.healthSecs}s on /health`);
    const health = await runWrk(srv, o.healthSecs);
    log(`${o.conns} streaming clients for ${o.streamSecs} s (${o.ticks} lines ${o.tickMs} ms apart each)`);
    const streams = await runStreams(srv, o.streamSecs);
    await settle();
    // Teardown (scratch dir removal, warm sandboxes refilled) may trail the answers.
    await waitFor(() => sample(srv).orphanScratch.length <= before.orphanScratch.length && srv.zombies().length === 0, {
      timeoutMs: 10000,
    });
    const after = sample(srv);

    // Verdicts.
    if (health.errors)
      problems.push(`/health: ${health.errors} errors (non-2xx ${health.non2xx}, socket ${health.socketDetail}, wrk exit ${health.exit})`);
    if (streams.errors)
      problems.push(`streams: ${streams.errors} errors: ${JSON.stringify(streams.byWhy)}; first: ${streams.firstFailures.join('; ')}`);
    const bw = before.workers.map((w) => w.pid).join(',');
    const aw = after.workers.map((w) => w.pid).join(',');
    if (bw !== aw) problems.push(`workers changed (a restart?): ${bw} -> ${aw}`);
    for (const b of before.workers) {
      const a = after.workers.find((w) => w.pid === b.pid);
      if (!a) continue;
      // The warm pool's size varies with the load (its fds come and go with it): the
      // worker's other fds must not grow.
      if (a.own.length > b.own.length)
        problems.push(
          `worker ${b.pid}: ${b.own.length} fds (less warm sandboxes') before, ${a.own.length} after; new:\n  ` +
            a.own.filter((f) => !b.own.includes(f)).join('\n  '),
        );
      if (a.rssKb - b.rssKb > o.rssSlackKb)
        problems.push(`worker ${b.pid}: RSS grew ${a.rssKb - b.rssKb} KiB (allowed ${o.rssSlackKb})`);
      if (a.userns.length > USERNS_MAX || new Set(a.userns).size !== a.userns.length)
        problems.push(`worker ${b.pid}: ${a.userns.length} user namespace fds, ${new Set(a.userns).size} distinct (at most ${USERNS_MAX}, each once)`);
      if (a.warm > WARM_MAX) problems.push(`worker ${b.pid}: ${a.warm} warm sandboxes (at most ${WARM_MAX})`);
    }
    if (after.lighttpdFds > before.lighttpdFds) problems.push(`lighttpd: ${before.lighttpdFds} fds before, ${after.lighttpdFds} after`);
    if (after.zombies.length > before.zombies.length) problems.push(`zombies: ${after.zombies.join(', ')}`);
    if (after.orphanScratch.length > before.orphanScratch.length)
      problems.push(
        `scratch dirs no sandbox holds: ${before.orphanScratch.length} before, ${after.orphanScratch.length} after: ` +
          after.orphanScratch.join(', '),
      );
    if (after.busy.length > before.busy.length)
      problems.push(`processes under the workers that are no waiting warm sandbox: ${after.busy.join('; ')}`);

    report = { options: o, cold, before, after, health: { ...health, raw: undefined }, streams };
    const f = (x, d = 1) => (Number.isFinite(x) ? x.toFixed(d) : '?');
    const lines = [
      '',
      `== load report (${o.procs} workers x ${o.threads} threads, warm sandboxes ${o.warm ? 'on' : 'off'}, ${o.conns} connections)`,
      `GET /health: ${health.cmd}`,
      `  requests ${health.requests}, ${f(health.rps)} req/s, latency p50 ${f(health.p50, 2)} ms p99 ${f(health.p99, 2)} ms, ` +
        `errors ${health.errors} (non-2xx ${health.non2xx}; socket ${health.socketDetail})`,
      `streaming completions: ${o.conns} clients x ${o.streamSecs} s, each answer ${o.ticks} lines ${o.tickMs} ms apart${o.heartbeatMs >= 0 ? `, heartbeat_interval_ms ${o.heartbeatMs}` : ''}`,
      `  requests ${streams.requests}, ${f(streams.rps)} req/s, latency p50 ${f(streams.p50, 0)} ms p99 ${f(streams.p99, 0)} ms, ` +
        `first byte p50 ${f(streams.ttfbP50, 0)} ms p99 ${f(streams.ttfbP99, 0)} ms, errors ${streams.errors} (non-200 ${streams.non200})`,
      `  ${o.keepAlive ? 'one kept-alive connection per client' : 'a new connection per request'}; ` +
        `the client's event loop ran late by ${f(streams.lagP99, 0)} ms at p99, ${f(streams.lagMax, 0)} ms at most`,
      'at start:',
      fmtSample(cold),
      'before (after the warm-up):',
      fmtSample(before),
      `after (idle, then ${o.settleMs} ms):`,
      fmtSample(after),
      `RSS growth allowed per worker: ${o.rssSlackKb} KiB`,
    ];
    process.stdout.write(lines.join('\n') + '\n');
    // Machine-readable lines, as the other benches print them.
    process.stdout.write(
      [
        `load_health_requests ${health.requests}`,
        `load_health_rps ${f(health.rps)}`,
        `load_health_p50_ms ${f(health.p50, 2)}`,
        `load_health_p99_ms ${f(health.p99, 2)}`,
        `load_health_errors ${health.errors}`,
        `load_stream_requests ${streams.requests}`,
        `load_stream_rps ${f(streams.rps)}`,
        `load_stream_p50_ms ${f(streams.p50, 0)}`,
        `load_stream_p99_ms ${f(streams.p99, 0)}`,
        `load_stream_errors ${streams.errors}`,
      ].join('\n') + '\n',
    );
  } catch (e) {
    problems.push(`load.mjs: ${e.stack ?? e}`);
  } finally {
    try {
      await srv.stop();
    } catch (e) {
      problems.push(`stopping the server: ${e.message}`);
    }
  }
  if (env.LOAD_JSON && report) fs.writeFileSync(env.LOAD_JSON, JSON.stringify({ ...report, problems }, null, 2));
  if (problems.length) {
    process.stdout.write(`\nload: FAIL\n- ${problems.join('\n- ')}\n`);
    process.exit(1);
  }
  process.stdout.write('\nload: PASS (0 errors; fds, zombies, scratch dirs and sandbox processes unchanged)\n');
}

await main();

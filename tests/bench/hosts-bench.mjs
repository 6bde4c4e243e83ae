// hosts-bench.mjs: the embedded store against the shared PostgreSQL store (ADR 0034), in
// one run, rounds interleaved so that machine noise hits both alike. Run by
// hosts-bench.sh under tests/pg/with-pg.sh (OLP_TEST_PG_URL...), with OLP_BIN, OLP_KEYS.
//
//   E: one host (lighttpd + 2 olp-fcgi) on its embedded store (key files, SQLite)
//   P: two such hosts on one PostgreSQL, HAProxy in front (tests/integration/hosts.mjs)
//
// 1. GET /health with a stored guest key, wrk -c CONNS: requests/s of E and of P's host a.
// 2. The same at one connection (wrk -c1 --latency): the median latency; P - E is what a
//    stored key's check costs more (the goal: at most 0.3 ms).
// 3. A chat completion at one connection with a requests_per_day key against one without,
//    alternating, on E and on P's host a: the median difference is what the quota check
//    costs (the goal on P: at most 1 ms).
// 4. 64 concurrent clients through the balancer over both hosts, a key with
//    requests_per_day Q, 6 Q requests in all: served must be exactly Q (overshoot 0).

import { spawnSync } from 'node:child_process';
import http from 'node:http';

import { commandProvider, makeHome, startServer, testConfig } from '../integration/harness.mjs';
import { olpKeysRun, startHosts } from '../integration/hosts.mjs';

const secs = Number(process.env.BENCH_SECONDS ?? 5);
const rounds = Number(process.env.BENCH_ROUNDS ?? 3);
const conns = Number(process.env.BENCH_CONNS ?? 16);
const chats = Number(process.env.BENCH_CHATS ?? 100);
const quota = Number(process.env.BENCH_QUOTA ?? 100);
const clients = Number(process.env.BENCH_CLIENTS ?? 64);
const threads = Number(process.env.BENCH_THREADS ?? 8);

const registry = {
  providers: { instant: commandProvider('instant', ['/usr/bin/printf', 'ok'], { max_concurrent: 256, timeout_s: 30 }) },
};

function keygen(home, ...args) {
  const r = olpKeysRun(home, ['keygen', ...args]);
  if (r.status !== 0) throw new Error(`olp-keys keygen: ${r.stderr}`);
  return r.json.token;
}

// wrk on url with a bearer token: {rps, p50ms}; throws on any non-2xx answer.
function wrk(url, token, c) {
  const r = spawnSync(
    'wrk',
    ['-t1', `-c${c}`, `-d${secs}s`, '--latency', '-H', `Authorization: Bearer ${token}`, url],
    { encoding: 'utf8' },
  );
  if (r.status !== 0) throw new Error(`wrk: ${r.stderr}`);
  if (/Non-2xx/.test(r.stdout)) throw new Error(`non-2xx answers:\n${r.stdout}`);
  const rps = Number(/Requests\/sec:\s+([\d.]+)/.exec(r.stdout)[1]);
  const m = /^\s+50%\s+([\d.]+)(us|ms|s)$/m.exec(r.stdout);
  const p50ms = Number(m[1]) * { us: 0.001, ms: 1, s: 1000 }[m[2]];
  return { rps, p50ms };
}

const median = (v) => {
  const s = [...v].sort((x, y) => x - y);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

// POST a chat completion on a connection of its own (a kept-alive one may be closed by the
// server just as it is reused): {status, ms, text, host}.
function chat(url, token) {
  const body = JSON.stringify({ model: 'instant', messages: [{ role: 'user', content: 'hi' }] });
  const t0 = performance.now();
  return new Promise((resolve, reject) => {
    const req = http.request(
      url,
      {
        method: 'POST',
        agent: false,
        headers: { Authorization: `Bearer ${token}`, 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body) },
      },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (d) => (text += d));
        res.on('end', () =>
          resolve({ status: res.statusCode, ms: performance.now() - t0, text, host: res.headers['x-olp-host'] }),
        );
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    req.end(body);
  });
}

// Alternating chats with the quota key and the free key: medians and their difference.
async function quotaCost(base, quotaTok, freeTok) {
  const q = [];
  const f = [];
  for (let i = 0; i < chats; i++) {
    for (const [tok, into] of i % 2 ? [[quotaTok, q], [freeTok, f]] : [[freeTok, f], [quotaTok, q]]) {
      const r = await chat(`${base}/v1/chat/completions`, tok);
      if (r.status !== 200) throw new Error(`chat: ${r.status} ${r.text}`);
      into.push(r.ms);
    }
  }
  return { quota: median(q), free: median(f) };
}

const fmt = (x, d = 2) => x.toFixed(d);

const git = spawnSync('git', ['rev-parse', '--short', 'HEAD'], { encoding: 'utf8' }).stdout.trim() || 'unknown';
const load = () => (spawnSync('cat', ['/proc/loadavg'], { encoding: 'utf8' }).stdout.split(' ').slice(0, 3).join(' '));
const emb = await startServer({ dirs: makeHome({ registry, config: testConfig() }), maxProcs: 2, threads });
let pg;
try {
  pg = await startHosts({ n: 2, registry, maxProcs: 2, threads });
  const [a] = pg.hosts;
  const tok = {
    e: keygen(emb.home, '--name=bench'),
    p: keygen(a.home, '--name=bench'),
    eq: keygen(emb.home, '--name=bench quota', '--quota-rpd=1000000000'),
    pq: keygen(a.home, '--name=bench quota', '--quota-rpd=1000000000'),
  };
  const pgv = spawnSync('sh', ['-c', 'ls /usr/lib/postgresql | sort -V | tail -1'], { encoding: 'utf8' }).stdout.trim();
  console.log(`# hosts-bench: ${git}, PostgreSQL ${pgv} on this machine, 2 olp-fcgi x ${threads} threads per host; load before: ${load()}`);

  console.log(`== GET /health with a stored guest key, wrk -t1 -c${conns} -d${secs}s, ${rounds} alternating rounds`);
  const re = [];
  const rp = [];
  for (let i = 1; i <= rounds; i++) {
    const e = wrk(emb.url('/health'), tok.e, conns);
    const p = wrk(a.url('/health'), tok.p, conns);
    console.log(`round ${i}: embedded ${fmt(e.rps)} req/s, postgresql ${fmt(p.rps)} req/s`);
    re.push(e.rps);
    rp.push(p.rps);
  }
  console.log(`health_rps_embedded ${fmt(median(re))}`);
  console.log(`health_rps_postgresql ${fmt(median(rp))}`);
  console.log(`postgresql_over_embedded ${fmt(median(rp) / median(re))}`);

  console.log(`== the same at one connection (wrk -c1 --latency), ${rounds} alternating rounds: median latency`);
  const le = [];
  const lp = [];
  for (let i = 1; i <= rounds; i++) {
    const e = wrk(emb.url('/health'), tok.e, 1);
    const p = wrk(a.url('/health'), tok.p, 1);
    console.log(`round ${i}: embedded p50 ${fmt(e.p50ms, 3)} ms, postgresql p50 ${fmt(p.p50ms, 3)} ms`);
    le.push(e.p50ms);
    lp.push(p.p50ms);
  }
  console.log(`key_check_added_ms ${fmt(median(lp) - median(le), 3)} (goal: <= 0.3)`);

  console.log(`== a chat completion, quota key vs free key alternating, ${chats} each, one at a time`);
  const qe = await quotaCost(emb.url(''), tok.eq, tok.e);
  const qp = await quotaCost(a.url(''), tok.pq, tok.p);
  console.log(`embedded: free ${fmt(qe.free)} ms, quota ${fmt(qe.quota)} ms median`);
  console.log(`postgresql: free ${fmt(qp.free)} ms, quota ${fmt(qp.quota)} ms median`);
  console.log(`quota_check_ms_embedded ${fmt(qe.quota - qe.free, 3)}`);
  console.log(`quota_check_ms_postgresql ${fmt(qp.quota - qp.free, 3)} (goal: <= 1)`);

  const total = 6 * quota;
  console.log(`== ${clients} concurrent clients through HAProxy over 2 hosts, requests_per_day ${quota}, ${total} requests`);
  const qtok = keygen(a.home, '--name=bench overshoot', `--quota-rpd=${quota}`);
  let sent = 0;
  const count = { served: 0, refused: 0, other: 0 };
  const hosts = {};
  const others = [];
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: clients }, async () => {
      while (sent < total) {
        sent++;
        const r = await chat(pg.lb.url('/v1/chat/completions'), qtok);
        const text = r.text;
        const h = r.host;
        hosts[h] = (hosts[h] ?? 0) + 1;
        if (r.status === 200) count.served++;
        else if (r.status === 429 && text.includes('quota_exceeded')) count.refused++;
        else {
          count.other++;
          if (others.length < 5) others.push(`${r.status} ${text.slice(0, 200)}`);
        }
      }
    }),
  );
  const secsTaken = (performance.now() - t0) / 1000;
  console.log(
    `served ${count.served}, refused ${count.refused} (429 quota_exceeded), other ${count.other}; ` +
      `by host ${JSON.stringify(hosts)}; ${fmt(total / secsTaken, 0)} req/s`,
  );
  for (const o of others) console.log(`other: ${o}`);
  const overshoot = Math.max(0, count.served - quota);
  console.log(`overshoot ${overshoot} (must be 0)`);
  console.log(`undershoot ${Math.max(0, quota - count.served)} (must be 0)`);
  console.log(`# load after: ${load()}`);
  if (overshoot || count.served !== quota || count.other) process.exitCode = 1;
} finally {
  await pg?.stop();
  await emb.stop();
}

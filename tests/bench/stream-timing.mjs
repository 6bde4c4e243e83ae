#!/usr/bin/env node
// stream-timing.mjs: the measuring side of stream-bench.sh (Node >= 18, no dependencies).
//
// Runs the same provider command RUNS times bare (spawned here, its stdout lines
// timestamped) and RUNS times through the server (a streaming chat completion, each SSE
// delta timestamped), alternating, and prints time to first byte and the gaps between
// chunks for both, and their differences.
//
//   node stream-timing.mjs URL TOKEN MODEL RUNS -- CMD [ARGS…]
import { spawn } from 'node:child_process';
import http from 'node:http';

const [url, token, model, runsArg, dashdash, ...cmd] = process.argv.slice(2);
if (!url || dashdash !== '--' || !cmd.length) {
  process.stderr.write('usage: stream-timing.mjs URL TOKEN MODEL RUNS -- CMD [ARGS...]\n');
  process.exit(2);
}
const runs = Number(runsArg) || 5;

// Arrival times (ms after t0) of each "tick" line of the bare command.
function bare() {
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    const child = spawn(cmd[0], cmd.slice(1), { stdio: ['pipe', 'pipe', 'inherit'] });
    const times = [];
    let rest = '';
    child.stdout.setEncoding('utf8');
    child.stdout.on('data', (d) => {
      const t = performance.now() - t0;
      rest += d;
      const lines = rest.split('\n');
      rest = lines.pop();
      for (const l of lines) if (l.startsWith('tick')) times.push(t);
    });
    child.on('error', reject);
    child.on('close', () => resolve(times));
    child.stdin.end('Say hello');
  });
}

// Arrival times (ms after the request was sent) of each delta carrying a "tick".
function viaHttp() {
  const payload = JSON.stringify({ model, stream: true, messages: [{ role: 'user', content: 'Say hello' }] });
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    const req = http.request(url, { method: 'POST', agent: false, headers: {
      Authorization: `Bearer ${token}`, 'Content-Type': 'application/json',
      'Content-Length': Buffer.byteLength(payload) } }, (res) => {
      if (res.statusCode !== 200) reject(new Error(`HTTP ${res.statusCode}`));
      const times = [];
      let rest = '';
      res.setEncoding('utf8');
      res.on('data', (d) => {
        const t = performance.now() - t0;
        rest += d;
        const evs = rest.split('\n\n');
        rest = evs.pop();
        for (const e of evs) {
          if (!e.startsWith('data: {')) continue;
          const c = JSON.parse(e.slice(6)).choices?.[0]?.delta?.content ?? '';
          for (const _ of c.matchAll(/tick/g)) times.push(t);
        }
      });
      res.on('end', () => resolve(times));
    });
    req.on('error', reject);
    req.end(payload);
  });
}

const gaps = (ts) => ts.slice(1).map((t, i) => t - ts[i]);
const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const f = (x) => x.toFixed(2);

const firstB = [], firstH = [], gapDiffs = [], gapsB = [], gapsH = [];
await viaHttp(); // warm-up: the workers' first request pays one-time costs
for (let r = 0; r < runs; r++) {
  const b = await bare();
  const h = await viaHttp();
  if (b.length !== h.length || !b.length) throw new Error(`run ${r}: ${b.length} bare lines, ${h.length} deltas`);
  const gb = gaps(b), gh = gaps(h);
  firstB.push(b[0]);
  firstH.push(h[0]);
  gapsB.push(...gb);
  gapsH.push(...gh);
  for (let i = 0; i < gb.length; i++) gapDiffs.push(gh[i] - gb[i]);
  console.log(`run ${r + 1}: first byte bare ${f(b[0])} ms, via HTTP ${f(h[0])} ms; ` +
    `gaps bare ${f(Math.min(...gb))}..${f(Math.max(...gb))} ms, via HTTP ${f(Math.min(...gh))}..${f(Math.max(...gh))} ms`);
}
const absDiffs = gapDiffs.map(Math.abs).sort((a, b) => a - b);
const p = (q) => absDiffs[Math.min(absDiffs.length - 1, Math.floor(q * absDiffs.length))];
console.log(`ttfb_bare_median_ms ${f(median(firstB))}`);
console.log(`ttfb_http_median_ms ${f(median(firstH))}`);
console.log(`ttfb_diff_median_ms ${f(median(firstH) - median(firstB))} (goal <= 5)`);
console.log(`gap_bare_median_ms ${f(median(gapsB))}`);
console.log(`gap_http_median_ms ${f(median(gapsH))}`);
console.log(`gap_diff_abs_median_ms ${f(median(absDiffs))}`);
console.log(`gap_diff_abs_p95_ms ${f(p(0.95))}`);
console.log(`gap_diff_abs_max_ms ${f(absDiffs.at(-1))} (goal <= 2; ${absDiffs.length} gaps)`);
console.log(`gaps_within_2ms ${absDiffs.filter((d) => d <= 2).length}/${absDiffs.length}`);

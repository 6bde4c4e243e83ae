#!/usr/bin/env node
// prestart-bench.mjs: the measuring side of prestart-bench.sh (see there). Starts the fake
// upstreams, a lighttpd with olp-fcgi (one worker process, so that a request finds the
// process its predecessor left), and interleaves, one request every PACE ms:
//   direct claude (stream-json, first text delta) | OLP stream (first content byte, hit)
//   direct claude (json, to exit)                 | OLP non-stream (whole answer, hit)
//   OLP miss (a max_tokens not seen before)       | OLP cold (provider with prestart 0)
// then codex the same way (first answer byte), and the idle processes' memory.
//
//   node prestart-bench.mjs SOURCE_DIR BUILD_DIR
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

import { startUpstream } from '../upstream/procs.mjs';

const [root, build] = process.argv.slice(2);
const runs = Number(process.env.BENCH_RUNS ?? 7);
const pace = Number(process.env.BENCH_PACE_MS ?? 1000);
const withCodex = process.env.BENCH_CODEX !== '0';
const pcli = path.join(root, 'tests/provider-clis/node_modules');
const claudeBin = path.join(pcli, '@anthropic-ai/claude-code/bin/claude.exe');
const codexJs = path.join(pcli, '@openai/codex/bin/codex.js');
const children = new Set();
const work = fs.mkdtempSync(path.join(os.tmpdir(), 'olp-prestart-bench-'));
fs.chmodSync(work, 0o700);
const token = 'bench-owner-' + Math.random().toString(36).slice(2);

function cleanup() {
  for (const c of children) c.kill('SIGTERM');
}
process.on('exit', cleanup);
process.on('SIGINT', () => process.exit(130));

const freePort = () =>
  new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });

const median = (a) => {
  const s = [...a].sort((x, y) => x - y);
  return s.length ? (s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2) : NaN;
};
const fmt = (a) => `median ${median(a).toFixed(0)} ms  [${a.map((x) => x.toFixed(0)).join(' ')}]`;

// A command run directly: ms to the first stdout line matching re (or to its exit).
function direct(argv, env, re) {
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    const c = spawn(argv[0], argv.slice(1), { env, stdio: ['ignore', 'pipe', 'ignore'] });
    children.add(c);
    let first = null;
    let rest = '';
    c.stdout.setEncoding('utf8');
    c.stdout.on('data', (d) => {
      rest += d;
      if (re && first === null && re.test(rest)) first = performance.now() - t0;
    });
    c.on('error', reject);
    c.on('close', (code) => {
      children.delete(c);
      if (code !== 0) return reject(new Error(`${argv[0]} exited ${code}`));
      resolve(re ? first : performance.now() - t0);
    });
  });
}

// One chat completion through OLP: {first (ms to the first content byte, stream), total,
// prestart (the X-OLP-Prestart header)}.
function viaOlp(port, model, { stream = false, maxTokens } = {}) {
  const body = JSON.stringify({
    model,
    stream,
    ...(maxTokens ? { max_tokens: maxTokens } : {}),
    messages: [{ role: 'user', content: 'Say hello' }],
  });
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    const req = http.request(
      { host: '127.0.0.1', port, path: '/v1/chat/completions', method: 'POST', agent: false,
        headers: { Authorization: `Bearer ${token}`, 'Content-Type': 'application/json',
          'Content-Length': Buffer.byteLength(body) } },
      (res) => {
        let first = null;
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (d) => {
          text += d;
          if (first === null && (!stream || /"content":"[^"]/.test(text))) first = performance.now() - t0;
        });
        res.on('end', () => {
          if (res.statusCode !== 200) return reject(new Error(`HTTP ${res.statusCode}: ${text.slice(0, 300)}`));
          resolve({ first, total: performance.now() - t0, prestart: res.headers['x-olp-prestart'] });
        });
      },
    );
    req.on('error', reject);
    req.end(body);
  });
}

// RSS and PSS (kB) of each idle pre-started CLI's process tree: the processes below a
// sandbox's init whose command line names the CLI and which wait with stream-json input.
function idleMemory(needle) {
  const procs = [];
  for (const d of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const cmd = fs.readFileSync(`/proc/${d}/cmdline`, 'utf8').split('\0').join(' ');
      const stat = fs.readFileSync(`/proc/${d}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      procs.push({ pid: Number(d), ppid, cmd });
    } catch { /* gone */ }
  }
  const kids = (pid) => procs.filter((p) => p.ppid === pid);
  const tree = (pid) => [pid, ...kids(pid).flatMap((k) => tree(k.pid))];
  const roots = procs.filter((p) => p.cmd.includes(needle) && !procs.find((q) => q.pid === p.ppid && q.cmd.includes(needle)));
  return roots.map((r) => {
    let rss = 0;
    let pss = 0;
    for (const pid of tree(r.pid)) {
      try {
        const s = fs.readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8');
        rss += Number(/^Rss:\s+(\d+)/m.exec(s)?.[1] ?? 0);
        pss += Number(/^Pss:\s+(\d+)/m.exec(s)?.[1] ?? 0);
      } catch { /* gone */ }
    }
    return { pid: r.pid, procs: tree(r.pid).length, rss, pss };
  });
}

async function main() {
  const anthropic = await startUpstream('fake-anthropic.mjs', {}, children);
  const openai = withCodex ? await startUpstream('fake-openai.mjs', {}, children) : null;
  const home = path.join(work, 'home');
  const runDir = path.join(work, 'lighttpd');
  fs.mkdirSync(home, { mode: 0o700 });
  fs.mkdirSync(runDir, { mode: 0o700 });
  const claude = (prestart) => ({
    type: 'claude', bin: claudeBin, timeout_s: 60, credentials: [], prestart,
    network: { upstream: anthropic.url },
    env: { ANTHROPIC_API_KEY: 'sk-ant-fake-key' },
  });
  const toml = path.join(work, 'codex-config.toml');
  if (openai)
    fs.writeFileSync(toml, ['[analytics]', 'enabled = false', '', '[features]', 'plugins = false', ''].join('\n'));
  const codex = (prestart) => ({
    type: 'codex', bin: codexJs, timeout_s: 60, credentials: [], prestart, config_toml: toml,
    network: { upstream: `${openai.url}/v1` }, env: { OPENAI_API_KEY: 'sk-fake-key' },
  });
  const providers = {
    anthropic: { ...claude(1), models: [{ id: 'claude-fake' }] },
    'anthropic-cold': { ...claude(0), models: [{ id: 'claude-fake-cold' }] },
  };
  if (openai) {
    providers.openai = { ...codex(1), models: [{ id: 'gpt-fake' }] };
    providers['openai-cold'] = { ...codex(0), models: [{ id: 'gpt-fake-cold' }] };
  }
  fs.writeFileSync(path.join(home, 'models-registry.json'), JSON.stringify({ providers }));
  // Room for every miss's key (each leaves one waiting) without putting the hit key's down.
  fs.writeFileSync(path.join(home, 'config.json'), JSON.stringify({
    auth: { allow_anonymous: false },
    sandbox: { mode: 'bwrap', warm: true, prestart_max: runs + 4, prestart_per_key: runs + 4, prestart_idle_s: 600 },
  }));
  const port = await freePort();
  const lt = spawn('lighttpd', ['-D', '-f', path.join(root, 'lighttpd/olp.conf')], {
    stdio: ['ignore', 'ignore', 'inherit'],
    env: { ...process.env, OLP_BIN: path.join(build, 'fcgi/olp-fcgi'), OLP_HOME: home, OLP_RUN_DIR: runDir,
      OLP_PORT: String(port), OLP_MAX_PROCS: '1', OLP_THREADS: '4', OLP_OWNER_TOKEN: token, OLP_LOG_LEVEL: 'warn' },
  });
  children.add(lt);
  for (let i = 0; i < 100; i++) {
    try {
      const r = await fetch(`http://127.0.0.1:${port}/health`);
      if (r.ok) break;
    } catch { /* not yet */ }
    await sleep(100);
  }

  const dhome = path.join(work, 'direct-home');
  fs.mkdirSync(dhome, { mode: 0o700 });
  const denv = { PATH: process.env.PATH, HOME: dhome, ANTHROPIC_BASE_URL: anthropic.url,
    ANTHROPIC_API_KEY: 'sk-ant-fake-key', CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1', DISABLE_AUTOUPDATER: '1' };
  const dargs = (fmtArg) => [claudeBin, '-p', 'Say hello', '--output-format', fmtArg,
    ...(fmtArg === 'stream-json' ? ['--verbose', '--include-partial-messages'] : []),
    '--no-session-persistence', '--model', 'claude-fake', '--tools', ''];
  const r = { dStream: [], oStream: [], dRound: [], oRound: [], miss: [], cold: [], hdr: [] };
  // Warm-up: one request leaves the first pre-started process; the CLIs' files are cached.
  await viaOlp(port, 'claude-fake', { stream: true });
  await viaOlp(port, 'claude-fake-cold');
  await direct(dargs('json'), denv, null);
  await sleep(2 * pace);
  for (let i = 0; i < runs; i++) {
    r.dStream.push(await direct(dargs('stream-json'), denv, /"text_delta"/));
    await sleep(pace);
    const s = await viaOlp(port, 'claude-fake', { stream: true });
    r.oStream.push(s.first);
    r.hdr.push(s.prestart);
    await sleep(pace);
    r.dRound.push(await direct(dargs('json'), denv, null));
    await sleep(pace);
    const n = await viaOlp(port, 'claude-fake');
    r.oRound.push(n.total);
    r.hdr.push(n.prestart);
    await sleep(pace);
    const m = await viaOlp(port, 'claude-fake', { stream: true, maxTokens: 1000 + i });
    r.miss.push(m.first);
    r.hdr.push(m.prestart);
    await sleep(pace);
    r.cold.push((await viaOlp(port, 'claude-fake-cold', { stream: true })).first);
    await sleep(pace);
  }
  const mem = idleMemory('claude.exe');
  console.log(`claude ${runs} interleaved runs, one request every ${pace} ms (headers: ${r.hdr.join(',')})`);
  console.log(`  direct, first text delta          ${fmt(r.dStream)}`);
  console.log(`  OLP hit, first content byte       ${fmt(r.oStream)}`);
  console.log(`    ratio of medians: ${(median(r.oStream) / median(r.dStream)).toFixed(2)}x (goal <= 0.5x)`);
  console.log(`  direct, round trip (json, exit)   ${fmt(r.dRound)}`);
  console.log(`  OLP hit, non-streaming round trip ${fmt(r.oRound)}`);
  console.log(`    difference of medians: ${(median(r.oRound) - median(r.dRound)).toFixed(0)} ms (goal <= +10 ms)`);
  console.log(`  OLP miss (new max_tokens), first content byte ${fmt(r.miss)}`);
  console.log(`  OLP cold (prestart 0), first content byte     ${fmt(r.cold)}`);
  console.log(`  idle pre-started claude process trees (kB): ${JSON.stringify(mem)}`);

  if (openai) {
    const cenv = { PATH: process.env.PATH, HOME: dhome, CODEX_HOME: path.join(work, 'codex-home'),
      OPENAI_API_KEY: 'sk-fake-key' };
    fs.mkdirSync(cenv.CODEX_HOME, { mode: 0o700 });
    fs.writeFileSync(path.join(cenv.CODEX_HOME, 'config.toml'), [
      'model_provider = "fake"', '', '[model_providers.fake]', 'name = "fake"', `base_url = "${openai.url}/v1"`,
      'wire_api = "responses"', 'env_key = "OPENAI_API_KEY"', '', '[analytics]', 'enabled = false', ''].join('\n'));
    const cargs = [process.execPath, codexJs, 'exec', '--json', '--skip-git-repo-check', '--ephemeral',
      '--model', 'gpt-fake', 'Say hello'];
    const c = { direct: [], hit: [], cold: [], hdr: [] };
    await viaOlp(port, 'gpt-fake', { stream: true });
    await direct(cargs, cenv, /agent_message/);
    await sleep(2 * pace);
    for (let i = 0; i < runs; i++) {
      c.direct.push(await direct(cargs, cenv, /agent_message/));
      await sleep(pace);
      const h = await viaOlp(port, 'gpt-fake', { stream: true });
      c.hit.push(h.first);
      c.hdr.push(h.prestart);
      await sleep(pace);
      c.cold.push((await viaOlp(port, 'gpt-fake-cold', { stream: true })).first);
      await sleep(pace);
    }
    console.log(`codex ${runs} interleaved runs (headers: ${c.hdr.join(',')})`);
    console.log(`  direct, first agent message       ${fmt(c.direct)}`);
    console.log(`  OLP hit, first content byte       ${fmt(c.hit)}`);
    console.log(`  OLP cold (prestart 0), first byte ${fmt(c.cold)}`);
    console.log(`  idle pre-started codex process trees (kB): ${JSON.stringify(idleMemory('codex'))}`);
  }
}

// Stop everything, give the workers a moment to put their sandboxes down, remove the dir.
async function finish(code) {
  cleanup();
  await sleep(2000);
  fs.rmSync(work, { recursive: true, force: true });
  process.exit(code);
}

main()
  .then(() => finish(0))
  .catch((e) => {
    console.error(e);
    return finish(1);
  });

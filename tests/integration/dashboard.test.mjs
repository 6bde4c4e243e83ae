// GET /dashboard (issue 14) in a real browser: headless Chromium loads the page from a real
// lighttpd + olp-fcgi after some requests were made, and the DOM it built shows what
// GET /v1/usage reports (requests and tokens per key, key names, kept as text even when
// they look like markup); its headers are strict (CSP by hash, no referrer, no cache);
// without a token, or with a wrong one, the page shows the token form and no data. A
// screenshot is written into the test's output dir (OLP_IT_OUT).
//
// Chromium runs as the test's user; as root it needs --no-sandbox (its own sandbox, not
// OLP's). deploy/olp-local test installs it (TEST_PKGS).

import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';

import { chatBody, curl, makeHome, olpKeys, startServer, testConfig } from './harness.mjs';
import { meteredRegistry } from './metered.mjs';

function findChromium() {
  for (const name of ['chromium', 'chromium-browser', 'google-chrome']) {
    const r = spawnSync('sh', ['-c', `command -v ${name}`], { encoding: 'utf8' });
    if (r.status === 0 && r.stdout.trim()) return r.stdout.trim();
  }
  throw new Error('chromium is not installed (deploy/olp-local test installs it: TEST_PKGS)');
}

const outDir = process.env.OLP_IT_OUT ?? fs.mkdtempSync(path.join(os.tmpdir(), 'olp-dashboard-'));

// One headless Chromium run on url; extra: --dump-dom or --screenshot=…. A fresh profile
// each time: nothing (sessionStorage included) carries over between runs. Virtual time
// lets the page's fetches finish before the DOM is dumped, however slow the machine.
async function chromium(url, extra) {
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'olp-chromium-'));
  const args = [
    '--headless=new',
    '--disable-gpu',
    '--no-first-run',
    '--no-default-browser-check',
    '--disable-extensions',
    '--disable-background-networking',
    `--user-data-dir=${profile}`,
    '--window-size=1280,1400',
    '--virtual-time-budget=20000',
    ...(process.getuid() === 0 ? ['--no-sandbox'] : []),
    ...extra,
    url,
  ];
  try {
    const child = spawn(findChromium(), args, { stdio: ['ignore', 'pipe', 'pipe'] });
    const out = [];
    const err = [];
    child.stdout.on('data', (d) => out.push(d));
    child.stderr.on('data', (d) => err.push(d));
    const timer = setTimeout(() => child.kill('SIGKILL'), 120000);
    const code = await new Promise((resolve) => child.on('close', resolve));
    clearTimeout(timer);
    const stderr = Buffer.concat(err).toString();
    assert.equal(code, 0, `chromium exited ${code}: ${stderr.slice(-2000)}`);
    return { dom: Buffer.concat(out).toString('utf8'), stderr };
  } finally {
    fs.rmSync(profile, { recursive: true, force: true });
  }
}

// The text of the element with attribute attr="value" in the dumped DOM (tags dropped).
function rowOf(dom, attr, value) {
  const i = dom.indexOf(`<tr ${attr}="${value}"`);
  if (i < 0) return null;
  return dom.slice(i, dom.indexOf('</tr>', i) + 5);
}
const cell = (row, f) => {
  const m = new RegExp(`data-f="${f}">([^<]*)<`).exec(row);
  return m ? m[1] : null;
};
const num = (s) => Number(String(s).replace(/,/g, ''));

describe('GET /dashboard', () => {
  let server;
  let keys;
  const evilName = '<img src=x id=injected> & "quotes"';

  before(async () => {
    // Two accounts of the metered provider (ADR 0037): bob's key bound to bob, the other
    // key on whichever it is given, the owner's requests on the echo provider's one.
    const config = { ...testConfig(), providers: { metered: { accounts: { alice: {}, bob: {} } } } };
    const dirs = makeHome({ registry: meteredRegistry(), config });
    const a = olpKeys(dirs.home, 'keygen', `--name=${evilName}`);
    const b = olpKeys(dirs.home, 'keygen', '--name=bob', '--account=metered=bob');
    keys = { a, b };
    server = await startServer({ dirs, maxProcs: 1, threads: 4 });
    const chat = (token, model) =>
      curl(server, { method: 'POST', path: '/v1/chat/completions', auth: `Bearer ${token}`, body: chatBody(model) });
    for (const r of await Promise.all([chat(a.token, 'metered'), chat(a.token, 'metered'), chat(b.token, 'metered'), chat(b.token, 'no-such')]))
      assert.ok([200, 404].includes(r.status), r.text);
    assert.equal((await chat(server.token, 'echo')).status, 200);
  });
  after(async () => {
    await server?.stop();
  });

  it('is served with strict headers, its script and style allowed by their hash alone', async () => {
    const r = await curl(server, { path: '/dashboard', auth: false });
    assert.equal(r.status, 200);
    assert.match(r.headers['content-type'], /^text\/html/);
    assert.equal(r.headers['cache-control'], 'no-store');
    assert.equal(r.headers['referrer-policy'], 'no-referrer');
    assert.equal(r.headers['x-content-type-options'], 'nosniff');
    const csp = r.headers['content-security-policy'];
    assert.match(csp, /default-src 'none'/);
    assert.match(csp, /connect-src 'self'/);
    assert.match(csp, /frame-ancestors 'none'/);
    assert.ok(!csp.includes('unsafe-inline') && !csp.includes('unsafe-eval'), csp);
    const hash = (open, close) => {
      const s = r.text.indexOf(`\n${open}`) + open.length + 1;
      return createHash('sha256').update(r.text.slice(s, r.text.indexOf(close, s))).digest('base64');
    };
    assert.ok(csp.includes(`script-src 'sha256-${hash('<script>', '</script>')}'`), csp);
    assert.ok(csp.includes(`style-src 'sha256-${hash('<style>', '</style>')}'`), csp);
    // One file, nothing from elsewhere.
    assert.ok(!/<script[^>]+src=|<link[^>]+href=|https?:\/\//.test(r.text.replace(/http:\/\/www\.w3\.org\/2000\/svg/g, '')));
    assert.ok(!/innerHTML|outerHTML|insertAdjacentHTML|document\.write|localStorage|document\.cookie/.test(r.text));
  });

  it('with #token=OWNER shows the ledger\'s numbers per key and the providers; writes a screenshot', async () => {
    const u = await curl(server, { path: '/v1/usage', auth: true });
    assert.equal(u.status, 200);
    const url = server.url(`/dashboard#token=${encodeURIComponent(server.token)}`);
    const { dom } = await chromium(url, ['--dump-dom']);
    assert.match(dom, /<body data-state="loaded"/, dom.slice(0, 3000));
    for (const k of u.json.keys) {
      const row = rowOf(dom, 'data-key', k.key_id);
      assert.ok(row, `no row for key ${k.key_id}`);
      assert.equal(num(cell(row, 'requests')), k.totals.requests, row);
      assert.equal(num(cell(row, 'tokens')), k.totals.total_tokens, row);
      assert.equal(num(cell(row, 'errors')), k.totals.errors, row);
      // The per-day table: a row per day, provider and account (ADR 0037).
      const dayRows = dom.split(`<tr data-day-key="${k.key_id}"`).slice(1);
      assert.equal(dayRows.length, k.days.length, dom);
      const want = k.days.map((d) => d.account ?? '–').sort();
      assert.deepEqual(dayRows.map((r) => cell(r, 'account')).sort(), want);
      // The keys table: under the key's row, a row per provider and account, whose
      // numbers are the key's by_account and add up to its totals.
      const accRows = dom.split(`<tr data-key-account="${k.key_id}/`).slice(1);
      assert.equal(accRows.length, k.by_account.length, dom);
      for (const ba of k.by_account) {
        const r = rowOf(dom, 'data-key-account', `${k.key_id}/${ba.provider ?? '-'}/${ba.account ?? '-'}`);
        assert.ok(r, `no account row for ${k.key_id} ${ba.provider}/${ba.account}`);
        assert.equal(cell(r, 'account'), `\u21b3 ${ba.provider ?? '–'} / ${ba.account ?? '–'}`, r);
        assert.equal(num(cell(r, 'requests')), ba.requests, r);
        assert.equal(num(cell(r, 'errors')), ba.errors, r);
        assert.equal(num(cell(r, 'tokens')), ba.total_tokens, r);
      }
      const sum = (f) => accRows.reduce((s, r) => s + num(cell(r, f)), 0);
      assert.equal(sum('requests'), k.totals.requests);
      assert.equal(sum('tokens'), k.totals.total_tokens);
    }
    // Bob's key ran on bob only; the metered rows of the other key on one account.
    const bobRow = rowOf(dom, 'data-key-account', `${keys.b.id}/metered/bob`);
    assert.ok(bobRow, dom);
    assert.equal(num(cell(bobRow, 'requests')), 1, bobRow);
    assert.equal(num(cell(bobRow, 'tokens')), 12, bobRow);
    assert.ok(!dom.includes(`data-key-account="${keys.b.id}/metered/alice"`));
    const a = u.json.keys.find((k) => k.key_id === keys.a.id);
    assert.equal(a.totals.requests, 2);
    assert.ok(a.totals.total_tokens > 0);
    // The name is text, never markup: escaped in the serialised DOM, no such element.
    const rowA = rowOf(dom, 'data-key', keys.a.id);
    assert.ok(rowA.includes('&lt;img src=x id=injected&gt; &amp; "quotes"'), rowA);
    assert.ok(!dom.includes('id="injected"') && !/<img/i.test(dom));
    assert.ok(rowOf(dom, 'data-key', keys.b.id).includes('>bob<'));
    assert.ok(rowOf(dom, 'data-provider', 'metered'), 'the providers table');
    assert.match(dom, /<svg[^>]*viewBox="0 0 900 180"/, 'the chart');
    // The token left the URL and the page.
    assert.ok(!dom.includes(server.token), 'token in the DOM');

    const png = path.join(outDir, 'dashboard.png');
    fs.mkdirSync(outDir, { recursive: true });
    fs.rmSync(png, { force: true });
    await chromium(url, [`--screenshot=${png}`]);
    const img = fs.readFileSync(png);
    assert.deepEqual([...img.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a], 'a PNG');
    assert.ok(img.length > 20000, `screenshot of ${img.length} bytes`);
    process.stderr.write(`screenshot: ${png}\n`);
  });

  it('without a token shows the token form and no data; a wrong token is refused back to it', async () => {
    const { dom } = await chromium(server.url('/dashboard'), ['--dump-dom']);
    assert.match(dom, /<body data-state="login"/);
    assert.match(dom, /<section id="login" class="">/);
    assert.ok(!dom.includes('data-key='), 'no key rows');
    const bad = await chromium(server.url('/dashboard#token=olp_wrong_token'), ['--dump-dom']);
    assert.match(bad.dom, /<body data-state="login"/);
    assert.match(bad.dom, /refused that token/);
    assert.ok(!bad.dom.includes('data-key='));
    // A guest's token is not the owner's: the form again, with no one's data.
    const guest = await chromium(server.url(`/dashboard#token=${encodeURIComponent(keys.b.token)}`), ['--dump-dom']);
    assert.match(guest.dom, /<body data-state="login"/);
    assert.match(guest.dom, /not the owner/);
    assert.ok(!guest.dom.includes('data-key='));
  });
});

describe('GET /dashboard under a route prefix', () => {
  let server;

  before(async () => {
    server = await startServer({
      registry: meteredRegistry(),
      config: { ...testConfig(), server: { route_prefix: '/api' } },
      maxProcs: 1,
    });
  });
  after(async () => {
    await server?.stop();
  });

  it('reads /api/health and /api/v1/usage: its URLs are relative to where it is', async () => {
    const r = await curl(server, { method: 'POST', path: '/api/v1/chat/completions', body: chatBody('metered') });
    assert.equal(r.status, 200, r.text);
    const { dom } = await chromium(server.url(`/api/dashboard#token=${encodeURIComponent(server.token)}`), ['--dump-dom']);
    assert.match(dom, /<body data-state="loaded"/, dom.slice(0, 2000));
    const row = rowOf(dom, 'data-key', '__env_owner__');
    assert.ok(row, 'the env owner\'s row');
    assert.equal(num(cell(row, 'requests')), 1, row);
  });
});

// The whole OpenAI request through the REAL claude CLI (issue 16): images as content
// blocks on stream-json input, response_format's instruction, and the refusals for the
// providers that cannot take what was asked. curl → lighttpd → olp-fcgi → bubblewrap →
// claude (tests/provider-clis) → tests/upstream/fake-anthropic.mjs on 127.0.0.1.
//
// Env (CTest): what harness.mjs needs, plus OLP_PCLI_DIR (tests/provider-clis, whose
// node_modules hold the CLIs).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { startServer, curl, curlStream, chatBody, testRegistry } from './harness.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const pcliDir = process.env.OLP_PCLI_DIR ?? path.join(here, '..', 'provider-clis');
const upstreamDir = path.join(here, '..', 'upstream');
const claudeBin = path.join(pcliDir, 'node_modules/@anthropic-ai/claude-code/bin/claude.exe');

let anthropic, server;
const children = new Set();

function startUpstream(file, env = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [path.join(upstreamDir, file), '0'],
      { stdio: ['ignore', 'pipe', 'inherit'], env: { ...process.env, ...env } });
    children.add(child);
    let out = '';
    child.stdout.on('data', (d) => {
      out += d;
      const nl = out.indexOf('\n');
      if (nl > 0) resolve({ child, url: `http://127.0.0.1:${Number(out.slice(0, nl))}` });
    });
    child.on('exit', (code) => reject(new Error(`${file} exited with ${code}`)));
  });
}

before(async () => {
  anthropic = await startUpstream('fake-anthropic.mjs');
  const registry = testRegistry();
  registry.providers.anthropic = { type: 'claude', displayName: 'Claude (fake upstream)',
    models: [{ id: 'claude-fake', created: 1700000000 }] };
  server = await startServer({
    registry,
    config: {
      auth: { allow_anonymous: false },
      sandbox: { mode: 'bwrap', warm: false },
      // Room for an image above the 5 MiB cap (base64: 4/3 of it) in one body.
      server: { max_body_bytes: 16 * 1024 * 1024 },
      providers: {
        anthropic: { bin: claudeBin, timeout_s: 60, credentials: [],
          env: { ANTHROPIC_BASE_URL: anthropic.url, ANTHROPIC_API_KEY: 'sk-ant-fake-key' } },
      },
    },
  });
});

after(async () => {
  await server?.stop();
  for (const c of children) c.kill('SIGTERM');
});

const post = (body) => curl(server, { method: 'POST', path: '/v1/chat/completions', auth: true,
  headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });

// Smallest valid images of each type (a 1x1 PNG; the others are their magic bytes).
const PNG = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==';
const GIF = 'R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7';
const image = (mt, data) => ({ type: 'image_url', image_url: { url: `data:${mt};base64,${data}` } });
const withImages = (...parts) => [{ role: 'user', content: [{ type: 'text', text: 'What is in these?' }, ...parts] }];

test('an image data URL reaches claude as an image block', async () => {
  const r = await post({ model: 'claude-fake', messages: withImages(image('image/png', PNG)) });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.choices[0].message.content, 'I see 1 image(s): image/png.');
  assert.equal(r.json.choices[0].finish_reason, 'stop');
});

test('several images, streamed, in their order', async () => {
  const res = await curlStream(server, { method: 'POST', path: '/v1/chat/completions', auth: true,
    body: { model: 'claude-fake', stream: true, messages: withImages(image('image/gif', GIF), image('image/png', PNG)) } });
  assert.equal(res.status, 200, res.text);
  const text = res.events.filter((e) => e.data !== '[DONE]')
    .map((e) => JSON.parse(e.data).choices[0]?.delta?.content ?? '').join('');
  assert.equal(text, 'I see 2 image(s): image/gif, image/png.');
});

test('text only still goes as before', async () => {
  const r = await post(chatBody('claude-fake', 'hello'));
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.choices[0].message.content, 'Hello from the fake Anthropic server!');
});

test('a remote image URL: 400 naming the param, nothing fetched', async () => {
  const r = await post({ model: 'claude-fake',
    messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: `${anthropic.url}/cat.png` } }] }] });
  assert.equal(r.status, 400, r.text);
  assert.equal(r.json.error.param, 'messages[0].content[0].image_url.url');
  assert.match(r.json.error.message, /data: URL/);
});

test('a provider that takes no images: 400 naming the param', async () => {
  const r = await post({ model: 'echo', messages: withImages(image('image/png', PNG)) });
  assert.equal(r.status, 400, r.text);
  assert.equal(r.json.error.param, 'messages[0].content[1].image_url.url');
  assert.match(r.json.error.message, /takes no images/);
});

test('an image above the cap: 413 naming the param', async () => {
  const big = PNG.slice(0, 12) + 'A'.repeat(Math.ceil((5 * 1024 * 1024 + 1) / 3) * 4 - 12);
  const r = await post({ model: 'claude-fake', messages: withImages(image('image/png', big)) });
  assert.equal(r.status, 413, r.text);
  assert.equal(r.json.error.param, 'messages[0].content[1].image_url.url');
});

test('response_format json_object with claude: the answer is checked', async () => {
  // The fake upstream answers prose: the warning says so, the answer is kept.
  const r = await post(chatBody('claude-fake', 'data please', { response_format: { type: 'json_object' } }));
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.choices[0].message.content, 'Hello from the fake Anthropic server!');
  assert.match(r.headers['x-olp-warning'] ?? '', /not a JSON object/);
});

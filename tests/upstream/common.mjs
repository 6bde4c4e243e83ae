// Shared by the fake upstream servers: listening, request logging, body reading.
// No dependencies beyond Node's standard library (Node >= 18).
import http from 'node:http';
import https from 'node:https';
import { readFileSync } from 'node:fs';

export const TOKENS = (text) => text.match(/\s*\S+/g) ?? [];

// Models named like "<x>-fail401" answer that status; "<x>-cut" cuts the stream midway.
export function failStatus(model) {
  const m = /fail(\d{3})\b/.exec(model ?? '');
  return m ? Number(m[1]) : 0;
}
export const isCut = (model) => /(^|-)cut\b/.test(model ?? '');

// Subscription limits (issue 26, ADR 0035): a model named "<x>-limits" is answered with
// the headers of a subscription in use (each fake its own); "<x>-limitonce<N>"
// rejects the account for N seconds from its first request (each request until then is
// a 429 naming the same reset), then answers as "-limits".
const limitUntil = new Map();
export function limitState(model) {
  const m = /limitonce(\d+)\b/.exec(model ?? '');
  if (m) {
    const now = Date.now() / 1000;
    if (!limitUntil.has(model)) limitUntil.set(model, Math.floor(now) + Number(m[1]));
    const until = limitUntil.get(model);
    if (now < until) return { rejected: true, resetAt: until, resetIn: Math.max(1, Math.ceil(until - now)) };
  }
  return m || /-limits\b/.test(model ?? '') ? { rejected: false } : null;
}

export async function readBody(req) {
  const chunks = [];
  for await (const c of req) chunks.push(c);
  const raw = Buffer.concat(chunks).toString('utf8');
  try { return raw ? JSON.parse(raw) : {}; } catch { return { _raw: raw }; }
}

// A request sent with the header x-fake-delta-gate is streamed in lockstep with its
// client: the handler calls deltaGate(entry, k) before writing delta k (k >= 1), which waits
// until the client has said, with POST /_seen, that it saw delta k-1 (at most
// GATE_MS; entry.gate_timeouts counts the waits that ran out). A forwarder that buffers
// the answer holds delta k-1 back, so its waits run out; one that streams passes however
// slowly the machine runs the client, which a comparison of timings cannot promise.
const GATE_MS = 15000;
let seenCount = 0; // POST /_seen so far

export async function deltaGate(entry, k) {
  if (entry.gate_base === undefined || k < 1) return;
  const end = Date.now() + GATE_MS;
  while (seenCount < entry.gate_base + k) {
    if (Date.now() > end) {
      entry.gate_timeouts++;
      return;
    }
    await sleep(5);
  }
}

// Start a server; every request is logged (method, path, model, headers that name the
// client, every header as received, and the times the handler wrote its deltas) and the
// log is served at GET /_requests for the tests' assertions. The handler gets the log
// entry as its fourth argument. With FAKE_TLS_CERT and FAKE_TLS_KEY (PEM files) in the
// environment it serves HTTPS instead (a test CA's certificate, for the egress tests).
export function serve(name, handler) {
  const log = [];
  const tls = process.env.FAKE_TLS_CERT && process.env.FAKE_TLS_KEY
    ? { cert: readFileSync(process.env.FAKE_TLS_CERT), key: readFileSync(process.env.FAKE_TLS_KEY) }
    : null;
  const onRequest = async (req, res) => {
    if (req.method === 'POST' && req.url === '/_seen') {
      seenCount++;
      req.resume();
      res.writeHead(204);
      res.end();
      return;
    }
    if (req.method === 'GET' && req.url === '/_requests') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify(log));
      return;
    }
    let body = {};
    try {
      if (req.method === 'POST') body = await readBody(req);
    } catch {
      // The client cut its request short (the egress forwarder does so when it refuses a
      // body): nothing was asked, nothing is logged.
      return;
    }
    const entry = { method: req.method, path: req.url, model: body.model ?? null, stream: body.stream ?? null,
                    auth: req.headers['x-api-key'] ? 'x-api-key' : req.headers.authorization ? 'bearer' : null,
                    user_agent: req.headers['user-agent'] ?? null, t: Date.now(),
                    headers: req.headers, delta_t: [] };
    if (req.headers['x-fake-delta-gate']) Object.assign(entry, { gate_base: seenCount, gate_timeouts: 0 });
    log.push(entry);
    try {
      await handler(req, res, body, entry);
    } catch (e) {
      if (!res.headersSent) res.writeHead(500);
      res.end(String(e));
    }
  };
  const server = tls ? https.createServer(tls, onRequest) : http.createServer(onRequest);
  // Our servers speak plain HTTP/1.1; a WebSocket upgrade is refused outright.
  server.on('upgrade', (req, socket) => socket.end('HTTP/1.1 426 Upgrade Required\r\n\r\n'));
  const port = Number(process.argv[2] ?? process.env.PORT ?? 0);
  server.listen(port, '127.0.0.1', () => {
    process.stdout.write(`${server.address().port}\n`);
  });
  const stop = () => server.close(() => process.exit(0));
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
  return server;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export function sse(res, event, data) {
  res.write(`event: ${event}\ndata: ${JSON.stringify(data)}\n\n`);
}

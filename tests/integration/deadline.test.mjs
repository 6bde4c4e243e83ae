// Deadlines that hold whatever the client does (issue 10): a client that asks for a stream
// and then stops reading must not hold its provider run, nor the provider's concurrency
// slot, past timeout_s. Behind the real lighttpd (server.stream-response-body = 2, so
// the client's backpressure reaches the worker once the socket buffers are full), with a
// provider that writes 64 KiB lines without end: the worker's write blocks within a
// fraction of a second, and only the write deadline can end the run.

import assert from 'node:assert/strict';
import net from 'node:net';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';

import { cfg, chatBody, curl, startServer, testConfig, waitFor } from './harness.mjs';

const TIMEOUT_S = 3;

let srv;

before(async () => {
  srv = await startServer({
    registry: {
      providers: {
        flood: {
          type: 'command',
          displayName: 'Test flood',
          argv: [path.join(cfg.fixturesDir, 'flood.sh')],
          timeout_s: TIMEOUT_S,
          max_concurrent: 1,
          network: false,
          models: [{ id: 'flood', displayName: 'Test flood', created: 1700000000 }],
        },
      },
    },
    config: testConfig(),
  });
});

after(async () => {
  await srv?.stop();
});

// A raw HTTP/1.1 client that sends a streaming request, takes the first bytes of the
// answer (the head) and then stops reading: its socket is paused, so the kernel buffers
// fill and TCP's window closes, as with a client that hangs.
function stalledStream(body) {
  return new Promise((resolve, reject) => {
    const payload = JSON.stringify(body);
    const sock = net.connect(srv.port, '127.0.0.1');
    const chunks = [];
    const timer = setTimeout(() => reject(new Error('no answer within 10 s')), 10000);
    sock.once('error', reject);
    sock.once('connect', () => {
      sock.write(
        'POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n' +
          `Authorization: Bearer ${srv.token}\r\nContent-Type: application/json\r\n` +
          `Content-Length: ${Buffer.byteLength(payload)}\r\n\r\n${payload}`,
      );
    });
    sock.on('data', (d) => {
      chunks.push(d);
      if (chunks.length === 1) {
        sock.pause();
        clearTimeout(timer);
        resolve({ sock, chunks, t0: Date.now() });
      }
    });
  });
}

const floodProcs = () => srv.workerChildren().filter((p) => /flood\.sh|^yes /.test(p.cmdline));

test('a client that stops reading is dropped at timeout_s: the run ends, its slot is free', async () => {
  const { sock, chunks, t0 } = await stalledStream(chatBody('flood', 'flood', { stream: true }));
  try {
    await checkDropped(sock, chunks, t0);
  } finally {
    sock.destroy();
  }
});

async function checkDropped(sock, chunks, t0) {
  const head = chunks[0].toString('latin1');
  assert.match(head, /^HTTP\/1\.1 200/, head.slice(0, 200));
  const rid = /\r\nX-Request-Id: (\w+)/i.exec(head)?.[1];
  assert.ok(rid, `no X-Request-Id in ${head.slice(0, 300)}`);
  assert.ok(
    await waitFor(() => floodProcs().length > 0, { timeoutMs: 5000 }),
    `the provider is not running: ${JSON.stringify(srv.workerChildren())}`,
  );

  // While the run lasts, it holds the provider's only slot.
  const during = await curl(srv, { method: 'POST', path: '/v1/chat/completions', body: chatBody('flood', 'hi') });
  assert.equal(during.status, 429, `the cap does not hold while the first run lasts: ${during.text}`);

  // Past timeout_s the run is over, though its client has not read a byte since.
  await sleep(Math.max(0, t0 + TIMEOUT_S * 1000 + 1000 - Date.now()));
  const next = await curl(srv, { method: 'POST', path: '/v1/chat/completions', body: chatBody('flood', 'hi') });
  assert.equal(next.status, 200, `the stalled run still holds the slot ${Date.now() - t0} ms after it began: ${next.text}`);
  assert.equal(next.json.choices[0].message.content, 'ok\n');
  assert.ok(
    await waitFor(() => floodProcs().length === 0, { timeoutMs: 2000 }),
    `the stalled run's tree is still there: ${JSON.stringify(floodProcs().map((p) => p.pid))}`,
  );

  // The request is logged as a client that stopped reading, ended at its deadline (a
  // write that timed out: the worker really was held by the client).
  const line = await waitFor(
    () => srv.errorLog().split('\n').find((l) => l.includes(`"request_id":"${rid}"`) && l.includes('"event":"request"')),
    { timeoutMs: 3000 },
  );
  assert.ok(line, `no request log line for ${rid}`);
  const entry = JSON.parse(line);
  assert.equal(entry.status, 499, line);
  assert.equal(entry.error, 'CLIENT_STALLED', line);
  assert.ok(
    entry.latency_ms >= TIMEOUT_S * 1000 - 100 && entry.latency_ms < TIMEOUT_S * 1000 + 1000,
    `latency ${entry.latency_ms} ms for a timeout of ${TIMEOUT_S} s`,
  );

  // The stalled client was dropped: once it reads again, it gets what was buffered and
  // then the end of the connection, never the end of a complete stream.
  const ended = await new Promise((resolve) => {
    const timer = setTimeout(() => resolve(false), 10000);
    sock.once('close', () => {
      clearTimeout(timer);
      resolve(true);
    });
    sock.on('error', () => {});
    sock.resume();
  });
  assert.ok(ended, 'the stalled client is still connected 10 s after it read again');
  const text = Buffer.concat(chunks).toString('latin1');
  assert.ok(!text.includes('data: [DONE]'), 'the dropped stream ends as if it were complete');

  assert.deepEqual(await srv.waitIdle(3000), []);
}

#!/usr/bin/env node
// A fake OpenAI Responses API for tests: POST /v1/responses (SSE, as codex expects).
//   node fake-openai.mjs [PORT]        prints the port it listens on (127.0.0.1) first
// Events: response.created, response.in_progress, response.output_item.added,
// response.content_part.added, response.output_text.delta (one per word),
// response.output_text.done, response.content_part.done, response.output_item.done,
// response.completed (with usage). GET /v1/models answers an empty list.
// Models: *-fail401 / *-fail429 / *-fail500 (any status) answer that status;
//         *-cut sends half the deltas and then drops the connection.
import { serve, failStatus, isCut, TOKENS, deltaGate, sleep, sse } from './common.mjs';

const TEXT = 'Hello from the fake OpenAI server!';
const DELTA_MS = Number(process.env.FAKE_DELTA_MS ?? 0);
let seq = 0;

serve('openai', async (req, res, body, entry) => {
  const path = req.url.split('?')[0];
  if (req.method === 'GET' && path === '/v1/models') {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ object: 'list', data: [], models: [] }));
    return;
  }
  if (req.method !== 'POST' || path !== '/v1/responses') {
    res.writeHead(404, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ error: { message: `no route ${path}`, type: 'invalid_request_error' } }));
    return;
  }
  const n = ++seq;
  const reqId = `req_fake_${n.toString(16).padStart(12, '0')}`;
  const model = body.model ?? 'gpt-fake';
  const status = failStatus(model);
  if (status) {
    res.writeHead(status, { 'content-type': 'application/json', 'x-request-id': reqId });
    res.end(JSON.stringify({ error: { message: `fake ${status}`,
      type: status === 401 ? 'invalid_request_error' : status === 429 ? 'rate_limit_exceeded' : 'server_error',
      code: status === 401 ? 'invalid_api_key' : null } }));
    return;
  }
  const id = `resp_fake_${n}`, itemId = `msg_fake_${n}`;
  const created = Math.floor(Date.now() / 1000);
  const base = { id, object: 'response', created_at: created, model, output: [] };
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', 'x-request-id': reqId });
  let sn = 0;
  const ev = (type, data) => sse(res, type, { type, sequence_number: sn++, ...data });
  ev('response.created', { response: { ...base, status: 'in_progress' } });
  ev('response.in_progress', { response: { ...base, status: 'in_progress' } });
  ev('response.output_item.added', { output_index: 0,
    item: { id: itemId, type: 'message', role: 'assistant', status: 'in_progress', content: [] } });
  ev('response.content_part.added', { item_id: itemId, output_index: 0, content_index: 0,
    part: { type: 'output_text', text: '', annotations: [] } });
  const tokens = TOKENS(TEXT);
  for (const [i, t] of tokens.entries()) {
    if (isCut(model) && i === Math.floor(tokens.length / 2)) {
      res.socket.destroy();
      return;
    }
    await deltaGate(entry, i);
    if (DELTA_MS) await sleep(DELTA_MS);
    ev('response.output_text.delta', { item_id: itemId, output_index: 0, content_index: 0, delta: t });
    entry.delta_t.push(Date.now());
  }
  const part = { type: 'output_text', text: TEXT, annotations: [] };
  const item = { id: itemId, type: 'message', role: 'assistant', status: 'completed', content: [part] };
  ev('response.output_text.done', { item_id: itemId, output_index: 0, content_index: 0, text: TEXT });
  ev('response.content_part.done', { item_id: itemId, output_index: 0, content_index: 0, part });
  ev('response.output_item.done', { output_index: 0, item });
  ev('response.completed', { response: { ...base, status: 'completed', output: [item],
    usage: { input_tokens: 10, input_tokens_details: { cached_tokens: 0 }, output_tokens: 6,
             output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 16 } } });
  res.end();
});

#!/usr/bin/env node
// A fake OpenAI Responses API for tests: POST /v1/responses (SSE, as codex expects).
//   node fake-openai.mjs [PORT]        prints the port it listens on (127.0.0.1) first
// Events: response.created, response.in_progress, response.output_item.added,
// response.content_part.added, response.output_text.delta (one per word),
// response.output_text.done, response.content_part.done, response.output_item.done,
// response.completed (with usage). GET /v1/models answers an empty list.
// Models: *-fail401 / *-fail429 / *-fail500 (any status) answer that status;
//         *-cut sends half the deltas and then drops the connection;
//         *-limits and *-limitonce<N> carry a ChatGPT plan's x-codex-* headers (limitState,
//         common.mjs), and the rejection a usage_limit_reached 429.
// Client tools (declared by OLP to codex through MCP: codex lists them to the model in a
// "namespace" tool named mcp__olp): the model calls tools when the last user text says
// "call:NAME[,NAME…]" (arguments {"city":"Paris"} for the first, {"n":<i>} for the
// others, a NAME may also carry its arguments as NAME=JSON-in-base64url), or says it
// "must call the tool NAME" / "must call at least one" (the first tool); each call a
// function_call item with "namespace": "mcp__olp", its arguments streamed as two deltas.
// A request that carries a function_call_output (codex asking again with the results of
// calls) is answered "Asked again with tool output."; a conversation holding
// "[Tool Result (…)] TEXT" is answered "Tool said: TEXT".
// codex's own exec_command tool: a last user text holding "ownexec:COMMAND" calls it
// with {"cmd": COMMAND} (no namespace); the request that brings its output back is
// answered "Tool said: OUTPUT" (what a prompt that makes the CLI print its files gets).
import { serve, failStatus, isCut, limitState, TOKENS, deltaGate, sleep, sse } from './common.mjs';

const NS = 'mcp__olp';
const inputItems = (body) => (Array.isArray(body.input) ? body.input : []);
const userText = (item) => (Array.isArray(item.content) ? item.content : [])
  .filter((c) => c?.type === 'input_text').map((c) => c.text).join('\n');

function lastUserText(body) {
  if (typeof body.input === 'string') return body.input;
  const users = inputItems(body).filter((i) => i.type === 'message' && i.role === 'user');
  return users.length ? userText(users.at(-1)) : '';
}

// The output of a call of codex's own tool (call ids "call_own_…"), or null.
const ownOutput = (body) => {
  const o = inputItems(body).find((i) => i.type === 'function_call_output' && /^call_own_/.test(i.call_id ?? ''));
  if (!o) return null;
  return typeof o.output === 'string' ? o.output : JSON.stringify(o.output);
};

// The calls the model makes now: [{name, args}] (names as declared in the namespace).
function callsWanted(body) {
  const own = lastUserText(body).match(/ownexec:(.+)/);
  if (own && ownOutput(body) === null && (body.tools ?? []).some((t) => t.name === 'exec_command'))
    return [{ name: 'exec_command', args: JSON.stringify({ cmd: own[1].trim() }), own: true }];
  const ns = (body.tools ?? []).find((t) => t.type === 'namespace' && t.name === NS);
  const declared = (ns?.tools ?? []).map((t) => t.name);
  if (!declared.length || inputItems(body).some((i) => i.type === 'function_call_output')) return [];
  const text = lastUserText(body);
  if (/\[Tool Result \(/.test(text)) return [];
  const args = (i) => JSON.stringify(i === 0 ? { city: 'Paris' } : { n: i });
  const m = text.match(/call:([\w,=-]+)/);
  if (m) {
    return m[1].split(',').map((spec, i) => {
      const [name, b64] = spec.split('=');
      return { name, args: b64 ? Buffer.from(b64, 'base64url').toString() : args(i) };
    }).filter((c) => declared.includes(c.name));
  }
  const named = text.match(/must call the tool ([\w-]+)/);
  if (named && declared.includes(named[1])) return [{ name: named[1], args: args(0) }];
  if (/must call at least one/.test(text)) return [{ name: declared[0], args: args(0) }];
  return [];
}

function answerText(body) {
  if (ownOutput(body) !== null) return `Tool said: ${ownOutput(body)}`;
  if (inputItems(body).some((i) => i.type === 'function_call_output')) return 'Asked again with tool output.';
  const result = lastUserText(body).match(/\[Tool Result \([^)]*\)\] (.*)/);
  return result ? `Tool said: ${result[1]}` : null;
}

const HELLO = 'Hello from the fake OpenAI server!';
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
  // A ChatGPT plan's limits, as codex's backend announces them.
  const lim = limitState(model);
  if (lim) {
    const now = Math.floor(Date.now() / 1000);
    const h = { 'x-codex-primary-used-percent': lim.rejected ? '100' : '37',
      'x-codex-primary-window-minutes': '300',
      'x-codex-primary-reset-after-seconds': String(lim.rejected ? lim.resetIn : 7200),
      'x-codex-secondary-used-percent': '12',
      'x-codex-secondary-window-minutes': '10080',
      'x-codex-secondary-reset-at': String(now + 4 * 86400) };
    for (const [k, v] of Object.entries(h)) res.setHeader(k, v);
    if (lim.rejected) {
      res.writeHead(429, { 'content-type': 'application/json', 'x-request-id': reqId });
      res.end(JSON.stringify({ error: { type: 'usage_limit_reached', message: 'You\'ve hit your usage limit.',
        plan_type: 'plus', resets_in_seconds: lim.resetIn } }));
      return;
    }
  }
  const id = `resp_fake_${n}`, itemId = `msg_fake_${n}`;
  const TEXT = answerText(body) ?? HELLO;
  const calls = callsWanted(body);
  const created = Math.floor(Date.now() / 1000);
  const base = { id, object: 'response', created_at: created, model, output: [] };
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', 'x-request-id': reqId });
  let sn = 0;
  const ev = (type, data) => sse(res, type, { type, sequence_number: sn++, ...data });
  ev('response.created', { response: { ...base, status: 'in_progress' } });
  ev('response.in_progress', { response: { ...base, status: 'in_progress' } });
  const usage = { input_tokens: 10, input_tokens_details: { cached_tokens: 0 }, output_tokens: 6,
                  output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 16 };
  if (calls.length) {
    const items = [];
    for (const [i, c] of calls.entries()) {
      const item = { id: `fc_fake_${n}_${i}`, type: 'function_call', status: 'completed',
                     ...(c.own ? {} : { namespace: NS }), call_id: `call_${c.own ? 'own' : 'fake'}_${n}_${i}`,
                     name: c.name, arguments: c.args };
      ev('response.output_item.added', { output_index: i, item: { ...item, status: 'in_progress', arguments: '' } });
      const cut = Math.floor(c.args.length / 2);
      for (const delta of [c.args.slice(0, cut), c.args.slice(cut)])
        ev('response.function_call_arguments.delta', { item_id: item.id, output_index: i, delta });
      ev('response.function_call_arguments.done', { item_id: item.id, output_index: i, arguments: c.args });
      ev('response.output_item.done', { output_index: i, item });
      items.push(item);
    }
    ev('response.completed', { response: { ...base, status: 'completed', output: items, usage } });
    res.end();
    return;
  }
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
  ev('response.completed', { response: { ...base, status: 'completed', output: [item], usage } });
  res.end();
});

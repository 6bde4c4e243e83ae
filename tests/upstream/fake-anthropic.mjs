#!/usr/bin/env node
// A fake Anthropic Messages API for tests: POST /v1/messages.
//   node fake-anthropic.mjs [PORT]     prints the port it listens on (127.0.0.1) first
// stream:true  -> SSE: message_start, content_block_start, content_block_delta (one per
//                 word), content_block_stop, message_delta (stop_reason, usage), message_stop
// stream:false -> one JSON message (claude falls back to this when a stream breaks)
// Models: *-fail401 / *-fail429 / *-fail500 (any status) answer that status;
//         *-cut sends half the deltas and then drops the connection;
//         *-maxtok stops with stop_reason "max_tokens";
//         *-limits and *-limitonce<N> carry a subscription's anthropic-ratelimit-unified-*
//         headers (limitState, common.mjs).
// FAKE_DELTA_MS (env) spaces the deltas, to see them arrive one by one; the header
// x-fake-delta-gate streams them in lockstep with the client (deltaGate, common.mjs).
// A last user message holding image blocks is answered "I see N image(s): <media types>."
// Client tools (declared by OLP as mcp__olp__<name>): the model calls tools when the last
// user text says "call:NAME[,NAME…]" (arguments {"city":"Paris"} for the first, {"n":<i>}
// for the others, each streamed as two input_json_delta pieces), or when the system prompt
// says it "must call the tool mcp__olp__NAME" / "must call at least one" (the first tool);
// stop_reason "tool_use". "callargs:NAME:B64" (base64url of a JSON object) calls NAME with
// those arguments: a client's own tool with its own schema (codex's exec_command {"cmd"}).
// A last user text holding "bash:COMMAND" (to the end of its line), with a tool named Bash
// declared (Claude Code's own, as a client of OLP), calls it with {"command": COMMAND,
// "description": "Run the command the user gave"}.
// A conversation holding "[Tool Result (…)] TEXT" is answered "Tool said: TEXT".
// The CLI's own Bash tool (claude's "tools": "Bash"): a last user text holding
// "ownbash:COMMAND" calls Bash with {"command": COMMAND}; the request that brings its
// tool_result back is answered "Tool said: OUTPUT" (what a prompt that makes the CLI
// print its files gets; it_held). A last user text holding "echo-auth" is answered with
// the request's Authorization header (an upstream that echoes its request: the forwarder
// must mask the credential it set).
import { serve, failStatus, isCut, limitState, TOKENS, deltaGate, sleep, sse } from './common.mjs';

const HELLO = 'Hello from the fake Anthropic server!';

// The image blocks of the last user message (base64 sources), as "image/png, …".
function lastUserText(body) {
  const last = [...(body.messages ?? [])].reverse().find((m) => m.role === 'user');
  if (typeof last?.content === 'string') return last.content;
  return (last?.content ?? []).filter((b) => b?.type === 'text').map((b) => b.text).join('\n');
}

const systemText = (body) =>
  typeof body.system === 'string' ? body.system : (body.system ?? []).map((b) => b.text ?? '').join('\n');

// "callargs:NAME:B64": {name, args (JSON text)}, or null.
function argsGiven(body) {
  const m = lastUserText(body).match(/callargs:([\w-]+):([A-Za-z0-9_-]+)/);
  return m ? { name: m[1], args: Buffer.from(m[2], 'base64url').toString('utf8') } : null;
}

// The last user message's tool_result text, or null.
function toolResult(body) {
  const last = [...(body.messages ?? [])].reverse().find((m) => m.role === 'user');
  const r = (Array.isArray(last?.content) ? last.content : []).find((b) => b?.type === 'tool_result');
  if (!r) return null;
  return typeof r.content === 'string' ? r.content : (r.content ?? []).map((b) => b.text ?? '').join('');
}

// "ownbash:COMMAND" with the CLI's own Bash declared, and no result yet: COMMAND, else null.
function ownBash(body) {
  if (!(body.tools ?? []).some((t) => t.name === 'Bash') || toolResult(body) !== null) return null;
  const m = lastUserText(body).match(/ownbash:(.+)/);
  return m ? m[1].trim() : null;
}

// The tools the model is to call now: [names with the mcp__olp__ prefix].
function callsWanted(body) {
  if (ownBash(body) !== null) return ['Bash'];
  const declared = (body.tools ?? []).map((t) => t.name).filter((n) => n?.startsWith('mcp__olp__'));
  if (!declared.length) return [];
  const text = lastUserText(body);
  if (/\[Tool Result \(/.test(text)) return [];
  const given = argsGiven(body);
  if (given) return declared.includes(`mcp__olp__${given.name}`) ? [`mcp__olp__${given.name}`] : [];
  if (bashCommand(body) !== null) return ['mcp__olp__Bash'];
  const m = text.match(/call:([\w,-]+)/);
  if (m) return m[1].split(',').map((n) => `mcp__olp__${n}`).filter((n) => declared.includes(n));
  const named = systemText(body).match(/must call the tool (mcp__olp__[\w-]+)/);
  if (named && declared.includes(named[1])) return [named[1]];
  if (/must call at least one/.test(systemText(body))) return [declared[0]];
  return [];
}

// "bash:COMMAND" in the last user text, when a Bash tool is declared: COMMAND, else null.
function bashCommand(body) {
  if (!(body.tools ?? []).some((t) => t.name === 'mcp__olp__Bash')) return null;
  const m = lastUserText(body).match(/bash:(.+)/);
  return m ? m[1].trim() : null;
}

function imagesSeen(body) {
  const last = [...(body.messages ?? [])].reverse().find((m) => m.role === 'user');
  const blocks = Array.isArray(last?.content) ? last.content : [];
  return blocks.filter((b) => b?.type === 'image' && b.source?.type === 'base64').map((b) => b.source.media_type);
}
const DELTA_MS = Number(process.env.FAKE_DELTA_MS ?? 0);
let seq = 0;
const errType = { 400: 'invalid_request_error', 401: 'authentication_error', 403: 'permission_error',
                  404: 'not_found_error', 429: 'rate_limit_error', 529: 'overloaded_error' };

serve('anthropic', async (req, res, body, entry) => {
  const path = req.url.split('?')[0];
  if (req.method !== 'POST' || path !== '/v1/messages') {
    res.writeHead(404, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ type: 'error', error: { type: 'not_found_error', message: `no route ${path}` } }));
    return;
  }
  const id = `msg_fake_${(++seq).toString(16).padStart(16, '0')}`;
  const reqId = `req_fake_${seq.toString(16).padStart(12, '0')}`;
  const model = body.model ?? 'claude-fake';
  const status = failStatus(model);
  if (status) {
    res.writeHead(status, { 'content-type': 'application/json', 'request-id': reqId,
                            ...(status === 429 ? { 'retry-after': '1' } : {}) });
    res.end(JSON.stringify({ type: 'error',
      error: { type: errType[status] ?? 'api_error', message: `fake ${status}` }, request_id: reqId }));
    return;
  }
  // A subscription's limits, as Anthropic announces them on every answer.
  const lim = limitState(model);
  if (lim) {
    const now = Math.floor(Date.now() / 1000);
    const reset5h = lim.rejected ? lim.resetAt : now + 3 * 3600;
    const h = { 'anthropic-ratelimit-unified-status': lim.rejected ? 'rejected' : 'allowed',
      'anthropic-ratelimit-unified-reset': String(reset5h),
      'anthropic-ratelimit-unified-representative-claim': 'five_hour',
      'anthropic-ratelimit-unified-5h-status': lim.rejected ? 'rejected' : 'allowed',
      'anthropic-ratelimit-unified-5h-utilization': lim.rejected ? '1.0' : '0.42',
      'anthropic-ratelimit-unified-5h-reset': String(reset5h),
      'anthropic-ratelimit-unified-7d-status': 'allowed',
      'anthropic-ratelimit-unified-7d-utilization': '0.25',
      'anthropic-ratelimit-unified-7d-reset': String(now + 5 * 86400) };
    for (const [k, v] of Object.entries(h)) res.setHeader(k, v);
    if (lim.rejected) {
      // Not retried by the CLI's SDK (x-should-retry): what the real API says with a
      // subscription's rejection was not seen here.
      res.writeHead(429, { 'content-type': 'application/json', 'request-id': reqId, 'x-should-retry': 'false' });
      res.end(JSON.stringify({ type: 'error', error: { type: 'rate_limit_error',
        message: 'This request would exceed your account\'s rate limit. Please try again later.' }, request_id: reqId }));
      return;
    }
  }
  const images = imagesSeen(body);
  const result = lastUserText(body).match(/\[Tool Result \([^)]*\)\] (.*)/);
  const own = toolResult(body);
  const echoAuth = /echo-auth/.test(lastUserText(body)) ? `auth=${req.headers.authorization ?? ''}` : null;
  const TEXT = echoAuth ?? (own !== null ? `Tool said: ${own}` : null) ?? (images.length ? `I see ${images.length} image(s): ${images.join(', ')}.`
    : result ? `Tool said: ${result[1]}` : HELLO);
  const calls = callsWanted(body);
  const stopReason = /maxtok/.test(model) ? 'max_tokens' : 'end_turn';
  const usage = { input_tokens: 10, output_tokens: 6, cache_creation_input_tokens: 0, cache_read_input_tokens: 0 };
  if (calls.length) {
    const given = argsGiven(body);
    const bash = ownBash(body) ?? bashCommand(body);
    const args = (i) => given?.args ?? JSON.stringify(bash !== null ? { command: bash, description: 'Run the command the user gave' }
      : i === 0 ? { city: 'Paris' } : { n: i });
    const ids = calls.map((_, i) => `toolu_fake_${seq}_${i}`);
    if (!body.stream) {
      res.writeHead(200, { 'content-type': 'application/json', 'request-id': reqId });
      res.end(JSON.stringify({ id, type: 'message', role: 'assistant', model,
        content: calls.map((name, i) => ({ type: 'tool_use', id: ids[i], name, input: JSON.parse(args(i)) })),
        stop_reason: 'tool_use', stop_sequence: null, usage }));
      return;
    }
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', 'request-id': reqId });
    sse(res, 'message_start', { type: 'message_start', message: { id, type: 'message', role: 'assistant', model,
      content: [], stop_reason: null, stop_sequence: null, usage: { ...usage, output_tokens: 1 } } });
    for (const [i, name] of calls.entries()) {
      sse(res, 'content_block_start', { type: 'content_block_start', index: i,
        content_block: { type: 'tool_use', id: ids[i], name, input: {} } });
      const a = args(i);
      const cut = Math.floor(a.length / 2);
      for (const piece of [a.slice(0, cut), a.slice(cut)])
        sse(res, 'content_block_delta', { type: 'content_block_delta', index: i,
          delta: { type: 'input_json_delta', partial_json: piece } });
      sse(res, 'content_block_stop', { type: 'content_block_stop', index: i });
    }
    sse(res, 'message_delta', { type: 'message_delta', delta: { stop_reason: 'tool_use', stop_sequence: null },
      usage: { output_tokens: usage.output_tokens } });
    sse(res, 'message_stop', { type: 'message_stop' });
    res.end();
    return;
  }
  if (!body.stream) {
    res.writeHead(200, { 'content-type': 'application/json', 'request-id': reqId });
    res.end(JSON.stringify({ id, type: 'message', role: 'assistant', model,
      content: [{ type: 'text', text: TEXT }], stop_reason: stopReason, stop_sequence: null, usage }));
    return;
  }
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', 'request-id': reqId });
  sse(res, 'message_start', { type: 'message_start', message: { id, type: 'message', role: 'assistant', model,
    content: [], stop_reason: null, stop_sequence: null, usage: { ...usage, output_tokens: 1 } } });
  sse(res, 'content_block_start', { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } });
  const tokens = TOKENS(TEXT);
  for (const [i, t] of tokens.entries()) {
    if (isCut(model) && i === Math.floor(tokens.length / 2)) {
      res.socket.destroy(); // mid-stream: no message_stop, no end of chunked body
      return;
    }
    await deltaGate(entry, i);
    if (DELTA_MS) await sleep(DELTA_MS);
    sse(res, 'content_block_delta', { type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: t } });
    entry.delta_t.push(Date.now());
  }
  sse(res, 'content_block_stop', { type: 'content_block_stop', index: 0 });
  sse(res, 'message_delta', { type: 'message_delta', delta: { stop_reason: stopReason, stop_sequence: null },
    usage: { output_tokens: usage.output_tokens } });
  sse(res, 'message_stop', { type: 'message_stop' });
  res.end();
});

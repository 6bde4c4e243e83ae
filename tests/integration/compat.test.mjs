// The whole OpenAI request (issue 16), through real lighttpd and curl: a field OLP
// cannot honour is refused by name (400, OpenAI's error shape, `param` set), the ones
// ignored on purpose are accepted, and `stop` sequences are applied to the output.
// docs/openai-compat.md lists every field.

import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import { chatBody, curl, curlStream, startServer } from './harness.mjs';

let srv;
let initialWorkers;

before(async () => {
  srv = await startServer();
  initialWorkers = srv.workerPids();
});

after(async () => {
  await srv?.stop();
});

const PATH = '/v1/chat/completions';

function post(body) {
  return curl(srv, {
    method: 'POST',
    path: PATH,
    body: JSON.stringify(body),
    headers: { 'Content-Type': 'application/json' },
    auth: true,
  });
}

function stream(body) {
  return curlStream(srv, { method: 'POST', path: PATH, body: { ...body, stream: true }, auth: true });
}

// The chunks of a stream, [DONE] checked and left out.
function chunks(res) {
  assert.equal(res.status, 200, res.text);
  const data = res.events.map((e) => e.data);
  assert.equal(data.at(-1), '[DONE]', res.text);
  return data.slice(0, -1).map((d) => JSON.parse(d));
}

const streamedText = (cs) => cs.map((c) => c.choices[0]?.delta?.content ?? '').join('');
const finishOf = (cs) => cs.map((c) => c.choices[0]?.finish_reason).filter(Boolean);

describe('no silent drops', () => {
  const refused = [
    ['n 2', { n: 2 }, 'n'],
    ['logprobs', { logprobs: true }, 'logprobs'],
    ['top_logprobs', { top_logprobs: 3 }, 'top_logprobs'],
    ['audio', { audio: { voice: 'alloy', format: 'mp3' } }, 'audio'],
    ['modalities with audio', { modalities: ['text', 'audio'] }, 'modalities'],
    ['logit_bias', { logit_bias: { 50256: -100 } }, 'logit_bias'],
    ['prediction', { prediction: { type: 'content', content: 'x' } }, 'prediction'],
    ['web_search_options', { web_search_options: { search_context_size: 'low' } }, 'web_search_options'],
    ['functions', { functions: [{ name: 'f' }] }, 'functions'],
    ['tools', { tools: [{ type: 'function', function: { name: 'f', parameters: {} } }] }, 'tools'],
    ['tool_choice required', { tool_choice: 'required' }, 'tool_choice'],
    ['function_call', { function_call: 'auto' }, 'function_call'],
    ['an unknown field', { frobnicate: 1 }, 'frobnicate'],
  ];
  for (const [name, extra, param] of refused) {
    it(`${name}: 400 naming ${param}`, async () => {
      const r = await post(chatBody('echo', 'hi', extra));
      assert.equal(r.status, 400, r.text);
      assert.equal(r.json.error.type, 'invalid_request_error');
      assert.equal(r.json.error.param, param, r.text);
      assert.ok(r.json.error.message.includes(param), r.text);
      // The worker is still up and answers the next one.
      const next = await post(chatBody('echo', 'next'));
      assert.equal(next.status, 200, next.text);
    });
  }

  it('the fields ignored on purpose, and defaults, are accepted', async () => {
    const r = await post(
      chatBody('echo', 'ok', {
        temperature: 0.2,
        top_p: 0.9,
        seed: 7,
        user: 'u',
        frequency_penalty: 0.5,
        presence_penalty: 0.5,
        metadata: { a: 'b' },
        store: false,
        service_tier: 'auto',
        reasoning_effort: 'low',
        n: 1,
        logprobs: false,
        modalities: ['text'],
        response_format: { type: 'text' },
        tools: [],
        tool_choice: 'none',
      }),
    );
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.choices[0].message.content, 'ok');
  });
});

describe('stop sequences', () => {
  it('cut a whole answer at the first sequence', async () => {
    const r = await post(chatBody('echo', 'alpha END beta STOP gamma', { stop: ['STOP', 'END'] }));
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.choices[0].message.content, 'alpha ');
    assert.equal(r.json.choices[0].finish_reason, 'stop');
  });

  it('a sequence that never comes leaves the answer whole', async () => {
    const r = await post(chatBody('echo', 'nothing to cut here', { stop: 'ZZZ' }));
    assert.equal(r.json.choices[0].message.content, 'nothing to cut here');
  });

  it('streamed: a sequence split across deltas still cuts, and the run ends there', async () => {
    // ticker writes "tick N\n" 100 ms apart: "2\ntick 3" spans two writes.
    const cs = chunks(await stream(chatBody('ticker', 'x', { stop: '2\ntick 3' })));
    assert.equal(streamedText(cs), 'tick 1\ntick ');
    assert.deepEqual(finishOf(cs), ['stop']);
  });

  it('streamed: nothing held back is lost when no sequence comes', async () => {
    const cs = chunks(await stream(chatBody('ticker', 'x', { stop: ['nope', 'never'] })));
    assert.equal(streamedText(cs), 'tick 1\ntick 2\ntick 3\ntick 4\ntick 5\n');
    assert.deepEqual(finishOf(cs), ['stop']);
  });

  it('multi-byte text is never split by the hold-back', async () => {
    // A 7-byte sequence holds back 6 bytes: the cut falls inside "✓" (3 bytes) + "done".
    const text = 'héllo wörld ✓done';
    const cs = chunks(await stream(chatBody('echo', text, { stop: ['XYZXYZX'] })));
    for (const c of cs) {
      const d = c.choices[0]?.delta?.content ?? '';
      assert.ok(!d.includes('\ufffd'), `a chunk split a character: ${JSON.stringify(d)}`);
    }
    assert.equal(streamedText(cs), text);
  });
});

describe('afterwards', () => {
  it('no worker died along the way', async () => {
    assert.deepEqual(srv.workerPids(), initialWorkers, 'a worker was restarted by lighttpd');
  });
});

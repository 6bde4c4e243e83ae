// The whole OpenAI request (issue 16), through real lighttpd and curl: a field OLP
// cannot honour is refused by name (400, OpenAI's error shape, `param` set), the ones
// ignored on purpose are accepted, and `stop` sequences are applied to the output.
// docs/openai-compat.md lists every field.

import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import { chatBody, curl, curlStream, startServer, testConfig, testRegistry } from './harness.mjs';

let srv;
let initialWorkers;

// Command providers that answer fixed text, whatever they are asked.
function fixed(name, text) {
  return {
    type: 'command',
    argv: ['/bin/sh', '-c', `cat >/dev/null; printf '%s' '${text}'`],
    timeout_s: 20,
    network: false,
    models: [{ id: name, created: 1700000000 }],
  };
}

before(async () => {
  const registry = testRegistry();
  registry.providers['json-object'] = fixed('json-object', '  {"ok": true, "n": [1, 2]}\n');
  registry.providers['json-array'] = fixed('json-array', '[1, 2, 3]');
  registry.providers['not-json'] = fixed('not-json', 'Sure! Here is your JSON: {"ok": true}');
  // Silent for 1.5 s, then one word: what a CLI thinking for a while looks like.
  registry.providers.thinker = { ...fixed('thinker', ''), argv: ['/bin/sh', '-c', 'cat >/dev/null; sleep 1.5; printf late'] };
  srv = await startServer({ registry, config: { ...testConfig(), streaming: { heartbeat_interval_ms: 300 } } });
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

describe('response_format', () => {
  const schema = {
    name: 'weather_report',
    description: 'a city and its temperature',
    schema: { type: 'object', properties: { city: { type: 'string' }, celsius: { type: 'number' } }, required: ['city'] },
  };

  it('json_object: the JSON-only instruction reaches the provider, last', async () => {
    const r = await post(chatBody('echo', 'give me data', { response_format: { type: 'json_object' } }));
    assert.equal(r.status, 200, r.text);
    const prompt = r.json.choices[0].message.content;
    assert.match(prompt, /^give me data\n\n\[System\] Respond with one valid JSON object and nothing else/);
    assert.ok(!prompt.includes('JSON Schema'), prompt);
  });

  it('json_schema: the schema is in the instruction', async () => {
    const r = await post(chatBody('echo', 'weather?', { response_format: { type: 'json_schema', json_schema: schema } }));
    assert.equal(r.status, 200, r.text);
    const prompt = r.json.choices[0].message.content;
    assert.ok(prompt.includes('"weather_report" (a city and its temperature)'), prompt);
    assert.ok(prompt.includes(JSON.stringify(schema.schema)), prompt);
  });

  it('a JSON answer: no warning', async () => {
    const r = await post(chatBody('json-object', 'x', { response_format: { type: 'json_object' } }));
    assert.equal(r.status, 200, r.text);
    assert.equal(r.headers['x-olp-warning'], undefined);
    assert.equal(r.json.olp_warning, undefined);
    assert.deepEqual(JSON.parse(r.json.choices[0].message.content), { ok: true, n: [1, 2] });
  });

  it('not JSON: the answer as it is, finish_reason kept, X-OLP-Warning and olp_warning', async () => {
    const r = await post(chatBody('not-json', 'x', { response_format: { type: 'json_object' } }));
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.choices[0].message.content, 'Sure! Here is your JSON: {"ok": true}');
    assert.equal(r.json.choices[0].finish_reason, 'stop');
    assert.match(r.headers['x-olp-warning'] ?? '', /the answer is not a JSON object/);
    assert.equal(r.json.olp_warning, r.headers['x-olp-warning']);
  });

  it('json_object wants an object; json_schema takes any JSON', async () => {
    const obj = await post(chatBody('json-array', 'x', { response_format: { type: 'json_object' } }));
    assert.ok(obj.headers['x-olp-warning'], obj.text);
    const sch = await post(chatBody('json-array', 'x', { response_format: { type: 'json_schema', json_schema: schema } }));
    assert.equal(sch.headers['x-olp-warning'], undefined, sch.text);
  });

  it('streamed: the final chunk carries olp_warning when the answer is not JSON', async () => {
    const bad = chunks(await stream(chatBody('not-json', 'x', { response_format: { type: 'json_object' } })));
    const last = bad.findLast((c) => c.choices[0]?.finish_reason);
    assert.equal(last.choices[0].finish_reason, 'stop');
    assert.match(last.olp_warning ?? '', /not a JSON object/);
    assert.equal(bad.filter((c) => c.olp_warning).length, 1);
    const good = chunks(await stream(chatBody('json-object', 'x', { response_format: { type: 'json_object' } })));
    assert.equal(good.filter((c) => c.olp_warning).length, 0);
  });

  const badFormats = [
    ['an unknown type', { type: 'yaml' }, 'response_format.type'],
    ['no type', {}, 'response_format'],
    ['json_schema without json_schema', { type: 'json_schema' }, 'response_format.json_schema'],
    ['json_schema without a name', { type: 'json_schema', json_schema: { schema: {} } }, 'response_format.json_schema.name'],
    ['a name with a newline', { type: 'json_schema', json_schema: { name: 'a\nb' } }, 'response_format.json_schema.name'],
    ['a schema not an object', { type: 'json_schema', json_schema: { name: 'n', schema: 'x' } }, 'response_format.json_schema.schema'],
  ];
  for (const [name, rf, param] of badFormats) {
    it(`${name}: 400 naming ${param}`, async () => {
      const r = await post(chatBody('echo', 'x', { response_format: rf }));
      assert.equal(r.status, 400, r.text);
      assert.equal(r.json.error.param, param, r.text);
    });
  }
});

describe('heartbeats', () => {
  const beats = (res) => res.text.split('\n').filter((l) => l === ': keep-alive').length;

  it('a silent CLI: ": keep-alive" comments until the answer, which is whole', async () => {
    const res = await stream(chatBody('thinker', 'x'));
    assert.equal(res.status, 200, res.text);
    // 1.5 s of silence with a 300 ms interval: some beats, however loaded the machine.
    assert.ok(beats(res) >= 1, `no heartbeat in: ${res.text}`);
    assert.ok(res.text.indexOf(': keep-alive') < res.text.indexOf('data: '), 'the first beat comes before any data');
    const cs = chunks(res);
    assert.equal(streamedText(cs), 'late');
    assert.equal(cs[0].choices[0].delta.role, 'assistant');
    assert.deepEqual(finishOf(cs), ['stop']);
  });

  it('a CLI that fails after a heartbeat: the error is told in the stream', async () => {
    const res = await curlStream(srv, { method: 'POST', path: PATH, auth: true,
      body: chatBody('sleeper', 'x', { stream: true }) });
    assert.equal(res.status, 200, res.text); // sleeper times out after 1 s: beats came first
    assert.ok(beats(res) >= 1, res.text);
    assert.deepEqual(finishOf(chunks(res)), ['error']);
  });

  // The beats come from the run's own thread (the sandbox supervisor's tick), hop after
  // hop: under the headers of the hop that answers, and a first hop silent past a beat has
  // committed the stream, so its failure is the answer (docs/openai-compat.md).
  it('a chain: beats through the next hop, and a beat before a failure ends the chain', async () => {
    const registry = testRegistry();
    const silent = (name, script) => ({ ...fixed(name, ''), argv: ['/bin/sh', '-c', `cat >/dev/null; ${script}`] });
    registry.providers.failer = silent('failer', 'exit 1');
    registry.providers['slow-failer'] = silent('slow-failer', 'sleep 2.5; exit 1');
    registry.providers['slow-thinker'] = silent('slow-thinker', 'sleep 3; printf late');
    registry.providers.answerer = fixed('answerer', 'direct');
    const hop = (name) => ({ provider: name, model: name });
    const chained = await startServer({ registry, config: {
      ...testConfig(),
      streaming: { heartbeat_interval_ms: 1000 },
      routing: { chains: {
        'fail-think': [hop('failer'), hop('slow-thinker')],
        'slow-fail-answer': [hop('slow-failer'), hop('answerer')],
      } },
    } });
    try {
      const req = (model) => curlStream(chained, { method: 'POST', path: PATH, auth: true,
        body: chatBody(model, 'x', { stream: true }) });
      const a = await req('fail-think');
      assert.equal(a.status, 200, a.text);
      assert.equal(a.headers['x-olp-model-used'], 'slow-thinker', a.text);
      assert.equal(a.headers['x-olp-fallback-hops'], '1');
      assert.ok(beats(a) >= 1, a.text);
      assert.equal(streamedText(chunks(a)), 'late');
      assert.deepEqual(finishOf(chunks(a)), ['stop']);

      const b = await req('slow-fail-answer');
      assert.equal(b.status, 200, b.text);
      assert.equal(b.headers['x-olp-model-used'], 'slow-failer', b.text);
      assert.equal(b.headers['x-olp-fallback-hops'], '0');
      assert.ok(beats(b) >= 1, b.text);
      assert.equal(streamedText(chunks(b)), '');
      assert.deepEqual(finishOf(chunks(b)), ['error']);
    } finally {
      await chained.stop();
    }
  });

  it('not streamed: no heartbeat, plain JSON', async () => {
    const r = await post(chatBody('thinker', 'x'));
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.choices[0].message.content, 'late');
  });

  it('off (0): no comment at all', async () => {
    const quiet = await startServer({ registry: (() => {
      const reg = testRegistry();
      reg.providers.thinker = { ...fixed('thinker', ''), argv: ['/bin/sh', '-c', 'cat >/dev/null; sleep 1; printf late'] };
      return reg;
    })(), config: { ...testConfig(), streaming: { heartbeat_interval_ms: 0 } } });
    try {
      const res = await curlStream(quiet, { method: 'POST', path: PATH, auth: true,
        body: chatBody('thinker', 'x', { stream: true }) });
      assert.equal(beats(res), 0, res.text);
      assert.equal(streamedText(chunks(res)), 'late');
    } finally {
      await quiet.stop();
    }
  });
});

describe('afterwards', () => {
  it('no worker died along the way', async () => {
    assert.deepEqual(srv.workerPids(), initialWorkers, 'a worker was restarted by lighttpd');
  });
});

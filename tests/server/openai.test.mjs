// The real server on the demo model, driven by the official openai client (and raw fetch for the
// error cases). Run: TOKENSPEED_BIN=build/tokenspeed node --test tests/server/openai.test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, postJson, metrics, tokenIds, sleep, CODE_PROMPTS } from './lib.mjs';

let srv;
let client;
let MODEL;
let haveChat = true;  // false while this build lacks the Jinja engine (src/chat)

before(async () => {
  srv = await startServer(['--max-request-bytes', '1000000']);
  client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'none', maxRetries: 0, timeout: 120000 });
  const models = await client.models.list();
  MODEL = models.data[0].id;
  const probe = await postJson(`${srv.url}/v1/chat/completions`, { messages: [{ role: 'user', content: 'hi' }], max_tokens: 1 });
  haveChat = !(probe.status !== 200 && /no Jinja engine/.test(probe.text));
});

after(async () => {
  if (srv) {
    const r = await srv.stop();
    assert.equal(r.code, 0, `server exit ${JSON.stringify(r)}\n${srv.log()}`);
  }
});

test('GET /v1/models and /health', async () => {
  const models = await client.models.list();
  assert.equal(models.data.length, 1);
  assert.equal(models.data[0].id, 'pycoder');
  assert.equal(models.data[0].owned_by, 'tokenspeed');
  assert.equal(models.data[0].max_model_len, 4096);
  const h = await fetch(`${srv.url}/health`);
  assert.equal(h.status, 200);
  const one = await client.models.retrieve(MODEL);
  assert.equal(one.id, MODEL);
});

test('completion: OpenAI shape, greedy is deterministic', async () => {
  const r = await client.completions.create({ model: MODEL, prompt: 'def fibonacci(n):\n', max_tokens: 16, temperature: 0 });
  assert.match(r.id, /^cmpl-/);
  assert.equal(r.object, 'text_completion');
  assert.equal(r.model, MODEL);
  assert.equal(typeof r.created, 'number');
  assert.equal(r.choices.length, 1);
  const c = r.choices[0];
  assert.equal(c.index, 0);
  assert.equal(typeof c.text, 'string');
  assert.ok(['stop', 'length'].includes(c.finish_reason));
  assert.equal(c.logprobs, null);
  assert.ok(r.usage.prompt_tokens > 0);
  assert.ok(r.usage.completion_tokens > 0 && r.usage.completion_tokens <= 16);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, 'number');
  const again = await client.completions.create({ model: MODEL, prompt: 'def fibonacci(n):\n', max_tokens: 16, temperature: 0 });
  assert.equal(again.choices[0].text, c.text);
});

test('completion: token-id prompt, batch, n, ignore_eos, stop, seed, logprobs, echo', async () => {
  const ids = tokenIds(20, 7);
  const r = await client.completions.create({ model: MODEL, prompt: ids, max_tokens: 8, temperature: 0, ignore_eos: true });
  assert.equal(r.usage.prompt_tokens, 20);
  assert.equal(r.usage.completion_tokens, 8);
  assert.equal(r.choices[0].finish_reason, 'length');

  const batch = await client.completions.create({ model: MODEL, prompt: ['def add(a, b):\n', 'import os\n'], max_tokens: 4, temperature: 0, n: 2 });
  assert.equal(batch.choices.length, 4);
  assert.deepEqual(batch.choices.map((c) => c.index), [0, 1, 2, 3]);
  assert.equal(batch.choices[0].text, batch.choices[1].text);  // greedy: n copies agree

  const seeded = async () => (await client.completions.create({ model: MODEL, prompt: 'class A:\n', max_tokens: 12, temperature: 1, seed: 1234, top_p: 0.9, top_k: 50 })).choices[0].text;
  assert.equal(await seeded(), await seeded());

  const lp = await client.completions.create({ model: MODEL, prompt: 'for i in range(10):\n', max_tokens: 5, temperature: 0, logprobs: 3, ignore_eos: true });
  const L = lp.choices[0].logprobs;
  assert.equal(L.tokens.length, 5);
  assert.equal(L.token_logprobs.length, 5);
  assert.equal(L.top_logprobs.length, 5);
  assert.equal(L.text_offset.length, 5);
  for (const v of L.token_logprobs) assert.ok(v <= 0);
  for (const t of L.top_logprobs) assert.ok(Object.keys(t).length >= 1 && Object.keys(t).length <= 3);
  assert.equal(L.tokens.join(''), lp.choices[0].text);

  const echo = await client.completions.create({ model: MODEL, prompt: 'def add(a, b):\n', max_tokens: 4, temperature: 0, echo: true, logprobs: 1 });
  assert.ok(echo.choices[0].text.startsWith('def add(a, b):\n'));
  assert.equal(echo.choices[0].logprobs.token_logprobs[0], null);

  const stop = await client.completions.create({ model: MODEL, prompt: 'def fibonacci(n):\n', max_tokens: 32, temperature: 0, stop: ['\n'] });
  assert.ok(!stop.choices[0].text.includes('\n'));
});

test('completion: streaming with include_usage matches the non-streamed text', async () => {
  const prompt = 'def is_prime(n):\n    if n < 2:\n';
  const solo = await client.completions.create({ model: MODEL, prompt, max_tokens: 16, temperature: 0 });
  const stream = await client.completions.create({ model: MODEL, prompt, max_tokens: 16, temperature: 0, stream: true, stream_options: { include_usage: true } });
  let text = '';
  let finish = null;
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    assert.match(chunk.id, /^cmpl-/);
    if (chunk.usage) {
      usage = chunk.usage;
      assert.deepEqual(chunk.choices, []);
      continue;
    }
    text += chunk.choices[0].text;
    if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
  }
  assert.ok(chunks >= 2);
  assert.equal(text, solo.choices[0].text);
  assert.equal(finish, solo.choices[0].finish_reason);
  assert.deepEqual(usage, solo.usage);
});

test('raw SSE framing: data lines, [DONE] last', async () => {
  const r = await fetch(`${srv.url}/v1/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: 'x = ', max_tokens: 3, stream: true, ignore_eos: true }),
  });
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /text\/event-stream/);
  const body = await r.text();
  const events = body.split('\n\n').filter((e) => e.length);
  assert.equal(events.at(-1), 'data: [DONE]');
  for (const e of events.slice(0, -1)) JSON.parse(e.replace(/^data: /, ''));
});

test('32 parallel streams each equal their solo greedy output', async () => {
  const prompts = Array.from({ length: 32 }, (_, i) => `${CODE_PROMPTS[i % CODE_PROMPTS.length]}# case ${i}\n`);
  const solo = [];
  for (const p of prompts) solo.push(await client.completions.create({ model: MODEL, prompt: p, max_tokens: 16, temperature: 0 }));
  const results = await Promise.all(prompts.map(async (p) => {
    const s = await client.completions.create({ model: MODEL, prompt: p, max_tokens: 16, temperature: 0, stream: true, stream_options: { include_usage: true } });
    let text = '';
    let usage = null;
    let finish = null;
    for await (const ch of s) {
      if (ch.usage) usage = ch.usage;
      if (ch.choices.length) {
        text += ch.choices[0].text;
        if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
      }
    }
    return { text, usage, finish };
  }));
  results.forEach((r, i) => {
    assert.equal(r.text, solo[i].choices[0].text, `stream ${i}`);
    assert.equal(r.finish, solo[i].choices[0].finish_reason, `stream ${i}`);
    assert.equal(r.usage.completion_tokens, solo[i].usage.completion_tokens, `stream ${i}`);
    assert.equal(r.usage.prompt_tokens, solo[i].usage.prompt_tokens, `stream ${i}`);
  });
});

test('prefix reuse: the second of two identical ~600-token prompts is cached', async () => {
  const prompt = tokenIds(600, 99);
  const a = await client.completions.create({ model: MODEL, prompt, max_tokens: 4, temperature: 0 });
  const b = await client.completions.create({ model: MODEL, prompt, max_tokens: 4, temperature: 0 });
  assert.equal(a.usage.prompt_tokens, 600);
  assert.ok(b.usage.prompt_tokens_details.cached_tokens >= 600 - 64, `cached ${b.usage.prompt_tokens_details.cached_tokens}`);
  assert.equal(b.choices[0].text, a.choices[0].text);
  const m = await metrics(srv.url);
  assert.ok(m.values.tokenspeed_cached_prompt_tokens_total >= 536);
});

test('client disconnect mid-stream aborts the request', async () => {
  const s = await client.completions.create({ model: MODEL, prompt: tokenIds(16, 3), max_tokens: 3000, temperature: 0, ignore_eos: true, stream: true });
  let n = 0;
  for await (const ch of s) {
    if (ch.choices.length && ++n >= 3) break;  // leaving the loop aborts the HTTP request
  }
  let running = -1;
  let waiting = -1;
  for (let i = 0; i < 200; i++) {
    const m = await metrics(srv.url);
    running = m.values.tokenspeed_num_requests_running;
    waiting = m.values.tokenspeed_num_requests_waiting;
    if (running === 0 && waiting === 0) break;
    await sleep(50);
  }
  assert.equal(running, 0);
  assert.equal(waiting, 0);
  const m = await metrics(srv.url);
  assert.ok(m.values.tokenspeed_requests_aborted_total >= 1);
  assert.ok(m.values.tokenspeed_generation_tokens_total < 3000 + 2000);
});

test('/metrics: Prometheus exposition', async () => {
  const { text, values } = await metrics(srv.url);
  for (const name of ['tokenspeed_requests_total', 'tokenspeed_prompt_tokens_total', 'tokenspeed_generation_tokens_total',
    'tokenspeed_cached_prompt_tokens_total', 'tokenspeed_num_requests_running', 'tokenspeed_num_requests_waiting',
    'tokenspeed_kv_cache_usage_ratio', 'tokenspeed_prefix_cache_hit_rate', 'tokenspeed_engine_step_host_time_us']) {
    assert.ok(name in values, `${name} missing`);
  }
  assert.match(text, /# TYPE tokenspeed_time_to_first_token_seconds histogram/);
  assert.match(text, /tokenspeed_time_to_first_token_seconds_bucket\{le="\+Inf"\} [1-9]/);
  assert.match(text, /tokenspeed_inter_token_latency_seconds_bucket\{le="\+Inf"\} [1-9]/);
  assert.ok(values.tokenspeed_requests_total > 0);
  // The device idle breakdown (by the step after the gap) sums to the idle total; its gap
  // histogram is well-formed.
  assert.match(text, /tokenspeed_device_idle_seconds_by_step_total\{model_name="[^"]*",kind="decode",launch="overlap"\} /);
  assert.ok(Math.abs(values.tokenspeed_device_idle_seconds_by_step_total - values.tokenspeed_device_idle_seconds_total) < 1e-6);
  assert.match(text, /# TYPE tokenspeed_device_idle_gap_seconds histogram/);
  assert.ok(values.tokenspeed_device_idle_gap_seconds_count >= 0);
});

test('chat: plain and streaming', async (t) => {
  if (!haveChat) return t.skip('no Jinja engine in this build');
  const messages = [{ role: 'system', content: 'You write Python.' }, { role: 'user', content: 'Write a function that adds two numbers.' }];
  const r = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 16, temperature: 0 });
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 10);

  const s = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 16, temperature: 0, stream: true, stream_options: { include_usage: true } });
  let first = null;
  let content = '';
  let finish = null;
  let usage = null;
  for await (const ch of s) {
    assert.equal(ch.object, 'chat.completion.chunk');
    if (!first && ch.choices.length) first = ch.choices[0].delta;
    if (ch.usage) usage = ch.usage;
    if (!ch.choices.length) continue;
    if (ch.choices[0].delta.content) content += ch.choices[0].delta.content;
    if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
  }
  assert.equal(first.role, 'assistant');
  assert.equal(content, r.choices[0].message.content);
  assert.equal(finish, r.choices[0].finish_reason);
  assert.deepEqual(usage, r.usage);

  // content parts and chat_template_kwargs are accepted
  const parts = await client.chat.completions.create({ model: MODEL, max_tokens: 4, temperature: 0,
    messages: [{ role: 'user', content: [{ type: 'text', text: 'Write a function' }, { type: 'text', text: 'that adds.' }] }],
    chat_template_kwargs: { enable_thinking: false } });
  assert.equal(parts.choices.length, 1);
});

test('chat: tool round trip renders and answers 200', async (t) => {
  if (!haveChat) return t.skip('no Jinja engine in this build');
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather for a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
  const r = await client.chat.completions.create({ model: MODEL, max_tokens: 8, temperature: 0, tools,
    messages: [
      { role: 'user', content: 'Weather in Paris?' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: '{"temp_c": 21}' },
    ] });
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  const named = await client.chat.completions.create({ model: MODEL, max_tokens: 4, temperature: 0, tools,
    tool_choice: { type: 'function', function: { name: 'get_weather' } }, messages: [{ role: 'user', content: 'Paris?' }] });
  assert.equal(named.choices.length, 1);
});

test('bad input: OpenAI error bodies with the right status, server keeps serving', async () => {
  const C = `${srv.url}/v1/completions`;
  const CH = `${srv.url}/v1/chat/completions`;
  const expectErr = async (res, status, re, param) => {
    const r = await res;
    assert.equal(r.status, status, r.text);
    assert.ok(r.json && r.json.error, r.text);
    for (const k of ['message', 'type', 'param', 'code']) assert.ok(k in r.json.error, `${k} in ${r.text}`);
    if (re) assert.match(r.json.error.message, re);
    if (param !== undefined) assert.equal(r.json.error.param, param);
    return r.json.error;
  };
  await expectErr(postJson(C, '{"prompt": "x",'), 400, /JSON/);
  await expectErr(postJson(C, { prompt: 'x', max_tokens: '16' }), 400, /integer/, 'max_tokens');
  await expectErr(postJson(C, { prompt: 'x', temperature: 'hot' }), 400, /number/, 'temperature');
  await expectErr(postJson(C, { prompt: 'x', stream: 1 }), 400, /boolean/, 'stream');
  await expectErr(postJson(C, { prompt: 'x', max_tokens: 0 }), 400, /max_tokens/, 'max_tokens');
  await expectErr(postJson(C, { prompt: 'x', max_tokens: -1 }), 400, /max_tokens/, 'max_tokens');
  await expectErr(postJson(C, { prompt: 'x', temperature: -0.5 }), 400, /temperature/, 'temperature');
  await expectErr(postJson(C, { prompt: 'x', top_p: 0 }), 400, /top_p/, 'top_p');
  await expectErr(postJson(C, { prompt: 'x', top_p: 1.5 }), 400, /top_p/, 'top_p');
  await expectErr(postJson(C, { prompt: 'x', top_k: -2 }), 400, /top_k/, 'top_k');
  await expectErr(postJson(C, { prompt: 'x', n: 0 }), 400, /'n'/, 'n');
  const long = await expectErr(postJson(C, { prompt: tokenIds(5000, 1) }), 400, /maximum context length is 4096 tokens/);
  assert.match(long.message, /you requested 5016 tokens \(5000 in the prompt, 16 for the completion\)/);
  const over = await expectErr(postJson(C, { prompt: tokenIds(100, 1), max_tokens: 4000 }), 400, /maximum context length is 4096/);
  assert.match(over.message, /4100 tokens \(100 in the prompt, 4000 for the completion\)/);
  await expectErr(postJson(C, { prompt: '' }), 400, /empty/, 'prompt');
  await expectErr(postJson(C, { prompt: [] }), 400, /empty/, 'prompt');
  await expectErr(postJson(C, { prompt: [1, 2, 8192] }), 400, /vocabulary/, 'prompt');
  await expectErr(postJson(C, { prompt: [-3] }), 400, /vocabulary/, 'prompt');
  const nf = await expectErr(postJson(C, { model: 'gpt-5', prompt: 'x' }), 404, /gpt-5/);
  assert.equal(nf.code, 'model_not_found');
  await expectErr(postJson(C, JSON.stringify({ prompt: 'x'.repeat(1100000) })), 413, /larger than/);
  const badUtf8 = new Uint8Array([...Buffer.from('{"prompt": "a'), 0xff, 0xfe, ...Buffer.from('"}')]);
  await expectErr(postJson(C, badUtf8), 400, /JSON/);
  await expectErr(postJson(`${srv.url}/v1/nope`, {}), 404, /not found/);
  const wrong = await fetch(C);
  assert.equal(wrong.status, 405);
  assert.ok((await wrong.json()).error);
  const wrong2 = await fetch(`${srv.url}/v1/models`, { method: 'DELETE' });
  assert.equal(wrong2.status, 405);

  const u = [{ role: 'user', content: 'hi' }];
  await expectErr(postJson(CH, { messages: [{ role: 'robot', content: 'x' }] }), 400, /robot/, 'messages[0].role');
  await expectErr(postJson(CH, { messages: [{ role: 'user' }] }), 400, /content/, 'messages[0].content');
  await expectErr(postJson(CH, { messages: [] }), 400, /empty/, 'messages');
  await expectErr(postJson(CH, { messages: u, tools: [{ type: 'function', function: { description: 'no name' } }] }), 400, /name/, 'tools[0].function.name');
  await expectErr(postJson(CH, { messages: u, tools: [{ type: 'code_interpreter', function: { name: 'f' } }] }), 400, /function/, 'tools[0].type');
  // Structured outputs are served (tests/server/structured.test.mjs); malformed ones are 400s naming the field.
  await expectErr(postJson(CH, { messages: u, response_format: { type: 'xml' } }), 400, /json_object or json_schema/, 'response_format');
  await expectErr(postJson(CH, { messages: u, response_format: { type: 'json_schema' } }), 400, /json_schema/, 'response_format.json_schema');
  if (haveChat) await expectErr(postJson(CH, { messages: u, max_tokens: 5000 }), 400, /maximum context length is 4096/);
  await expectErr(postJson(CH, { model: 'nope', messages: u }), 404, /nope/);

  // still serving
  const ok = await client.completions.create({ model: MODEL, prompt: 'x = 1\n', max_tokens: 2 });
  assert.equal(ok.choices.length, 1);
});

test('overload queues instead of rejecting (100 concurrent requests)', async () => {
  const rs = await Promise.all(Array.from({ length: 100 }, (_, i) =>
    postJson(`${srv.url}/v1/completions`, { prompt: tokenIds(8, i + 1), max_tokens: 4, ignore_eos: true, temperature: 0 })));
  for (const r of rs) {
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.usage.completion_tokens, 4);
  }
});

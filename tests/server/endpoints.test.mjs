// The endpoints beside chat/completions on the real server and demo model: /tokenize,
// /detokenize, /version (fetch), /v1/responses and /v1/embeddings (the openai client),
// /v1/messages (the @anthropic-ai/sdk client), --api-key, and the vLLM/OpenAI request fields
// (prompt_logprobs, echo logprobs, stop_reason, include_stop_str_in_output, developer role,
// max_completion_tokens). Run: TOKENSPEED_BIN=build/tokenspeed node --test tests/server/endpoints.test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, postJson } from './lib.mjs';

let srv;
let client;
let anthropic;
const HIDDEN = 384;  // models/pycoder hidden_size

before(async () => {
  srv = await startServer(['--responses-store-size', '2']);
  client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'none', maxRetries: 0, timeout: 120000 });
  anthropic = new Anthropic({ baseURL: srv.url, apiKey: 'none', maxRetries: 0, timeout: 120000 });
});

after(async () => {
  if (srv) {
    const r = await srv.stop();
    assert.equal(r.code, 0, `server exit ${JSON.stringify(r)}\n${srv.log()}`);
  }
});

const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));

test('/version, /tokenize, /detokenize', async () => {
  const v = await (await fetch(`${srv.url}/version`)).json();
  assert.equal(typeof v.version, 'string');

  const t = await postJson(`${srv.url}/tokenize`, { prompt: 'def fibonacci(n):', return_token_strs: true });
  assert.equal(t.status, 200, t.text);
  assert.equal(t.json.count, t.json.tokens.length);
  assert.equal(t.json.max_model_len, 4096);
  assert.equal(t.json.tokens[0], 0);  // add_special_tokens defaults to true for prompts: BOS
  assert.equal(t.json.token_strs.length, t.json.count);
  const plain = await postJson(`${srv.url}/tokenize`, { prompt: 'def fibonacci(n):', add_special_tokens: false });
  assert.deepEqual(plain.json.tokens, t.json.tokens.slice(1));
  assert.equal(plain.json.token_strs, null);

  const d = await postJson(`${srv.url}/detokenize`, { tokens: plain.json.tokens });
  assert.equal(d.status, 200, d.text);
  assert.equal(d.json.prompt, 'def fibonacci(n):');

  const msgs = await postJson(`${srv.url}/tokenize`, { messages: [{ role: 'user', content: 'hi' }] });
  assert.equal(msgs.status, 200, msgs.text);
  const noGen = await postJson(`${srv.url}/tokenize`, { messages: [{ role: 'user', content: 'hi' }], add_generation_prompt: false });
  assert.ok(noGen.json.count < msgs.json.count);
  // developer is system to the chat template
  const dev = await postJson(`${srv.url}/tokenize`, { messages: [{ role: 'developer', content: 'Be brief.' }, { role: 'user', content: 'hi' }] });
  const sys = await postJson(`${srv.url}/tokenize`, { messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'hi' }] });
  assert.deepEqual(dev.json.tokens, sys.json.tokens);

  assert.equal((await postJson(`${srv.url}/tokenize`, { prompt: 'a', messages: [] })).status, 400);
  assert.equal((await postJson(`${srv.url}/detokenize`, { tokens: [999999] })).status, 400);
  assert.equal((await fetch(`${srv.url}/tokenize`)).status, 405);
});

test('/v1/responses: text, usage, retrieve, store bound', async () => {
  const r = await client.responses.create({ model: 'pycoder', input: 'Write a haiku', max_output_tokens: 8, temperature: 0 });
  assert.match(r.id, /^resp_/);
  assert.equal(r.object, 'response');
  assert.ok(['completed', 'incomplete'].includes(r.status));
  assert.equal(typeof r.output_text, 'string');
  assert.ok(r.output_text.length > 0);
  assert.equal(r.output[0].type, 'message');
  assert.ok(r.usage.input_tokens > 0 && r.usage.output_tokens > 0 && r.usage.output_tokens <= 8);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  const again = await client.responses.retrieve(r.id);
  assert.equal(again.id, r.id);
  assert.equal(again.output[0].content[0].text, r.output_text);

  // items input, instructions
  const items = await client.responses.create({
    model: 'pycoder', instructions: 'Answer in one word.', max_output_tokens: 4, temperature: 0,
    input: [{ role: 'user', content: [{ type: 'input_text', text: 'hello' }] }],
  });
  assert.equal(items.instructions, 'Answer in one word.');

  // store: false is not kept; the store holds 2 (--responses-store-size): the oldest goes
  const nostore = await client.responses.create({ model: 'pycoder', input: 'x', max_output_tokens: 2, store: false });
  await assert.rejects(client.responses.retrieve(nostore.id), (e) => e.status === 404);
  await client.responses.create({ model: 'pycoder', input: 'y', max_output_tokens: 2 });
  await assert.rejects(client.responses.retrieve(r.id), (e) => e.status === 404);
});

test('/v1/responses: previous_response_id continues the conversation', async () => {
  const first = await client.responses.create({ model: 'pycoder', input: 'My name is Ada.', max_output_tokens: 6, temperature: 0 });
  const second = await client.responses.create({ model: 'pycoder', input: 'What is my name?', max_output_tokens: 6, temperature: 0, previous_response_id: first.id });
  assert.equal(second.previous_response_id, first.id);
  const alone = await client.responses.create({ model: 'pycoder', input: 'What is my name?', max_output_tokens: 6, temperature: 0 });
  // the first turn and its answer are in the second prompt
  assert.ok(second.usage.input_tokens > alone.usage.input_tokens + first.usage.output_tokens);
  await assert.rejects(
    client.responses.create({ model: 'pycoder', input: 'x', previous_response_id: 'resp_missing' }),
    (e) => e.status === 404,
  );
});

test('/v1/responses: streaming events', async () => {
  const stream = await client.responses.create({ model: 'pycoder', input: 'Count to five', max_output_tokens: 10, temperature: 0, stream: true });
  const types = [];
  let text = '';
  let done = null;
  let lastSeq = -1;
  for await (const ev of stream) {
    types.push(ev.type);
    assert.ok(ev.sequence_number > lastSeq);
    lastSeq = ev.sequence_number;
    if (ev.type === 'response.output_text.delta') text += ev.delta;
    if (ev.type === 'response.completed' || ev.type === 'response.incomplete') done = ev.response;
  }
  assert.equal(types[0], 'response.created');
  assert.equal(types[1], 'response.in_progress');
  assert.ok(types.includes('response.output_item.added'));
  assert.ok(types.includes('response.output_text.delta'));
  assert.ok(types.includes('response.output_text.done'));
  assert.ok(types.includes('response.output_item.done'));
  assert.ok(done);
  assert.equal(done.output[0].content[0].text, text);
  const solo = await client.responses.create({ model: 'pycoder', input: 'Count to five', max_output_tokens: 10, temperature: 0 });
  assert.equal(solo.output_text, text);
  // the streamed response is stored with its streamed ids
  const kept = await client.responses.retrieve(done.id);
  assert.equal(kept.output[0].id, done.output[0].id);
});

test('/v1/responses: function tools and function_call_output items are accepted', async () => {
  const tools = [{ type: 'function', name: 'get_weather', description: 'Weather for a city', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }];
  const r = await client.responses.create({
    model: 'pycoder', tools, max_output_tokens: 6, temperature: 0,
    input: [
      { role: 'user', content: 'Weather in Paris?' },
      { type: 'function_call', call_id: 'call_1', name: 'get_weather', arguments: '{"city":"Paris"}' },
      { type: 'function_call_output', call_id: 'call_1', output: '{"temp": 21}' },
    ],
  });
  assert.equal(r.tools[0].name, 'get_weather');
  assert.ok(r.output.length >= 1);
  const bad = await postJson(`${srv.url}/v1/responses`, { input: [{ type: 'web_search_call' }] });
  assert.equal(bad.status, 400);
});

test('/v1/embeddings: pooled, normalized, base64, dimensions, token inputs', async () => {
  const one = await client.embeddings.create({ model: 'pycoder', input: 'def add(a, b):', encoding_format: 'float' });
  assert.equal(one.object, 'list');
  assert.equal(one.data.length, 1);
  const v = one.data[0].embedding;
  assert.equal(v.length, HIDDEN);
  assert.ok(Math.abs(norm(v) - 1) < 1e-4);
  assert.ok(one.usage.prompt_tokens > 0);

  // the client's default is base64; it decodes to the same floats
  const b64 = await client.embeddings.create({ model: 'pycoder', input: 'def add(a, b):' });
  assert.equal(b64.data[0].embedding.length, HIDDEN);
  for (let i = 0; i < HIDDEN; i++) assert.ok(Math.abs(b64.data[0].embedding[i] - v[i]) < 1e-6);

  const batch = await client.embeddings.create({ model: 'pycoder', input: ['def add(a, b):', 'import os'], encoding_format: 'float' });
  assert.deepEqual(batch.data.map((d) => d.index), [0, 1]);
  for (let i = 0; i < HIDDEN; i++) assert.ok(Math.abs(batch.data[0].embedding[i] - v[i]) < 1e-4);
  const cos = batch.data[0].embedding.reduce((s, x, i) => s + x * batch.data[1].embedding[i], 0);
  assert.ok(cos < 0.9999);  // different inputs, different vectors

  const ids = (await postJson(`${srv.url}/tokenize`, { prompt: 'def add(a, b):' })).json.tokens;
  const byIds = await client.embeddings.create({ model: 'pycoder', input: ids, encoding_format: 'float' });
  for (let i = 0; i < HIDDEN; i++) assert.ok(Math.abs(byIds.data[0].embedding[i] - v[i]) < 1e-4);

  const small = await client.embeddings.create({ model: 'pycoder', input: 'def add(a, b):', dimensions: 16, encoding_format: 'float' });
  assert.equal(small.data[0].embedding.length, 16);
  assert.ok(Math.abs(norm(small.data[0].embedding) - 1) < 1e-4);
  await assert.rejects(client.embeddings.create({ model: 'pycoder', input: 'x', dimensions: 100000 }), (e) => e.status === 400);
  await assert.rejects(client.embeddings.create({ model: 'pycoder', input: '' }), (e) => e.status === 400);
});

test('/v1/messages: text, usage, stop_sequences, system', async () => {
  const m = await anthropic.messages.create({ model: 'pycoder', max_tokens: 12, temperature: 0, system: 'You are terse.', messages: [{ role: 'user', content: 'Say hello' }] });
  assert.match(m.id, /^msg_/);
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.equal(m.content[0].type, 'text');
  assert.ok(['end_turn', 'max_tokens'].includes(m.stop_reason));
  assert.ok(m.usage.input_tokens > 0 && m.usage.output_tokens > 0 && m.usage.output_tokens <= 12);
  const text = m.content[0].text;
  if (text.length > 3) {
    const stopAt = text.slice(2, 3);
    const s = await anthropic.messages.create({ model: 'pycoder', max_tokens: 12, temperature: 0, system: 'You are terse.', stop_sequences: [stopAt], messages: [{ role: 'user', content: 'Say hello' }] });
    assert.equal(s.stop_reason, 'stop_sequence');
    assert.equal(s.stop_sequence, stopAt);
    assert.ok(!s.content[0].text.includes(stopAt));
  }
  const c = await anthropic.messages.countTokens({ model: 'pycoder', system: 'You are terse.', messages: [{ role: 'user', content: 'Say hello' }] });
  assert.equal(c.input_tokens, m.usage.input_tokens + (m.usage.cache_read_input_tokens ?? 0));
});

test('/v1/messages: streaming matches the non-streamed text', async () => {
  const params = { model: 'pycoder', max_tokens: 10, temperature: 0, messages: [{ role: 'user', content: [{ type: 'text', text: 'Count to five' }] }] };
  const solo = await anthropic.messages.create(params);
  const types = [];
  let text = '';
  const stream = await anthropic.messages.create({ ...params, stream: true });
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') text += ev.delta.text;
  }
  assert.equal(types[0], 'message_start');
  assert.equal(types.at(-1), 'message_stop');
  assert.ok(types.includes('content_block_start') && types.includes('content_block_stop') && types.includes('message_delta'));
  assert.equal(text, solo.content[0].text);
  const final = await anthropic.messages.stream(params).finalMessage();
  assert.equal(final.content[0].text, solo.content[0].text);
  assert.equal(final.stop_reason, solo.stop_reason);
});

test('/v1/messages: tools, tool_use and tool_result history; errors in Anthropic shape', async () => {
  const tools = [{ name: 'get_weather', description: 'Weather for a city', input_schema: { type: 'object', properties: { city: { type: 'string' } } } }];
  const m = await anthropic.messages.create({
    model: 'pycoder', max_tokens: 6, temperature: 0, tools, tool_choice: { type: 'auto' },
    messages: [
      { role: 'user', content: 'Weather in Paris?' },
      { role: 'assistant', content: [{ type: 'text', text: 'Let me check.' }, { type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: { city: 'Paris' } }] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: '21 C' }] },
    ],
  });
  assert.equal(m.type, 'message');
  const bad = await postJson(`${srv.url}/v1/messages`, { messages: [{ role: 'user', content: 'hi' }] });
  assert.equal(bad.status, 400);
  assert.equal(bad.json.type, 'error');
  assert.equal(bad.json.error.type, 'invalid_request_error');
  assert.match(bad.json.error.message, /max_tokens/);
  await assert.rejects(anthropic.messages.create({ model: 'pycoder', max_tokens: 4, messages: [{ role: 'system', content: 'x' }] }), (e) => e.status === 400);
});

test('completions: prompt_logprobs, echo logprobs, stop_reason, include_stop_str_in_output, max_completion_tokens', async () => {
  const prompt = 'def add(a, b):\n';
  const r = await postJson(`${srv.url}/v1/completions`, { prompt, max_tokens: 2, temperature: 0, prompt_logprobs: 2 });
  assert.equal(r.status, 200, r.text);
  const pl = r.json.choices[0].prompt_logprobs;
  assert.equal(pl.length, r.json.usage.prompt_tokens);
  assert.equal(pl[0], null);
  const ids = (await postJson(`${srv.url}/tokenize`, { prompt })).json.tokens;
  for (let i = 1; i < pl.length; i++) {
    const e = pl[i][String(ids[i])];
    assert.ok(e && e.logprob <= 0 && e.rank >= 1, JSON.stringify(pl[i]));
    assert.ok(Object.keys(pl[i]).length >= 2 && Object.keys(pl[i]).length <= 3);
  }

  const echo = await client.completions.create({ model: 'pycoder', prompt, max_tokens: 3, temperature: 0, echo: true, logprobs: 1 });
  const L = echo.choices[0].logprobs;
  assert.equal(L.token_logprobs[0], null);
  const n = ids.length;
  for (let i = 1; i < n; i++) {
    assert.equal(typeof L.token_logprobs[i], 'number');
    assert.ok(Math.abs(L.token_logprobs[i] - pl[i][String(ids[i])].logprob) < 1e-4);
  }
  // the first generated token's logprob equals a prompt logprob of the prompt extended by it
  const gen = await client.completions.create({ model: 'pycoder', prompt, max_tokens: 1, temperature: 0, logprobs: 0 });
  const ext = await postJson(`${srv.url}/v1/completions`, { prompt: prompt + gen.choices[0].text, max_tokens: 1, prompt_logprobs: 0 });
  const extIds = (await postJson(`${srv.url}/tokenize`, { prompt: prompt + gen.choices[0].text })).json.tokens;
  if (extIds.length === n + 1) {
    const last = ext.json.choices[0].prompt_logprobs[n][String(extIds[n])].logprob;
    assert.ok(Math.abs(last - gen.choices[0].logprobs.token_logprobs[0]) < 1e-3, `${last} vs ${gen.choices[0].logprobs.token_logprobs[0]}`);
  }

  // stop strings: stop_reason is the string; include_stop_str_in_output keeps it
  const free = await client.completions.create({ model: 'pycoder', prompt, max_tokens: 16, temperature: 0, ignore_eos: true });
  const full = free.choices[0].text;
  const stopStr = full.trim().slice(0, 2);
  if (stopStr.length === 2) {
    const s = await postJson(`${srv.url}/v1/completions`, { prompt, max_tokens: 16, temperature: 0, ignore_eos: true, stop: [stopStr] });
    assert.equal(s.json.choices[0].finish_reason, 'stop');
    assert.equal(s.json.choices[0].stop_reason, stopStr);
    assert.ok(!s.json.choices[0].text.includes(stopStr));
    const k = await postJson(`${srv.url}/v1/completions`, { prompt, max_tokens: 16, temperature: 0, ignore_eos: true, stop: [stopStr], include_stop_str_in_output: true });
    assert.ok(k.json.choices[0].text.endsWith(stopStr), JSON.stringify(k.json.choices[0]));
    const c = await postJson(`${srv.url}/v1/chat/completions`, { messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, temperature: 0, stop: ['zzzz'] });
    assert.ok('stop_reason' in c.json.choices[0]);
  }
  // stop_token_ids: stop_reason is the id
  const genIds = (await postJson(`${srv.url}/tokenize`, { prompt: prompt + full, add_special_tokens: true })).json.tokens;
  if (genIds.slice(0, n).every((t, i) => t === ids[i]) && genIds.length > n + 2) {
    const stopId = genIds[n + 2];
    const s = await postJson(`${srv.url}/v1/completions`, { prompt, max_tokens: 16, temperature: 0, ignore_eos: true, stop_token_ids: [stopId] });
    assert.equal(s.json.choices[0].finish_reason, 'stop');
    assert.equal(s.json.choices[0].stop_reason, stopId);
  }
  // no stop: null
  assert.equal(free.choices[0].stop_reason, null);

  const mct = await postJson(`${srv.url}/v1/chat/completions`, { messages: [{ role: 'user', content: 'hi' }], max_tokens: 10, max_completion_tokens: 3, ignore_eos: true });
  assert.equal(mct.json.usage.completion_tokens, 3);
});

test('--api-key (TOKENSPEED_API_KEY): 401 in OpenAI and Anthropic shapes; /health and /metrics open', async () => {
  process.env.TOKENSPEED_API_KEY = 'sk-test-123';
  let keyed;
  try {
    keyed = await startServer([]);
  } finally {
    delete process.env.TOKENSPEED_API_KEY;
  }
  try {
    assert.equal((await fetch(`${keyed.url}/health`)).status, 200);
    assert.equal((await fetch(`${keyed.url}/metrics`)).status, 200);
    const no = await fetch(`${keyed.url}/v1/models`);
    assert.equal(no.status, 401);
    const body = await no.json();
    assert.equal(body.error.type, 'authentication_error');
    assert.equal((await postJson(`${keyed.url}/tokenize`, { prompt: 'a' })).status, 401);
    const bad = new OpenAI({ baseURL: `${keyed.url}/v1`, apiKey: 'wrong', maxRetries: 0 });
    await assert.rejects(bad.models.list(), (e) => e.status === 401);
    const good = new OpenAI({ baseURL: `${keyed.url}/v1`, apiKey: 'sk-test-123', maxRetries: 0 });
    assert.equal((await good.models.list()).data.length, 1);
    const r = await good.responses.create({ model: 'pycoder', input: 'hi', max_output_tokens: 2 });
    assert.equal(r.object, 'response');

    const m = await postJson(`${keyed.url}/v1/messages`, { max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(m.status, 401);
    assert.equal(m.json.type, 'error');
    assert.equal(m.json.error.type, 'authentication_error');
    const ant = new Anthropic({ baseURL: keyed.url, apiKey: 'sk-test-123', maxRetries: 0 });  // sends x-api-key
    const ok = await ant.messages.create({ model: 'pycoder', max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(ok.type, 'message');
    const wrong = new Anthropic({ baseURL: keyed.url, apiKey: 'nope', maxRetries: 0 });
    await assert.rejects(wrong.messages.create({ model: 'pycoder', max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] }), (e) => e.status === 401);
  } finally {
    const r = await keyed.stop();
    assert.equal(r.code, 0);
  }
});

// What agent clients rely on (found by probing the server as the SDKs use it): tool_choice
// enforced on /v1/messages and /v1/responses, Responses' text.format, Anthropic's assistant
// prefill (continue_final_message), message_start usage with the prefix-cache split, incomplete
// Responses items, and OpenAI's legacy logprobs rules.
test('/v1/messages and /v1/responses: tool_choice and text.format are enforced', async () => {
  const input_schema = { type: 'object', properties: { city: { type: 'string', enum: ['Paris', 'Rome'] } }, required: ['city'], additionalProperties: false };
  const tools = [{ name: 'get_weather', description: 'Weather for a city', input_schema }];
  for (const tool_choice of [{ type: 'any' }, { type: 'tool', name: 'get_weather' }, { type: 'any', disable_parallel_tool_use: true }]) {
    const m = await anthropic.messages.create({ model: 'pycoder', max_tokens: 64, temperature: 0, tools, tool_choice, messages: [{ role: 'user', content: 'Weather in Paris?' }] });
    const use = m.content.find((b) => b.type === 'tool_use');
    assert.ok(use, `${JSON.stringify(tool_choice)}: ${JSON.stringify(m.content)}`);
    assert.equal(use.name, 'get_weather');
    assert.ok(['Paris', 'Rome'].includes(use.input.city), JSON.stringify(use.input));
    // One call allowed: the grammar ends after it. Otherwise the demo model may go on calling.
    if (tool_choice.disable_parallel_tool_use) assert.equal(m.stop_reason, 'tool_use');
    else assert.ok(['tool_use', 'max_tokens'].includes(m.stop_reason), m.stop_reason);
  }
  const fn = [{ type: 'function', name: 'get_weather', parameters: input_schema }];
  for (const tool_choice of ['required', { type: 'function', name: 'get_weather' }]) {
    const r = await client.responses.create({ model: 'pycoder', input: 'Weather in Paris?', max_output_tokens: 64, temperature: 0, tools: fn, tool_choice });
    const call = r.output.find((o) => o.type === 'function_call');
    assert.ok(call, `${JSON.stringify(tool_choice)}: ${JSON.stringify(r.output)}`);
    assert.equal(call.name, 'get_weather');
    assert.ok(['Paris', 'Rome'].includes(JSON.parse(call.arguments).city), call.arguments);
  }
  const schema = { type: 'object', properties: { a: { type: 'integer', minimum: 0, maximum: 9 } }, required: ['a'], additionalProperties: false };
  for (const stream of [false, true]) {
    const body = { model: 'pycoder', input: 'hi', max_output_tokens: 32, temperature: 0, text: { format: { type: 'json_schema', name: 'x', strict: true, schema } } };
    let text;
    if (!stream) text = (await client.responses.create(body)).output_text;
    else for await (const ev of await client.responses.create({ ...body, stream: true })) if (ev.type === 'response.output_text.done') text = ev.text;
    const v = JSON.parse(text);
    assert.ok(Number.isInteger(v.a) && v.a >= 0 && v.a <= 9 && Object.keys(v).length === 1, text);
  }
  const cut = await client.responses.create({ model: 'pycoder', input: 'Count to fifty', max_output_tokens: 2, temperature: 0, ignore_eos: true });
  assert.equal(cut.status, 'incomplete');
  assert.equal(cut.output.at(-1).status, 'incomplete');
  const bad = await postJson(`${srv.url}/v1/responses`, { input: 'hi', max_output_tokens: 0 });
  assert.equal(bad.status, 400);
  assert.equal(bad.json.error.param, 'max_output_tokens');
});

test('assistant prefill (continue_final_message) on /v1/messages, /tokenize and chat', async () => {
  const messages = [{ role: 'user', content: 'Write JSON' }, { role: 'assistant', content: '{"name":' }];
  const open = await postJson(`${srv.url}/tokenize`, { messages, continue_final_message: true, add_generation_prompt: false, return_token_strs: true });
  const closed = await postJson(`${srv.url}/tokenize`, { messages, add_generation_prompt: false });
  assert.equal(open.status, 200, open.text);
  assert.ok(open.json.count < closed.json.count);
  assert.deepEqual(closed.json.tokens.slice(0, open.json.count - 1), open.json.tokens.slice(0, -1));
  assert.ok(open.json.token_strs.join('').endsWith('{"name":'), JSON.stringify(open.json.token_strs.slice(-4)));
  // continue_final_message alone implies no generation prompt; both true is vLLM's 400
  const alone = await postJson(`${srv.url}/tokenize`, { messages, continue_final_message: true });
  assert.deepEqual(alone.json.tokens, open.json.tokens);
  const both = await postJson(`${srv.url}/tokenize`, { messages, continue_final_message: true, add_generation_prompt: true });
  assert.equal(both.status, 400);
  const c = await anthropic.messages.countTokens({ model: 'pycoder', messages });
  assert.equal(c.input_tokens, open.json.count);
  const m = await anthropic.messages.create({ model: 'pycoder', max_tokens: 4, temperature: 0, messages });
  assert.equal(m.usage.input_tokens + (m.usage.cache_read_input_tokens ?? 0), open.json.count);
  const ch = await postJson(`${srv.url}/v1/chat/completions`, { messages, max_tokens: 2, continue_final_message: true, add_generation_prompt: false });
  assert.equal(ch.status, 200, ch.text);
  assert.equal(ch.json.usage.prompt_tokens, open.json.count);
  const noGen = await postJson(`${srv.url}/v1/chat/completions`, { messages, max_tokens: 2, add_generation_prompt: false });
  assert.equal(noGen.json.usage.prompt_tokens, closed.json.count);
});

test('/v1/messages streaming: message_start usage splits the prefix-cache hit as the reply does', async () => {
  const long = Array.from({ length: 200 }, (_, i) => `w${i}`).join(' ');
  const params = { model: 'pycoder', max_tokens: 1, temperature: 0, messages: [{ role: 'user', content: long }] };
  const first = await anthropic.messages.create(params);
  const again = await anthropic.messages.create(params);
  assert.ok(again.usage.cache_read_input_tokens > 0, JSON.stringify(again.usage));
  let start, delta;
  for await (const ev of await anthropic.messages.create({ ...params, stream: true })) {
    if (ev.type === 'message_start') start = ev.message.usage;
    if (ev.type === 'message_delta') delta = ev.usage;
  }
  assert.equal(start.cache_read_input_tokens, again.usage.cache_read_input_tokens, JSON.stringify(start));
  assert.equal(start.input_tokens, again.usage.input_tokens);
  assert.equal(start.input_tokens + start.cache_read_input_tokens, first.usage.input_tokens + (first.usage.cache_read_input_tokens ?? 0));
  assert.equal(delta.output_tokens, 1);
});

test('completions logprobs: the sampled token is always in top_logprobs; text_offset counts characters', async () => {
  for (const logprobs of [0, 1, 3]) {
    const r = await client.completions.create({ model: 'pycoder', prompt: 'def f(x):', max_tokens: 4, temperature: 0, logprobs });
    const L = r.choices[0].logprobs;
    for (let i = 0; i < L.tokens.length; i++) {
      assert.ok(L.tokens[i] in L.top_logprobs[i], `${logprobs}: ${JSON.stringify(L.top_logprobs[i])} lacks ${JSON.stringify(L.tokens[i])}`);
      assert.ok(Object.keys(L.top_logprobs[i]).length <= logprobs + 1);
    }
  }
  // Chat logprobs' bytes: a token holding the first byte of "é" (0xC3; the demo vocabulary's id
  // 132) reports that byte, not U+FFFD's UTF-8.
  const cb = await client.chat.completions.create({ model: 'pycoder', messages: [{ role: 'user', content: 'hi' }], max_tokens: 1, logprobs: true, top_logprobs: 1, logit_bias: { 132: 100 } });
  assert.deepEqual(cb.choices[0].logprobs.content[0].bytes, [0xc3]);
  const e = await client.completions.create({ model: 'pycoder', prompt: 'x = "é€😀" + ', max_tokens: 2, temperature: 0, echo: true, logprobs: 0 });
  const L = e.choices[0].logprobs;
  let at = 0;
  for (let i = 0; i < L.tokens.length; i++) {
    assert.equal(L.text_offset[i], at, JSON.stringify(L.text_offset));
    at += [...L.tokens[i]].length;  // code points, as Python's len
  }

});

// Structured outputs and enforced tool calls (#18 items 2-4) on the real server and the CPU demo
// model, driven by the clients agents use: openai (.parse + zod), the Vercel AI SDK
// (generateObject, tool calls) and LangChain (withStructuredOutput). Every finished structured
// output is validated against its schema with ajv.
// Run: TOKENSPEED_BIN=build/tokenspeed node --test tests/server/structured.test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { zodResponseFormat } from 'openai/helpers/zod';
import { z } from 'zod';
import Ajv from 'ajv';
import { generateObject, generateText, tool, jsonSchema } from 'ai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { ChatOpenAI } from '@langchain/openai';
import path from 'node:path';
import { startServer, postJson, metrics, ROOT } from './lib.mjs';

let srv;
let client;
let MODEL;
let haveChat = true;
const ajv = new Ajv({ strict: false });
const validate = (schema, value) => {
  const v = ajv.compile(schema);
  assert.ok(v(value), `${JSON.stringify(value)} does not follow ${JSON.stringify(schema)}: ${ajv.errorsText(v.errors)}`);
};
const user = (content) => [{ role: 'user', content }];

// Bounded schemas: a tiny random-ish model must still finish within max_tokens.
const personSchema = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 12 },
    age: { type: 'integer', minimum: 0, maximum: 120 },
    role: { enum: ['admin', 'user', 'guest'] },
    active: { type: 'boolean' },
  },
  required: ['name', 'age', 'role', 'active'],
  additionalProperties: false,
};
const weatherTool = {
  type: 'function',
  function: {
    name: 'get_weather', description: 'Weather for a city',
    parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 10 }, unit: { enum: ['c', 'f'] } },
      required: ['city', 'unit'], additionalProperties: false },
  },
};
const timeTool = {
  type: 'function',
  function: { name: 'get_time', description: 'Current time',
    parameters: { type: 'object', properties: { tz: { enum: ['UTC', 'CET'] } }, required: ['tz'], additionalProperties: false } },
};

before(async () => {
  srv = await startServer(['--tool-call-parser', 'hermes']);
  client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'none', maxRetries: 0, timeout: 120000 });
  MODEL = (await client.models.list()).data[0].id;
  const probe = await postJson(`${srv.url}/v1/chat/completions`, { messages: user('hi'), max_tokens: 1 });
  haveChat = !(probe.status !== 200 && /no Jinja engine/.test(probe.text));
});

after(async () => {
  if (srv) {
    const r = await srv.stop();
    assert.equal(r.code, 0, `server exit ${JSON.stringify(r)}\n${srv.log()}`);
  }
});

test('response_format json_schema (strict): openai chat.completions.create, greedy and seeded n=3', async (t) => {
  if (!haveChat) return t.skip('no Jinja engine');
  for (const extra of [{ temperature: 0 }, { temperature: 1, seed: 7, n: 3 }]) {
    const r = await client.chat.completions.create({ model: MODEL, max_tokens: 200, messages: user('A person as JSON'),
      response_format: { type: 'json_schema', json_schema: { name: 'person', strict: true, schema: personSchema } }, ...extra });
    assert.equal(r.choices.length, extra.n ?? 1);
    for (const c of r.choices) {
      assert.equal(c.finish_reason, 'stop', c.message.content);
      validate(personSchema, JSON.parse(c.message.content));
    }
  }
});

test('openai beta.chat.completions.parse with zod', async (t) => {
  if (!haveChat) return t.skip('no Jinja engine');
  const Person = z.object({ name: z.string().max(10), age: z.number().int().min(0).max(99), tags: z.array(z.enum(['a', 'b'])).max(3) });
  const rf = zodResponseFormat(Person, 'person');
  const r = await client.beta.chat.completions.parse({ model: MODEL, max_tokens: 200, temperature: 0,
    messages: user('Describe a person'), response_format: rf });
  const msg = r.choices[0].message;
  assert.ok(msg.parsed, msg.content);
  assert.deepEqual(Person.parse(msg.parsed), msg.parsed);
  validate(rf.json_schema.schema, msg.parsed);
});

test('response_format json_object; invalid schemas are a 400 naming the field', async (t) => {
  if (!haveChat) return t.skip('no Jinja engine');
  const r = await client.chat.completions.create({ model: MODEL, max_tokens: 300, temperature: 0,
    messages: user('Some JSON please'), response_format: { type: 'json_object' } });
  if (r.choices[0].finish_reason === 'stop') {
    const v = JSON.parse(r.choices[0].message.content);
    assert.equal(typeof v, 'object');
  } else {
    assert.equal(r.choices[0].finish_reason, 'length');  // unbounded any-JSON may run out: still a prefix of JSON
    assert.ok(r.choices[0].message.content.startsWith('{'));
  }
  const CH = `${srv.url}/v1/chat/completions`;
  const bad = await postJson(CH, { messages: user('x'), response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'strin' } } } });
  assert.equal(bad.status, 400, bad.text);
  assert.equal(bad.json.error.param, 'response_format.json_schema.schema');
  assert.match(bad.json.error.message, /strin/);
  const badRe = await postJson(CH, { messages: user('x'), structured_outputs: { regex: '(ab' } });
  assert.equal(badRe.status, 400);
  assert.equal(badRe.json.error.param, 'structured_outputs.regex');
  const badG = await postJson(CH, { messages: user('x'), guided_grammar: 'root ::= undefined_rule' });
  assert.equal(badG.status, 400);
  assert.match(badG.json.error.message, /undefined_rule/);
  const two = await postJson(CH, { messages: user('x'), regex: 'a', guided_choice: ['b'] });
  assert.equal(two.status, 400);
});

test('vLLM structured_outputs / guided_* and SGLang regex / ebnf, chat and completions', async (t) => {
  if (!haveChat) return t.skip('no Jinja engine');
  const CH = `${srv.url}/v1/chat/completions`;
  const C = `${srv.url}/v1/completions`;
  const cases = [
    [{ structured_outputs: { choice: ['alpha', 'beta', 'gamma'] } }, (s) => ['alpha', 'beta', 'gamma'].includes(s)],
    [{ guided_choice: ['yes', 'no'] }, (s) => s === 'yes' || s === 'no'],
    [{ structured_outputs: { regex: '[0-9]{3}-[a-z]{2,4}' } }, (s) => /^[0-9]{3}-[a-z]{2,4}$/.test(s)],
    [{ guided_regex: '(true|false)' }, (s) => s === 'true' || s === 'false'],
    [{ regex: 'id_[0-9]{4}' }, (s) => /^id_[0-9]{4}$/.test(s)],
    [{ structured_outputs: { grammar: 'root ::= "(" [a-c] ("," [a-c]){0,3} ")"' } }, (s) => /^\([a-c](,[a-c]){0,3}\)$/.test(s)],
    [{ ebnf: 'root ::= "x" [0-9] [0-9]' }, (s) => /^x[0-9]{2}$/.test(s)],
    [{ guided_grammar: 'start: "k" /[0-9]/' }, (s) => /^k[0-9]$/.test(s)],
    [{ structured_outputs: { json: personSchema } }, (s) => { validate(personSchema, JSON.parse(s)); return true; }],
    [{ guided_json: JSON.stringify(personSchema) }, (s) => { validate(personSchema, JSON.parse(s)); return true; }],
    [{ json_schema: JSON.stringify(personSchema) }, (s) => { validate(personSchema, JSON.parse(s)); return true; }],
  ];
  for (const [fields, ok] of cases) {
    const r = await postJson(CH, { messages: user('Answer'), max_tokens: 120, temperature: 0, ...fields });
    assert.equal(r.status, 200, r.text);
    const c = r.json.choices[0];
    assert.equal(c.finish_reason, 'stop', JSON.stringify(fields) + ' -> ' + c.message.content);
    assert.ok(ok(c.message.content), `${JSON.stringify(fields)} -> ${JSON.stringify(c.message.content)}`);
    const rc = await postJson(C, { prompt: 'def f(x):', max_tokens: 120, temperature: 0.8, seed: 3, ...fields });
    assert.equal(rc.status, 200, rc.text);
    assert.equal(rc.json.choices[0].finish_reason, 'stop');
    assert.ok(ok(rc.json.choices[0].text), `completions ${JSON.stringify(fields)} -> ${JSON.stringify(rc.json.choices[0].text)}`);
  }
});

test('streaming a structured output: deltas join to a valid document', async (t) => {
  if (!haveChat) return t.skip('no Jinja engine');
  const stream = await client.chat.completions.create({ model: MODEL, max_tokens: 200, temperature: 0, stream: true,
    messages: user('A person'), response_format: { type: 'json_schema', json_schema: { name: 'p', strict: true, schema: personSchema } } });
  let text = '';
  let finish = null;
  for await (const ch of stream) {
    text += ch.choices[0]?.delta?.content ?? '';
    finish = ch.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(finish, 'stop');
  validate(personSchema, JSON.parse(text));
});

test('tool_choice required / named / parallel_tool_calls false are enforced by grammar', async (t) => {
  if (!haveChat) return t.skip('no Jinja engine');
  const tools = [weatherTool, timeTool];
  const byName = Object.fromEntries(tools.map((x) => [x.function.name, x.function.parameters]));
  for (const [choice, parallel] of [['required', undefined], ['required', false],
    [{ type: 'function', function: { name: 'get_time' } }, undefined]]) {
    for (const extra of [{ temperature: 0 }, { temperature: 1, seed: 11, n: 2 }]) {
      const r = await client.chat.completions.create({ model: MODEL, max_tokens: 200, tools, tool_choice: choice,
        ...(parallel === undefined ? {} : { parallel_tool_calls: parallel }), messages: user('Weather in Paris and the time?'), ...extra });
      for (const c of r.choices) {
        const calls = c.message.tool_calls ?? [];
        assert.ok(calls.length >= 1, JSON.stringify(c.message));
        if (parallel === false) {
          assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c.message));
          assert.equal(calls.length, 1);  // at most one call
        } else {
          // Parallel calls are unbounded: the demo model may repeat calls until max_tokens; the
          // finished ones are still valid calls.
          assert.ok(c.finish_reason === 'tool_calls' || c.finish_reason === 'length', JSON.stringify(c.message));
        }
        for (const call of calls) {
          if (typeof choice === 'object') assert.equal(call.function.name, 'get_time');
          assert.ok(byName[call.function.name], call.function.name);
          validate(byName[call.function.name], JSON.parse(call.function.arguments));
        }
      }
    }
  }
  // tool_choice none: no calls parsed, plain text.
  const none = await client.chat.completions.create({ model: MODEL, max_tokens: 8, temperature: 0, tools, tool_choice: 'none', messages: user('hi') });
  assert.equal(none.choices[0].message.tool_calls ?? undefined, undefined);
});

test('streamed tool calls: a head delta (id, type, name), then argument fragments as they are generated', async (t) => {
  if (!haveChat) return t.skip('no Jinja engine');
  for (const tool_choice of ['required', { type: 'function', function: { name: 'get_weather' } }]) {
    const stream = await client.chat.completions.create({ model: MODEL, max_tokens: 120, temperature: 0, stream: true,
      tools: [weatherTool, timeTool], tool_choice, parallel_tool_calls: false, messages: user('Weather in Paris?') });
    const calls = [];
    let fragments = 0;
    let finish = null;
    for await (const ch of stream) {
      for (const d of ch.choices[0]?.delta?.tool_calls ?? []) {
        if (d.id) {
          assert.equal(d.type, 'function');
          assert.ok(d.function.name, JSON.stringify(d));
          assert.equal(d.index, calls.length);
          calls.push({ name: d.function.name, args: d.function.arguments ?? '' });
        } else {
          assert.equal(d.index, calls.length - 1, JSON.stringify(d));
          assert.equal(d.function.name, undefined);
          calls[d.index].args += d.function.arguments;
        }
        ++fragments;
      }
      finish = ch.choices[0]?.finish_reason ?? finish;
    }
    assert.equal(calls.length, 1, JSON.stringify(calls));
    assert.ok(fragments > 2, `arguments arrived in ${fragments} deltas`);
    assert.equal(finish, 'tool_calls');
    const schema = calls[0].name === 'get_weather' ? weatherTool.function.parameters : timeTool.function.parameters;
    validate(schema, JSON.parse(calls[0].args));
    // The same request unstreamed: the same call.
    const whole = await client.chat.completions.create({ model: MODEL, max_tokens: 120, temperature: 0,
      tools: [weatherTool, timeTool], tool_choice, parallel_tool_calls: false, messages: user('Weather in Paris?') });
    assert.equal(whole.choices[0].message.tool_calls[0].function.name, calls[0].name);
    assert.deepEqual(JSON.parse(whole.choices[0].message.tool_calls[0].function.arguments), JSON.parse(calls[0].args));
  }
});

test('tool_choice auto: free text stays free; a call the model starts is enforced by the triggered grammar', async (t) => {
  if (!haveChat) return t.skip('no Jinja engine');
  // The demo model copies <tool_call> blocks from its prompt (with other cities, without "days");
  // the tool only allows Lima/Quito and requires days: a parsed call can only be valid if the
  // grammar took over at <tool_call>.
  const tool = { type: 'function', function: { name: 'get_weather', parameters: { type: 'object',
    properties: { city: { enum: ['Lima', 'Quito'] }, days: { type: 'integer', minimum: 1, maximum: 7 } },
    required: ['city', 'days'], additionalProperties: false } } };
  const pat = ['Paris', 'Rome', 'Oslo', 'Bern', 'Lima', 'Kyiv']
    .map((c) => `<tool_call>\n{"name": "get_weather", "arguments": {"city": "${c}"}}\n</tool_call>\n`).join('');
  const messages = [{ role: 'system', content: pat }, { role: 'user', content: pat }];
  let called = 0;
  for (const extra of [{ temperature: 0 }, { temperature: 0.8, seed: 1, n: 3 }]) {
    const r = await client.chat.completions.create({ model: MODEL, max_tokens: 100, tools: [tool], messages, ...extra });
    for (const c of r.choices) {
      assert.ok(['stop', 'length', 'tool_calls'].includes(c.finish_reason), JSON.stringify(c));
      for (const call of c.message.tool_calls ?? []) {
        ++called;
        assert.equal(call.function.name, 'get_weather');
        validate(tool.function.parameters, JSON.parse(call.function.arguments));
      }
    }
    if (extra.temperature === 0) assert.ok(called >= 1, JSON.stringify(r.choices[0].message));
  }
  t.diagnostic(`${called} enforced calls`);
  // tool_choice none: nothing enforced or parsed (the copied blocks stay text).
  const none = await client.chat.completions.create({ model: MODEL, max_tokens: 100, temperature: 0, tools: [tool], tool_choice: 'none', messages });
  assert.equal(none.choices[0].message.tool_calls ?? undefined, undefined);
});

test('logit_bias and min_tokens are applied in the sampler', async () => {
  const C = `${srv.url}/v1/completions`;
  // A +100 bias on one id makes greedy decoding repeat it.
  const r = await postJson(C, { prompt: 'def f(x):', max_tokens: 5, temperature: 0, logprobs: 0, logit_bias: { 300: 100 } });
  assert.equal(r.status, 200, r.text);
  const toks = r.json.choices[0].logprobs.tokens;
  assert.equal(toks.length, 5);
  assert.ok(toks.every((x) => x === toks[0]), JSON.stringify(toks));
  // The demo model's eos ids are 1 and 4: forced by bias, they end the output at once -- unless min_tokens holds them off.
  const eosNow = await postJson(C, { prompt: 'def f(x):', max_tokens: 20, temperature: 0, logit_bias: { 1: 100, 4: 100 } });
  assert.equal(eosNow.json.choices[0].finish_reason, 'stop');
  assert.ok(eosNow.json.usage.completion_tokens <= 1, eosNow.text);
  const held = await postJson(C, { prompt: 'def f(x):', max_tokens: 20, temperature: 0, min_tokens: 6, logit_bias: { 1: 100, 4: 100 } });
  assert.equal(held.json.choices[0].finish_reason, 'stop', held.text);
  assert.ok(held.json.usage.completion_tokens >= 6 && held.json.usage.completion_tokens <= 7, held.text);
  const badBias = await postJson(C, { prompt: 'x', logit_bias: { 999999: 1 } });
  assert.equal(badBias.status, 400);
  assert.equal(badBias.json.error.param, 'logit_bias');
});

test('bad_words (vLLM) are never generated', async () => {
  const C = `${srv.url}/v1/completions`;
  const body = { prompt: 'def fibonacci(n):\n', max_tokens: 16, temperature: 0 };
  const plain = await postJson(C, body);
  assert.equal(plain.status, 200, plain.text);
  // Ban a word of the greedy output (its longest space-separated piece of letters).
  const words = plain.json.choices[0].text.match(/[A-Za-z]{4,}/g) ?? [];
  assert.ok(words.length > 0, plain.text);
  const word = words.reduce((a, b) => (b.length > a.length ? b : a));
  const banned = await postJson(C, { ...body, bad_words: [word] });
  assert.equal(banned.status, 200, banned.text);
  assert.ok(!banned.json.choices[0].text.includes(word), `${word}: ${banned.text}`);
  const empty = await postJson(C, { ...body, bad_words: ['  '] });
  assert.equal(empty.status, 400);
  assert.equal(empty.json.error.param, 'bad_words');
});

test('Vercel AI SDK: generateObject and a required tool call', async (t) => {
  if (!haveChat) return t.skip('no Jinja engine');
  const provider = createOpenAICompatible({ name: 'tokenspeed', baseURL: `${srv.url}/v1`, apiKey: 'none', supportsStructuredOutputs: true });
  const schema = z.object({ title: z.string().max(12), stars: z.number().int().min(1).max(5), tags: z.array(z.enum(['x', 'y'])).max(2) });
  const { object } = await generateObject({ model: provider(MODEL), schema, prompt: 'Review a book', maxOutputTokens: 200, temperature: 0, maxRetries: 0 });
  assert.deepEqual(schema.parse(object), object);
  const r = await generateText({
    model: provider(MODEL), prompt: 'Weather in Paris?', maxOutputTokens: 200, temperature: 0, maxRetries: 0, toolChoice: 'required',
    tools: { get_weather: tool({ description: 'Weather', inputSchema: jsonSchema(weatherTool.function.parameters) }) },
  });
  assert.ok(r.toolCalls.length >= 1, JSON.stringify(r.response?.body ?? r.text));
  for (const c of r.toolCalls) {
    assert.equal(c.toolName, 'get_weather');
    validate(weatherTool.function.parameters, c.input);
  }
});

test('LangChain ChatOpenAI withStructuredOutput (function calling and json_schema)', async (t) => {
  if (!haveChat) return t.skip('no Jinja engine');
  const llm = new ChatOpenAI({ model: MODEL, apiKey: 'none', temperature: 0, maxTokens: 200, maxRetries: 0,
    configuration: { baseURL: `${srv.url}/v1` } });
  const schema = z.object({ city: z.string().max(10), population: z.number().int().min(0).max(1000) });
  for (const method of ['functionCalling', 'jsonSchema']) {
    const out = await llm.withStructuredOutput(schema, { name: 'city_info', method }).invoke('Tell me about a city');
    assert.deepEqual(schema.parse(out), out, method);
  }
});

test('jump-forward: forced bytes take fewer engine steps, outputs stay valid, streamed text and usage agree', async () => {
  // The main server jumps forward (the default); this one samples every token.
  const plain = await startServer(['--disable-jump-forward']);
  try {
    const C = '/v1/completions';
    const schema = { type: 'object', properties: { name: { type: 'string', maxLength: 8 },
      kind: { enum: ['def', 'class', 'lambda'] }, n: { type: 'integer', minimum: 0, maximum: 99 } },
    required: ['name', 'kind', 'n'], additionalProperties: false };
    const steps = async (url) => (await metrics(url)).values.tokenspeed_engine_steps_total;
    let jumped = 0, sampled = 0;
    for (const prompt of ['def f(x):', 'class A:', 'import os']) {
      const body = { prompt, max_tokens: 64, temperature: 0, guided_json: schema };
      for (const [url, which] of [[srv.url, 'jump'], [plain.url, 'plain']]) {
        const s0 = await steps(url);
        const r = await postJson(url + C, body);
        const used = (await steps(url)) - s0;
        if (which === 'jump') jumped += used; else sampled += used;
        assert.equal(r.status, 200, r.text);
        const c = r.json.choices[0];
        assert.equal(c.finish_reason, 'stop', c.text);
        validate(schema, JSON.parse(c.text));
        // Streamed: the deltas join to the same text; forced tokens are completion tokens.
        const st = await fetch(url + C, { method: 'POST', headers: { 'Content-Type': 'application/json' },
          body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }) });
        let text = '', usage = null;
        for (const line of (await st.text()).split('\n')) {
          if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
          const ev = JSON.parse(line.slice(6));
          text += ev.choices?.[0]?.text ?? '';
          usage = ev.usage ?? usage;
        }
        assert.equal(text, c.text, which);
        assert.equal(usage.completion_tokens, r.json.usage.completion_tokens, which);
      }
    }
    assert.ok(jumped < sampled, `engine steps with jump-forward ${jumped}, without ${sampled}`);
  } finally {
    await plain.stop();
  }
});

test('structured outputs with EAGLE3 speculative decoding: valid, and greedy equals the plain server', async () => {
  const spec = await startServer(['--speculative-algorithm', 'EAGLE3', '--speculative-draft-model-path', path.join(ROOT, 'models/pycoder-eagle3')]);
  // The reference samples every token, as EAGLE3 does (no jump-forward: forced runs tokenize differently).
  const ref = await startServer(['--disable-jump-forward']);
  try {
    const C = '/v1/completions';
    const schema = { type: 'object', properties: { n: { type: 'integer', minimum: 0, maximum: 99 }, tag: { enum: ['a', 'b'] } },
      required: ['n', 'tag'], additionalProperties: false };
    for (const fields of [{ guided_choice: ['alpha', 'beta'] }, { guided_json: schema }, { regex: 'id_[0-9]{4}' },
      { logit_bias: { 5: 1 } }, { min_tokens: 2 }]) {
      const body = { prompt: 'def f(x):', max_tokens: 48, temperature: 0, ...fields };
      const got = await postJson(spec.url + C, body);
      const want = await postJson(ref.url + C, body);
      assert.equal(got.status, 200, got.text);
      assert.equal(got.json.choices[0].text, want.json.choices[0].text, JSON.stringify(fields));
      if (fields.guided_json) validate(schema, JSON.parse(got.json.choices[0].text));
    }
    const sampled = await postJson(spec.url + C, { prompt: 'def f(x):', max_tokens: 48, temperature: 1, seed: 3, n: 3, guided_json: schema });
    assert.equal(sampled.status, 200, sampled.text);
    for (const c of sampled.json.choices) validate(schema, JSON.parse(c.text));
  } finally {
    await spec.stop();
    await ref.stop();
  }
});

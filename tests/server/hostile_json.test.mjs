// Deeply nested JSON everywhere the server accepts JSON (#23): a ~100 KB body nested 50,000
// levels deep once overflowed the stack in the JSON -> Jinja conversion and killed the server.
// Every route and every nested field (message content, tool-call arguments, tool parameters,
// response schemas, Responses/Messages inputs, tokenize/embeddings inputs) must answer a 400 in
// its API's error shape that names the nesting, the server must keep serving, and its memory must
// come back near the baseline. Default body limit (32 MiB), default --max-json-depth (64).
// Run: TOKENSPEED_BIN=build/tokenspeed node --test tests/server/hostile_json.test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, postJson, tokenIds, rssMiB } from './lib.mjs';

const DEEP = 50000;
let srv;
let rss0 = 0;

// A JSON text of `n` nested arrays around `leaf`: [[[...leaf...]]].
const nestedText = (n, leaf = '1') => '['.repeat(n) + leaf + ']'.repeat(n);
// The same as an object chain {"a":{"a":...}}, for fields that must be objects.
const nestedObjText = (n) => '{"a":'.repeat(n) + '1' + '}'.repeat(n);

before(async () => {
  srv = await startServer(['--tool-call-parser', 'hermes']);
  await postJson(`${srv.url}/v1/completions`, { prompt: tokenIds(8, 1), max_tokens: 4, ignore_eos: true });
  rss0 = rssMiB(srv.proc.pid);
});

after(async () => {
  if (srv) {
    const r = await srv.stop();
    assert.equal(r.code, 0, `server exit ${JSON.stringify(r)}\n${srv.log()}`);
  }
});

// Each case: [route, body text]; bodies are built as text so the nesting reaches the server as sent.
const chat = (inner) => `{"max_tokens":4,"messages":[${inner}]}`;
const CASES = [
  ['chat: whole body', '/v1/chat/completions', nestedText(DEEP)],
  ['chat: message content', '/v1/chat/completions', chat(`{"role":"user","content":${nestedText(DEEP)}}`)],
  ['chat: tool-call arguments (a JSON string)', '/v1/chat/completions',
    chat(`{"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",` +
      `"function":{"name":"f","arguments":${JSON.stringify(nestedText(DEEP))}}}]},{"role":"tool","tool_call_id":"c1","content":"ok"}`)],
  ['chat: tool parameters', '/v1/chat/completions',
    `{"max_tokens":4,"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function",` +
      `"function":{"name":"f","parameters":${nestedObjText(DEEP)}}}]}`],
  ['chat: response_format schema', '/v1/chat/completions',
    `{"max_tokens":4,"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema",` +
      `"json_schema":{"name":"x","schema":${nestedObjText(DEEP)}}}}`],
  ['chat: chat_template_kwargs', '/v1/chat/completions',
    `{"max_tokens":4,"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":${nestedObjText(DEEP)}}`],
  ['completions: prompt', '/v1/completions', `{"max_tokens":4,"prompt":${nestedText(DEEP)}}`],
  ['responses: input', '/v1/responses', `{"max_output_tokens":4,"input":${nestedText(DEEP)}}`],
  ['responses: function_call arguments', '/v1/responses',
    `{"max_output_tokens":4,"input":[{"type":"function_call","call_id":"c1","name":"f",` +
      `"arguments":${JSON.stringify(nestedText(DEEP))}},{"type":"function_call_output","call_id":"c1","output":"ok"}]}`],
  ['messages: content', '/v1/messages', `{"max_tokens":4,"messages":[{"role":"user","content":${nestedText(DEEP)}}]}`],
  ['messages: tool_use input', '/v1/messages',
    `{"max_tokens":4,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[` +
      `{"type":"tool_use","id":"t1","name":"f","input":${nestedObjText(DEEP)}}]}]}`],
  ['tokenize: messages', '/tokenize', `{"messages":[{"role":"user","content":${nestedText(DEEP)}}]}`],
  ['detokenize: tokens', '/detokenize', `{"tokens":${nestedText(DEEP)}}`],
  ['embeddings: input', '/v1/embeddings', `{"input":${nestedText(DEEP)}}`],
];

test('50,000-deep nesting in every JSON field of every route: 400 naming the nesting, server keeps serving', async () => {
  for (const [name, route, body] of CASES) {
    assert.ok(body.length > 100000, `${name}: the body is the ~100 KB attack`);
    const r = await postJson(`${srv.url}${route}`, body);
    assert.equal(r.status, 400, `${name}: status ${r.status}: ${r.text.slice(0, 300)}`);
    const err = route === '/v1/messages' ? r.json?.error : r.json?.error;
    assert.ok(err && typeof err.message === 'string', `${name}: error shape: ${r.text.slice(0, 300)}`);
    assert.match(err.message, /nest|deep/i, `${name}: ${err.message}`);
    if (route === '/v1/messages') assert.equal(r.json.type, 'error', `${name}: Anthropic error shape`);
    // Still serving after each one.
    const h = await fetch(`${srv.url}/health`);
    assert.equal(h.status, 200, `${name}: /health after`);
  }
});

test('nesting within --max-json-depth is accepted (the limit is not a blanket refusal)', async () => {
  // 20 levels inside a tool's parameters (object nesting the schema converter accepts).
  let schema = { type: 'string' };
  for (let i = 0; i < 8; ++i) schema = { type: 'object', properties: { a: schema } };
  const r = await postJson(`${srv.url}/v1/chat/completions`, {
    max_tokens: 4, messages: [{ role: 'user', content: 'hi' }],
    tools: [{ type: 'function', function: { name: 'f', parameters: schema } }],
  });
  assert.equal(r.status, 200, r.text.slice(0, 300));
  const c = await postJson(`${srv.url}/v1/completions`, { max_tokens: 2, prompt: [tokenIds(4, 2)] });
  assert.equal(c.status, 200, c.text.slice(0, 300));
});

test('memory returns near the baseline after the attacks', async () => {
  // Repeat the whole set a few times: a leak per request would show.
  for (let i = 0; i < 3; ++i)
    for (const [, route, body] of CASES) await postJson(`${srv.url}${route}`, body);
  const rss = rssMiB(srv.proc.pid);
  console.log(`RSS: baseline ${rss0.toFixed(1)} MiB, now ${rss.toFixed(1)} MiB`);
  assert.ok(rss < rss0 + 64, `RSS ${rss} MiB vs baseline ${rss0} MiB`);
  const r = await postJson(`${srv.url}/v1/completions`, { prompt: tokenIds(8, 3), max_tokens: 4, ignore_eos: true });
  assert.equal(r.status, 200);
  assert.equal(r.json.usage.completion_tokens, 4);
});

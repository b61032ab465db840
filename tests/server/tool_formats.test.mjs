// Forced tool calls in every --tool-call-parser format, end to end on the CPU demo model: with
// tool_choice required / named the grammar makes the model write its format's syntax (whatever
// the model would have written), the format's parser reads the call back, its arguments follow
// the tool's schema, and streamed (head, then argument fragments before the block closes) equals
// unstreamed. One server per format.
// Run: TOKENSPEED_BIN=build/tokenspeed node --test tests/server/tool_formats.test.mjs
import { test } from 'node:test';
import assert from 'node:assert/strict';
import Ajv from 'ajv';
import { startServer, postJson } from './lib.mjs';

const ajv = new Ajv({ strict: false });
const validate = (schema, value) => {
  const v = ajv.compile(schema);
  assert.ok(v(value), `${JSON.stringify(value)} does not follow ${JSON.stringify(schema)}: ${ajv.errorsText(v.errors)}`);
};
const messages = [{ role: 'user', content: 'Weather in Paris, and the time?' }];
// Bounded, typed parameters: the text formats carry values as text typed by the schema.
const weather = {
  type: 'function',
  function: {
    name: 'get_weather',
    parameters: {
      type: 'object',
      // country: a pattern, which the XML-style formats' raw text values must follow too.
      properties: { city: { type: 'string', maxLength: 10 }, days: { type: 'integer', minimum: 1, maximum: 9 },
        unit: { enum: ['c', 'f'] }, country: { type: 'string', pattern: '^[A-Z]{2}$' } },
      required: ['city', 'days', 'unit', 'country'], additionalProperties: false,
    },
  },
};
const time = {
  type: 'function',
  function: { name: 'get_time', parameters: { type: 'object', properties: { utc: { type: 'boolean' } }, required: ['utc'],
    additionalProperties: false } },
};
const schemaOf = { get_weather: weather.function.parameters, get_time: time.function.parameters };

async function streamed(url, body) {
  const r = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ ...body, stream: true }),
  });
  assert.equal(r.status, 200);
  const text = await r.text();
  const calls = [];
  let deltas = 0;
  let finish = null;
  let content = '';
  for (const line of text.split('\n')) {
    if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
    const ch = JSON.parse(line.slice(6)).choices?.[0];
    if (!ch) continue;
    content += ch.delta?.content ?? '';
    for (const d of ch.delta?.tool_calls ?? []) {
      if (d.id) calls.push({ name: d.function.name, args: d.function.arguments ?? '' });
      else calls[d.index].args += d.function.arguments;
      ++deltas;
    }
    finish = ch.finish_reason ?? finish;
  }
  return { calls, deltas, finish, content };
}

for (const parser of ['hermes', 'llama3', 'mistral', 'deepseek_v3', 'deepseek_v31', 'kimi_k2', 'qwen3_coder', 'glm45',
  'minimax_m2']) {
  test(`--tool-call-parser ${parser}: tool_choice required / named are written in the format, parsed back, streamed`, async (t) => {
    const srv = await startServer(['--tool-call-parser', parser]);
    try {
      const probe = await postJson(`${srv.url}/v1/chat/completions`, { messages, max_tokens: 1 });
      if (probe.status !== 200 && /no Jinja engine/.test(probe.text)) return t.skip('no Jinja engine');
      for (const tool_choice of ['required', { type: 'function', function: { name: 'get_time' } }]) {
        const body = { messages, tools: [weather, time], tool_choice, parallel_tool_calls: false, max_tokens: 160, temperature: 0 };
        const whole = await postJson(`${srv.url}/v1/chat/completions`, body);
        assert.equal(whole.status, 200, whole.text);
        const msg = whole.json.choices[0].message;
        assert.equal(whole.json.choices[0].finish_reason, 'tool_calls', JSON.stringify(msg));
        assert.equal(msg.tool_calls.length, 1, JSON.stringify(msg));
        const call = msg.tool_calls[0].function;
        if (typeof tool_choice === 'object') assert.equal(call.name, 'get_time');
        validate(schemaOf[call.name], JSON.parse(call.arguments));
        const s = await streamed(srv.url, body);
        assert.equal(s.finish, 'tool_calls');
        assert.equal(s.calls.length, 1, JSON.stringify(s));
        assert.equal(s.calls[0].name, call.name);
        assert.deepEqual(JSON.parse(s.calls[0].args), JSON.parse(call.arguments));
        // llama3's output is the calls or text, decided when it ends: its calls arrive whole.
        if (parser !== 'llama3') assert.ok(s.deltas >= 2, `the call arrived in ${s.deltas} delta(s): not streamed`);
      }
    } finally {
      const r = await srv.stop();
      assert.equal(r.code, 0, `server exit ${JSON.stringify(r)}\n${srv.log()}`);
    }
  });
}

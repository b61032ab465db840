// A server with a tiny KV pool: concurrent requests that cannot all fit must be queued or
// preempted (retracted and re-prefilled), and each must still produce its solo greedy output.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, tokenIds, metrics, sleep } from './lib.mjs';

let srv;
let client;

before(async () => {
  srv = await startServer(['--max-total-tokens', '512', '--block-size', '16']);
  client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'none', maxRetries: 0, timeout: 300000 });
});

after(async () => {
  if (srv) {
    const r = await srv.stop();
    assert.equal(r.code, 0, `server exit ${JSON.stringify(r)}\n${srv.log()}`);
  }
});

test('8 concurrent requests over a 512-token pool all complete with their solo outputs', async () => {
  // 8 x (100 prompt + 40 generated) = 1120 tokens of KV > 512.
  const prompts = Array.from({ length: 8 }, (_, i) => tokenIds(100, 1000 + i));
  const req = (p) => ({ model: 'pycoder', prompt: p, max_tokens: 40, temperature: 0, ignore_eos: true });
  const solo = [];
  for (const p of prompts) solo.push(await client.completions.create(req(p)));
  const par = await Promise.all(prompts.map((p) => client.completions.create(req(p))));
  par.forEach((r, i) => {
    assert.equal(r.choices[0].text, solo[i].choices[0].text, `request ${i}`);
    assert.equal(r.usage.completion_tokens, 40, `request ${i}`);
    assert.equal(r.choices[0].finish_reason, 'length');
  });
  // Streams too.
  const streamed = await Promise.all(prompts.map(async (p) => {
    let text = '';
    for await (const ch of await client.completions.create({ ...req(p), stream: true })) text += ch.choices[0]?.text ?? '';
    return text;
  }));
  streamed.forEach((t, i) => assert.equal(t, solo[i].choices[0].text, `stream ${i}`));
  let m;
  for (let i = 0; i < 100; i++) {  // the gauges trail the last event by up to one engine step
    m = await metrics(srv.url);
    if (m.values.tokenspeed_num_requests_running === 0) break;
    await sleep(50);
  }
  assert.equal(m.values.tokenspeed_num_requests_running, 0);
  console.log(`retractions: ${m.values.tokenspeed_retractions_total}`);
});

test('a request larger than the whole pool is rejected or completes, never hangs', async () => {
  const r = await fetch(`${srv.url}/v1/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: tokenIds(600, 5), max_tokens: 4, temperature: 0 }),
  });
  const body = await r.text();
  console.log(`oversized request: ${r.status} ${body.slice(0, 200)}`);
  assert.ok([200, 400].includes(r.status), body);
});

// The event-driven front door under load and under hostile clients, on the CPU demo model:
// 1,000 concurrent streams, mass hang-ups, slowloris, oversized chunked bodies, pipelining,
// limits, and the server's memory coming back afterwards.
// Run: TOKENSPEED_BIN=build/tokenspeed node --test tests/server/frontdoor.test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  startServer, metrics, tokenIds, sleep, connect, collect, parseResponses, rssMiB, streamCompletion, curlTime,
  postJson, TIME_SCALE,
} from './lib.mjs';

const BODY_LIMIT = 65536;
let srv;
let rss0 = 0;

before(async () => {
  srv = await startServer(['--max-request-bytes', String(BODY_LIMIT), '--http-header-timeout', '2',
    '--http-body-timeout', '2', '--max-header-bytes', '8192', '--max-uri-bytes', '2048']);
  // Warm up (first request allocates the engine's buffers), then take the baseline.
  await postJson(`${srv.url}/v1/completions`, { prompt: tokenIds(8, 1), max_tokens: 4, ignore_eos: true });
  rss0 = rssMiB(srv.proc.pid);
});

after(async () => {
  if (srv) {
    const r = await srv.stop();
    assert.equal(r.code, 0, `server exit ${JSON.stringify(r)}\n${srv.log()}`);
  }
});

// Polls /metrics until `pred(values)` holds; returns [values, ms] (or throws after `ms`).
// Bounds scale with TIME_SCALE: under the sanitizers, on a 2-core machine running another test's
// server beside this one, a step of hundreds of sequences takes seconds.
async function waitMetrics(pred, ms = 5000) {
  ms *= TIME_SCALE;
  const t0 = Date.now();
  let m;
  while (Date.now() - t0 < ms) {
    m = (await metrics(srv.url)).values;
    if (pred(m)) return [m, Date.now() - t0];
    await sleep(20);
  }
  throw new Error(`metrics condition not met in ${ms} ms: ${JSON.stringify(m)}`);
}

const idle = (m) => m.tokenspeed_num_requests_running === 0 && m.tokenspeed_num_requests_waiting === 0;

test('1,000 concurrent short streams all complete; the scheduler sees them all; /health stays fast', async () => {
  const N = 1000;
  const m0 = (await metrics(srv.url)).values;
  let peakQueued = 0;
  let peakConns = 0;
  let healthMax = 0;
  let stop = false;
  const watcher = (async () => {
    while (!stop) {
      const t = await curlTime(srv.url, '/health');
      assert.equal(t.status, 200);
      healthMax = Math.max(healthMax, t.ms);
      const m = (await metrics(srv.url)).values;
      peakQueued = Math.max(peakQueued, m.tokenspeed_num_requests_running + m.tokenspeed_num_requests_waiting);
      peakConns = Math.max(peakConns, m.tokenspeed_http_connections_open);
      await sleep(25);
    }
  })();
  const t0 = Date.now();
  const rs = await Promise.all(Array.from({ length: N }, (_, i) =>
    streamCompletion(srv.url, { prompt: tokenIds(2, i + 7), max_tokens: 2, ignore_eos: true, temperature: 0 })));
  const wall = Date.now() - t0;
  stop = true;
  await watcher;
  for (const r of rs) {
    assert.equal(r.status, 200);
    assert.equal(r.events.at(-1), '[DONE]');
    assert.equal(r.finish, 'length');
  }
  const m1 = (await waitMetrics(idle))[0];
  assert.equal(m1.tokenspeed_requests_total - m0.tokenspeed_requests_total, N);
  console.log(`1000 streams: ${wall} ms wall, peak running+waiting ${peakQueued}, peak open connections ` +
    `${peakConns}, /health max ${healthMax.toFixed(1)} ms`);
  assert.ok(peakQueued > 256, `the scheduler saw at most ${peakQueued} at once`);
  assert.ok(healthMax < 1000 * TIME_SCALE, `/health took ${healthMax} ms under load`);
});

test('hundreds of clients hanging up mid-stream and mid-request: all cancelled at once, then aborted', async () => {
  const m0 = (await metrics(srv.url)).values;
  const NS = 150;
  const NB = 50;
  const ctrls = [];
  const started = [];
  const body = (i) => JSON.stringify({ prompt: tokenIds(8, 5000 + i), max_tokens: 2000, ignore_eos: true });
  for (let i = 0; i < NS + NB; i++) {
    const c = new AbortController();
    ctrls.push(c);
    const stream = i < NS;
    started.push(fetch(`${srv.url}/v1/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, signal: c.signal,
      body: stream ? JSON.stringify({ ...JSON.parse(body(i)), stream: true }) : body(i),
    }).then(async (r) => { if (stream) await r.body.getReader().read(); }).catch(() => {}));
  }
  // Every request is in the engine (running or waiting) before the hang-up.
  await waitMetrics((m) => m.tokenspeed_requests_total - m0.tokenspeed_requests_total >= NS + NB, 10000);
  await sleep(300);
  const t0 = Date.now();
  for (const c of ctrls) c.abort();
  await Promise.all(started);
  // The HTTP side sees every hang-up at once and cancels its streams ...
  await waitMetrics((m) => m.tokenspeed_http_client_disconnects_total - m0.tokenspeed_http_client_disconnects_total >= NS + NB, 3000);
  const seen = Date.now() - t0;
  // ... and the engine aborts them at its next step (slow on a loaded 2-core CPU: one step of
  // hundreds of sequences can take seconds there).
  const [m1] = await waitMetrics(idle, 30000);
  const freed = Date.now() - t0;
  console.log(`${NS} streams + ${NB} non-streaming hung up: all cancelled by the HTTP layer in ${seen} ms, ` +
    `engine idle after ${freed} ms; aborted ${m1.tokenspeed_requests_aborted_total - m0.tokenspeed_requests_aborted_total}`);
  assert.ok(m1.tokenspeed_requests_aborted_total - m0.tokenspeed_requests_aborted_total >= NS + NB);
  assert.ok(seen < 1500 * TIME_SCALE, `hang-ups seen after ${seen} ms`);
});

test('slowloris: 300 connections trickling headers; /health answers within 1 s; they get 408', async () => {
  const N = 300;
  const socks = await Promise.all(Array.from({ length: N }, () => connect(srv.port)));
  // 2 s header timeout, answered on a loaded 2-core CI machine (4x slower under the sanitizers,
  // where 300 408s and their lingering closes compete with the other test processes).
  const results = socks.map((s) => collect(s, 6000 * TIME_SCALE));
  const line = 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ';
  let k = 0;
  const trickle = setInterval(() => {
    for (const s of socks) if (!s.destroyed) s.write(k < line.length ? line[k] : 'a');
    k++;
  }, 100);
  let worst = 0;
  for (let i = 0; i < 15; i++) {
    const t = await curlTime(srv.url, '/health');
    assert.equal(t.status, 200);
    worst = Math.max(worst, t.ms);
    await sleep(100);
  }
  const rs = await Promise.all(results);
  clearInterval(trickle);
  for (const s of socks) s.destroy();
  const timedOut = rs.filter((r) => r.closed && /^HTTP\/1.1 408/.test(r.data)).length;
  console.log(`slowloris x${N}: /health worst ${worst.toFixed(1)} ms; ${timedOut} answered 408 and closed`);
  assert.ok(worst < 1000 * TIME_SCALE, `/health took ${worst} ms`);
  const m = (await metrics(srv.url)).values;
  const others = rs.filter((r) => !(r.closed && /^HTTP\/1.1 408/.test(r.data)))
    .map((r) => `closed=${r.closed} data=${JSON.stringify(r.data.slice(0, 40))}`);
  assert.equal(timedOut, N, `not answered 408: ${others.slice(0, 5).join('; ')}; header_timeout rejections ` +
    `${m['tokenspeed_http_limit_rejections_total{reason="header_timeout"}']}`);
  assert.ok(m['tokenspeed_http_limit_rejections_total{reason="header_timeout"}'] >= N);
});

test('oversized bodies: chunked and Content-Length both 413 with an OpenAI error', async () => {
  const s = await connect(srv.port);
  const got = collect(s, 5000 * TIME_SCALE);
  s.write('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n');
  const piece = 'a'.repeat(16384);
  for (let sent = 0; sent < BODY_LIMIT * 4 && !s.destroyed; sent += piece.length) {
    s.write(`${piece.length.toString(16)}\r\n${piece}\r\n`);
    await sleep(1);
  }
  const r = await got;
  const [res] = parseResponses(r.data);
  assert.equal(res.status, 413, r.data.slice(0, 300));
  assert.match(JSON.parse(res.body).error.message, /larger than the limit of 65536 bytes/);
  assert.ok(r.closed);

  const big = await postJson(`${srv.url}/v1/completions`, JSON.stringify({ prompt: 'x'.repeat(BODY_LIMIT + 10) }));
  assert.equal(big.status, 413);
  assert.ok(big.json.error.type);
  const m = (await metrics(srv.url)).values;
  assert.ok(m['tokenspeed_http_limit_rejections_total{reason="body_too_large"}'] >= 2);
});

test('pipelined requests are answered in order on one connection', async () => {
  const s = await connect(srv.port);
  const got = collect(s, 5000 * TIME_SCALE);  // ends at the close the last request asks for
  const comp = JSON.stringify({ prompt: tokenIds(8, 3), max_tokens: 3, ignore_eos: true });
  s.write('GET /health HTTP/1.1\r\nHost: x\r\n\r\n' +
    `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${comp.length}\r\n\r\n${comp}` +
    'GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n' +
    'GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
  const r = await got;
  const res = parseResponses(r.data);
  if (res.length !== 4) {  // what the engine was doing, for the log
    const m = (await metrics(srv.url)).values;
    const keys = ['tokenspeed_num_requests_running', 'tokenspeed_num_requests_waiting', 'tokenspeed_requests_total',
      'tokenspeed_requests_finished_total', 'tokenspeed_requests_aborted_total', 'tokenspeed_engine_steps_total'];
    assert.fail(`${res.length} of 4 answers, closed ${r.closed}:\n${r.data}\nengine: ` +
      `${JSON.stringify(Object.fromEntries(keys.map((k) => [k, m[k]])))}\n${srv.log().slice(-3000)}`);
  }
  assert.deepEqual(res.map((x) => x.status), [200, 200, 200, 404]);
  assert.equal(JSON.parse(res[0].body).status, 'ok');
  assert.equal(JSON.parse(res[1].body).usage.completion_tokens, 3);
  assert.equal(JSON.parse(res[2].body).object, 'list');
  assert.ok(r.closed);
});

test('header, URI and body-time limits: 431, 414, 408, malformed 400; each counted', async () => {
  const once = async (bytes, end = true) => {
    const s = await connect(srv.port);
    const got = collect(s, 5000 * TIME_SCALE);
    s.write(bytes);
    if (end) s.end();
    const r = await got;
    s.destroy();
    return parseResponses(r.data)[0];
  };
  assert.equal((await once(`GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${'b'.repeat(10000)}\r\n\r\n`)).status, 431);
  assert.equal((await once(`GET /${'u'.repeat(3000)} HTTP/1.1\r\nHost: x\r\n\r\n`)).status, 414);
  const slow = await once('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"prompt"', false);
  assert.equal(slow.status, 408);
  assert.match(JSON.parse(slow.body).error.message, /request body/);
  const bad = await once('GARBAGE\r\n\r\n');
  assert.equal(bad.status, 400);
  const m = (await metrics(srv.url)).values;
  for (const reason of ['header_too_large', 'uri_too_long', 'body_timeout', 'bad_request'])
    assert.ok(m[`tokenspeed_http_limit_rejections_total{reason="${reason}"}`] >= 1, reason);
});

test('memory returns near the baseline after all of the above', async () => {
  await waitMetrics(idle);
  await sleep(500);
  const rss = rssMiB(srv.proc.pid);
  console.log(`RSS: baseline ${rss0.toFixed(1)} MiB, now ${rss.toFixed(1)} MiB`);
  assert.ok(rss < rss0 + 96, `RSS ${rss} MiB vs baseline ${rss0} MiB`);
  const m = (await metrics(srv.url)).values;
  assert.ok(m.tokenspeed_http_connections_open <= 2, `open connections ${m.tokenspeed_http_connections_open}`);
});

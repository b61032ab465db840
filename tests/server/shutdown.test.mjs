// Graceful shutdown and admission limits on the CPU demo model: SIGTERM under load ends every
// stream with a final event and [DONE] (finished within --drain-timeout, or an error event at
// the deadline), exit code 0; --max-queued-requests and --max-connections-per-ip refuse cleanly.
// Run: TOKENSPEED_BIN=build/tokenspeed node --test tests/server/shutdown.test.mjs
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, tokenIds, sleep, connect, collect, parseResponses, postJson, metrics, streamCompletion, TIME_SCALE } from './lib.mjs';

// Starts `n` streams and resolves once each has received its first bytes; every stream's
// promise resolves to its parsed events when it ends.
async function startStreams(url, n, body) {
  const firsts = [];
  const ends = [];
  for (let i = 0; i < n; i++) {
    let gotFirst;
    firsts.push(new Promise((r) => { gotFirst = r; }));
    ends.push((async () => {
      const r = await fetch(`${url}/v1/completions`, {
        method: 'POST', headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ prompt: tokenIds(8, 900 + i), ...body, stream: true }),
      });
      const reader = r.body.getReader();
      const dec = new TextDecoder();
      let raw = '';
      let first = true;
      try {
        while (true) {
          const { value, done } = await reader.read();
          if (done) break;
          raw += dec.decode(value, { stream: true });
          if (first) { first = false; gotFirst(); }
        }
      } catch (e) {
        return { cut: String(e), raw };
      } finally {
        gotFirst();
      }
      const events = raw.split('\n\n').filter((e) => e.startsWith('data: ')).map((e) => e.slice(6));
      return { events, raw };
    })());
  }
  await Promise.all(firsts);
  return ends;
}

function finalEvent(r) {
  assert.ok(!r.cut, `stream cut: ${r.cut}\n${r.raw?.slice(-300)}`);
  assert.equal(r.events.at(-1), '[DONE]', r.raw.slice(-300));
  const last = JSON.parse(r.events.at(-2));
  return last;
}

test('SIGTERM under load: every stream finishes with finish_reason and [DONE]; exit 0', async () => {
  const srv = await startServer([]);
  const streams = await startStreams(srv.url, 40, { max_tokens: 16, ignore_eos: true, temperature: 0 });
  const buffered = Array.from({ length: 8 }, (_, i) =>
    postJson(`${srv.url}/v1/completions`, { prompt: tokenIds(8, 40 + i), max_tokens: 16, ignore_eos: true }));
  // SIGTERM once the server has all 48 (a fixed sleep raced the 8 connections under ASan: a
  // connection not yet accepted when the listener closes is refused, as it should be).
  for (let t = Date.now(); (await metrics(srv.url)).values.tokenspeed_requests_total < 48; await sleep(5))
    assert.ok(Date.now() - t < 5000 * TIME_SCALE, 'the 48 requests never all arrived');
  const t0 = Date.now();
  const exit = srv.stop();
  const rs = await Promise.all(streams);
  for (const r of rs) assert.equal(finalEvent(r).choices[0].finish_reason, 'length');
  for (const b of await Promise.all(buffered)) {
    assert.equal(b.status, 200, b.text);
    assert.equal(b.json.usage.completion_tokens, 16);
  }
  const code = await exit;
  console.log(`drained 40 streams + 8 requests in ${Date.now() - t0} ms`);
  assert.equal(code.code, 0, srv.log());
  await assert.rejects(fetch(`${srv.url}/health`));  // no longer accepting
});

test('SIGTERM past --drain-timeout: long streams end with an error event and [DONE]; exit 0', async () => {
  const srv = await startServer(['--drain-timeout', '1']);
  const streams = await startStreams(srv.url, 40, { max_tokens: 3000, ignore_eos: true });
  const t0 = Date.now();
  const exit = srv.stop();
  const rs = await Promise.all(streams);
  for (const r of rs) {
    const last = finalEvent(r);
    assert.equal(last.error.code, 'server_shutting_down', JSON.stringify(last));
    assert.match(last.error.message, /shutting down/);
  }
  const code = await exit;
  const ms = Date.now() - t0;
  console.log(`drain deadline 1 s: 40 streams ended, exit after ${ms} ms`);
  assert.equal(code.code, 0, srv.log());
  assert.ok(ms < 6000 * TIME_SCALE, `exit took ${ms} ms`);
});

test('--max-queued-requests answers 503 past the cap; --max-connections-per-ip answers 429', async () => {
  const srv = await startServer(['--max-queued-requests', '4', '--max-connections-per-ip', '64']);
  try {
    // Up to 64 connections (counting the client's pooled one) are fine; the 65th is answered 429.
    const open0 = (await metrics(srv.url)).values.tokenspeed_http_connections_open;
    const socks = await Promise.all(Array.from({ length: 64 - open0 }, () => connect(srv.port)));
    await sleep(100);
    const extra = await connect(srv.port);
    const r = await collect(extra, 3000);
    const [res] = parseResponses(r.data);
    assert.equal(res.status, 429, r.data);
    assert.match(JSON.parse(res.body).error.message, /--max-connections-per-ip/);
    for (const s of socks) s.destroy();
    await sleep(100);
    const again = await streamCompletion(srv.url, { prompt: tokenIds(8, 1), max_tokens: 2 });
    assert.equal(again.status, 200);
    const rs = await Promise.all(Array.from({ length: 48 }, (_, i) =>
      postJson(`${srv.url}/v1/completions`, { prompt: tokenIds(400, 70 + i), max_tokens: 2, ignore_eos: true })));
    const ok = rs.filter((r) => r.status === 200).length;
    const over = rs.filter((r) => r.status === 503);
    console.log(`48 requests at --max-queued-requests 4: ${ok} served, ${over.length} refused`);
    assert.ok(ok >= 4);
    assert.ok(over.length >= 1);
    assert.equal(ok + over.length, 48);
    assert.equal(over[0].json.error.code, 'server_overloaded');
    assert.match(over[0].json.error.message, /--max-queued-requests/);

    const m = (await metrics(srv.url)).values;
    assert.ok(m['tokenspeed_http_limit_rejections_total{reason="queue_full"}'] >= 1);
    assert.ok(m['tokenspeed_http_limit_rejections_total{reason="connections_per_ip"}'] >= 1);
  } finally {
    const code = await srv.stop();
    assert.equal(code.code, 0, srv.log());
  }
});

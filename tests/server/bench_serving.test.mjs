// Smoke test for `tokenspeed bench serving` against a spawned CPU server.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { startServer, BIN } from './lib.mjs';

let srv;
before(async () => { srv = await startServer(); });
after(async () => { if (srv) await srv.stop(); });

test('bench serving prints a table for each concurrency', () => {
  const r = spawnSync(BIN, ['bench', 'serving', '--base-url', srv.url, '--concurrency', '1,4', '--num-prompts', '6',
    '--prompt-tokens', '32', '--max-tokens', '8', '--seed', '3'], { encoding: 'utf8', timeout: 300000 });
  process.stdout.write(r.stdout);
  process.stderr.write(r.stderr);
  assert.equal(r.status, 0);
  const lines = r.stdout.trim().split('\n');
  assert.match(lines[0], /concurrency\s+requests\s+failed.*req\/s\s+out_tok\/s\s+ttft_p50ms\s+ttft_p99ms\s+itl_p50ms\s+itl_p99ms\s+dev_idle%/);
  const rows = lines.slice(1).map((l) => l.trim().split(/\s+/));
  assert.equal(rows.length, 2);
  assert.deepEqual(rows.map((r) => r[0]), ['1', '4']);
  for (const row of rows) {
    assert.equal(row[1], '6');
    assert.equal(row[2], '0');
    assert.ok(Number(row[5]) > 0, 'output tok/s');
    // Device idle between steps, from our server's /metrics counters.
    const idle = Number(row[10]);
    assert.ok(idle >= 0 && idle <= 100, `dev_idle% ${row[10]}`);
  }
});

// --json-schema: the same load, every request grammar-constrained (structured_outputs.json);
// requests end where the grammar does, so each has 1..max_tokens tokens and none fails.
test('bench serving --json-schema runs the load constrained', () => {
  const schema = JSON.stringify({ type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'],
    additionalProperties: false });
  const r = spawnSync(BIN, ['bench', 'serving', '--base-url', srv.url, '--concurrency', '2', '--num-prompts', '4',
    '--prompt-tokens', '16', '--max-tokens', '24', '--seed', '5', '--json-schema', schema],
  { encoding: 'utf8', timeout: 300000 });
  process.stdout.write(r.stdout);
  process.stderr.write(r.stderr);
  assert.equal(r.status, 0);
  const row = r.stdout.trim().split('\n')[1].trim().split(/\s+/);
  assert.deepEqual(row.slice(0, 3), ['2', '4', '0']);
  const bad = spawnSync(BIN, ['bench', 'serving', '--base-url', srv.url, '--json-schema', '{not json'], { encoding: 'utf8' });
  assert.notEqual(bad.status, 0);
});

// --tools: chat completions with tools (tool_choice auto: a triggered grammar; required: every
// output is calls), so tool-calling loads can be measured; bad tools are refused up front.
test('bench serving --tools runs a chat load with tools', () => {
  const tools = JSON.stringify([{ type: 'function', function: { name: 'get_weather',
    parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 8 } }, required: ['city'] } } }]);
  for (const choice of ['auto', 'required']) {
    const r = spawnSync(BIN, ['bench', 'serving', '--base-url', srv.url, '--concurrency', '2', '--num-prompts', '4',
      '--prompt-tokens', '12', '--max-tokens', '48', '--seed', '5', '--tools', tools, '--tool-choice', choice],
    { encoding: 'utf8', timeout: 300000 });
    process.stdout.write(r.stdout);
    process.stderr.write(r.stderr);
    assert.equal(r.status, 0, choice);
    const row = r.stdout.trim().split('\n')[1].trim().split(/\s+/);
    assert.deepEqual(row.slice(0, 3), ['2', '4', '0'], choice);
    assert.ok(Number(row[5]) > 0, 'output tok/s');
  }
  for (const bad of [['--tools', '{}'], ['--tools', '[]'], ['--tools', tools, '--tool-choice', 'sometimes']]) {
    const r = spawnSync(BIN, ['bench', 'serving', '--base-url', srv.url, ...bad], { encoding: 'utf8' });
    assert.notEqual(r.status, 0, bad.join(' '));
  }
});

// docs/DEPLOY.md's recipe, tested: two CPU replicas behind Debian's nginx with session affinity
// (consistent hash on the X-Session-Id header, else on the request's `user` field). Each
// conversation's later turns must land on the replica that holds its prefix: their
// cached_tokens cover the earlier turn. Skips (with a message) when nginx is not installed.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, freePort, metrics, tokenIds, sleep } from './lib.mjs';

const NGINX = ['/usr/sbin/nginx', '/usr/bin/nginx'].find((p) => {
  try { execFileSync(p, ['-v'], { stdio: 'ignore' }); return true; } catch { return false; }
});

// The upstream block of docs/DEPLOY.md (keep the two in step).
export function nginxConf({ port, replicas, dir }) {
  return `
worker_processes 1;
pid ${dir}/nginx.pid;
error_log ${dir}/error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path ${dir}/body; proxy_temp_path ${dir}/proxy;
  fastcgi_temp_path ${dir}/fcgi; uwsgi_temp_path ${dir}/uwsgi; scgi_temp_path ${dir}/scgi;
  # The whole request body in one memory buffer, so $request_body is set when the upstream is picked.
  client_max_body_size 64m;
  client_body_buffer_size 64m;
  client_body_in_single_buffer on;
  # Affinity key: the X-Session-Id header, else the body's "user" field, else the client address.
  map $request_body $ts_user {
    "~\\"user\\"\\s*:\\s*\\"(?<u>[^\\"]+)\\"" $u;
    default "";
  }
  map "$http_x_session_id|$ts_user" $ts_affinity {
    "~^(?<s>[^|]+)\\|" $s;
    "~^\\|(?<u>.+)$" $u;
    default $remote_addr;
  }
  upstream tokenspeed {
    hash $ts_affinity consistent;
${replicas.map((r) => `    server ${r};`).join('\n')}
    keepalive 32;
  }
  server {
    listen 127.0.0.1:${port};
    location / {
      proxy_pass http://tokenspeed;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;          # streamed tokens go out as they come
      proxy_read_timeout 3600s;
      add_header X-Upstream $upstream_addr always;     # which replica answered (debugging, tests)
      add_header X-Affinity-Key $ts_affinity always;
    }
  }
}
`;
}

let reps = [];
let nginx = null;
let dir = null;
let url = null;

before(async () => {
  if (!NGINX) return;
  // Small pools: the test is about routing, not capacity.
  reps = await Promise.all([0, 1].map(() => startServer(['--max-total-tokens', '4096', '--block-size', '16'])));
  dir = mkdtempSync(path.join(os.tmpdir(), 'ts-deploy-'));
  // nginx needs a port number up front; one picked free here can be taken before nginx binds it
  // (ctest runs other servers in parallel, on ephemeral ports). So: retry with another port when
  // nginx exits (bind failed), and count it up only when the answer comes from nginx itself (a
  // replica of another test on that port would answer /health too).
  let log = '';
  for (let attempt = 0; ; attempt++) {
    const port = await freePort();
    writeFileSync(path.join(dir, 'nginx.conf'), nginxConf({ port, replicas: reps.map((r) => `127.0.0.1:${r.port}`), dir }));
    nginx = spawn(NGINX, ['-p', dir, '-c', path.join(dir, 'nginx.conf'), '-e', path.join(dir, 'error.log'), '-g', 'daemon off;'],
      { stdio: ['ignore', 'pipe', 'pipe'] });
    let exited = false;
    nginx.on('exit', () => { exited = true; });
    nginx.stderr.on('data', (d) => { log += d; });
    url = `http://127.0.0.1:${port}`;
    let up = false;
    for (let i = 0; i <= 200 && !exited && !up; i++) {
      try {
        const r = await fetch(`${url}/health`);
        up = r.status === 200 && r.headers.has('x-upstream');  // added by the nginx.conf above
      } catch { /* not up yet */ }
      if (!up) await sleep(50);
    }
    if (up) break;
    nginx.kill('SIGKILL');
    if (attempt >= 4) throw new Error(`nginx did not come up: ${log}`);
  }
});

after(async () => {
  if (nginx) nginx.kill('SIGTERM');
  await Promise.all(reps.map((r) => r.stop()));
  if (dir) rmSync(dir, { recursive: true, force: true });
});

async function turn(body, headers = {}) {
  const r = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...headers },
    body: JSON.stringify({ model: 'pycoder', max_tokens: 2, temperature: 0, ...body }),
  });
  const text = await r.text();
  assert.equal(r.status, 200, text);
  return { usage: JSON.parse(text).usage, key: r.headers.get('x-affinity-key'), upstream: r.headers.get('x-upstream') };
}

async function requestsPerReplica() {
  return Promise.all(reps.map(async (r) => (await metrics(r.url)).values.tokenspeed_requests_total ?? 0));
}

test('later turns land on the replica holding the conversation prefix', { skip: !NGINX && 'nginx is not installed (apt-get install nginx-light)' }, async () => {
  const before = await requestsPerReplica();
  const sessions = 6;
  let turns = 0;
  for (let s = 0; s < sessions; s++) {
    // Half the conversations name themselves by header, half by the OpenAI `user` field.
    const byHeader = s % 2 === 0;
    const key = `conv-${s}`;
    const send = (prompt) => turn(byHeader ? { prompt } : { prompt, user: key }, byHeader ? { 'X-Session-Id': key } : {});
    let history = tokenIds(120, 7000 + s);
    const first = await send(history);
    assert.equal(first.key, key, 'nginx keyed the request by its session');
    turns++;
    for (let t = 1; t < 3; t++) {
      history = history.concat(tokenIds(24, 9000 + s * 10 + t));
      const r = await send(history);
      const u = r.usage;
      assert.equal(r.upstream, first.upstream, `session ${s} turn ${t} changed replica`);
      turns++;
      const prev = history.length - 24;
      assert.ok(u.prompt_tokens_details.cached_tokens >= prev - 16,
        `session ${s} turn ${t}: cached ${u.prompt_tokens_details.cached_tokens} of ${history.length} (earlier turn ${prev})`);
    }
  }
  let after = await requestsPerReplica();
  assert.equal(after[0] - before[0] + after[1] - before[1], turns);
  // The hash spreads keys over both replicas. Where they land depends on the replicas' addresses
  // (random ports), so six keys all fell on one replica in a CI run: more one-turn sessions until
  // both have some; 32 keys all on one replica would be a broken hash (odds 2^-31 for a fair one).
  for (let s = sessions; s < 32 && !(after[0] > before[0] && after[1] > before[1]); s++) {
    await turn({ prompt: tokenIds(16, 7000 + s) }, { 'X-Session-Id': `conv-${s}` });
    after = await requestsPerReplica();
  }
  assert.ok(after[0] > before[0] && after[1] > before[1], `per replica ${after.map((a, i) => a - before[i])}`);
});

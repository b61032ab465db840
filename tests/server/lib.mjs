// Helpers for the server integration tests: spawn the real binary on a free port, wait for
// /health, and tear it down; raw fetch helpers for the error cases.
import { spawn, execFile } from 'node:child_process';
import net from 'node:net';
import path from 'node:path';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
export const BIN = process.env.TOKENSPEED_BIN || path.join(ROOT, 'build/tokenspeed');

export function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.unref();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
// Wall-clock bounds are multiplied by this under the sanitizers (scripts/sanitize.sh sets
// TS_SANITIZED): there the tests hunt memory errors and leaks, and ASan + UBSan slow the engine 2-5x.
export const TIME_SCALE = process.env.TS_SANITIZED ? 4 : 1;

// Starts `tokenspeed serve` with extra args; resolves once GET /health is 200. The server binds
// port 0 and the test reads the port it got from its "listening on" line: a port picked here and
// bound later could be taken in between by another test's server (ctest runs tests in parallel),
// and /health would then be answered by the wrong server.
export async function startServer(args = [], { timeoutMs = 180000 } = {}) {
  const proc = spawn(BIN, ['serve', '--port', '0', '--device', process.env.TS_TEST_DEVICE || 'cpu', ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
    // One sleeping OpenMP thread unless told otherwise: tests share small CI machines. At least
    // info logs: the "listening on" line carries the port.
    env: { OMP_NUM_THREADS: '1', OMP_WAIT_POLICY: 'PASSIVE', ...process.env, TS_LOG_LEVEL: /^(debug|trace)$/.test(process.env.TS_LOG_LEVEL || '') ? process.env.TS_LOG_LEVEL : 'info' },
  });
  let log = '';
  proc.stdout.on('data', (d) => { log += d; });
  proc.stderr.on('data', (d) => { log += d; });
  let exited = null;
  proc.on('exit', (code, sig) => { exited = { code, sig }; });
  const t0 = Date.now();
  let sawLoading = false;
  let port = 0;
  let url = '';
  while (true) {
    if (exited) throw new Error(`server exited early (${JSON.stringify(exited)}):\n${log}`);
    if (Date.now() - t0 > timeoutMs) {
      proc.kill('SIGKILL');
      throw new Error(`server not healthy after ${timeoutMs} ms:\n${log}`);
    }
    if (!port) {
      const m = log.match(/listening on http:\/\/[^\s]*:(\d+)/);
      if (!m) { await sleep(20); continue; }
      port = Number(m[1]);
      url = `http://127.0.0.1:${port}`;
    }
    try {
      const r = await fetch(`${url}/health`);
      if (r.status === 200) break;
      if (r.status === 503) sawLoading = true;
    } catch { /* not listening yet */ }
    await sleep(50);
  }
  return {
    url,
    port,
    proc,
    sawLoading,
    log: () => log,
    async stop() {
      if (exited) return exited;
      const done = new Promise((r) => proc.on('exit', (code, sig) => r({ code, sig })));
      proc.kill('SIGTERM');
      const t = setTimeout(() => proc.kill('SIGKILL'), 15000);
      const res = await done;
      clearTimeout(t);
      return res;
    },
  };
}

export async function postJson(url, body, init = {}) {
  const r = await fetch(url, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: typeof body === 'string' || body instanceof Uint8Array ? body : JSON.stringify(body),
    ...init,
  });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, text, json };
}

// Parses /metrics into { name{labels}: value } and { name: value } (labels dropped, summed).
export async function metrics(url) {
  const text = await (await fetch(`${url}/metrics`)).text();
  const out = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$/);
    if (!m) continue;
    const [, name, labels = '', v] = m;
    if (!labels) out[name] = Number(v);
    else {
      out[name + labels] = Number(v);
      if (!labels.includes('le=')) out[name] = (out[name] ?? 0) + Number(v);
    }
  }
  return { text, values: out };
}

// Deterministic pseudo-random token ids in [lo, hi).
export function tokenIds(n, seed, lo = 100, hi = 8000) {
  let x = seed >>> 0 || 1;
  const ids = [];
  for (let i = 0; i < n; i++) {
    x ^= x << 13; x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5; x >>>= 0;
    ids.push(lo + (x % (hi - lo)));
  }
  return ids;
}

export const CODE_PROMPTS = [
  'def fibonacci(n):\n',
  'import os\nimport sys\n\ndef main():\n',
  'class Stack:\n    def __init__(self):\n',
  'def is_prime(n):\n    if n < 2:\n',
  'for i in range(10):\n',
  'def read_file(path):\n    with open(path) as f:\n',
  '# Sort a list of numbers\ndef sort_numbers(xs):\n',
  'def add(a, b):\n    return',
];

// --- raw HTTP over a socket (hostile-client tests: pipelining, slow or oversized requests) --------

// Opens a TCP connection to 127.0.0.1:port; resolves once connected.
export function connect(port) {
  return new Promise((resolve, reject) => {
    const s = net.connect(port, '127.0.0.1', () => resolve(s));
    s.on('error', reject);
  });
}

// Collects what the server sends on `sock` until it closes or `timeoutMs` passes; resolves to
// { data, closed } (data as a latin1 string).
export function collect(sock, timeoutMs = 5000) {
  return new Promise((resolve) => {
    let data = '';
    let done = false;
    const finish = (closed) => {
      if (done) return;
      done = true;
      clearTimeout(t);
      resolve({ data, closed });
    };
    const t = setTimeout(() => finish(false), timeoutMs);
    sock.on('data', (d) => { data += d.toString('latin1'); });
    sock.on('close', () => finish(true));
    sock.on('error', () => finish(true));
  });
}

// Parses back-to-back HTTP/1.1 responses (Content-Length or chunked bodies) from `data`.
export function parseResponses(data) {
  const out = [];
  let pos = 0;
  while (pos < data.length) {
    const end = data.indexOf('\r\n\r\n', pos);
    if (end < 0) break;
    const lines = data.slice(pos, end).split('\r\n');
    const status = Number(lines[0].split(' ')[1]);
    const headers = {};
    for (const l of lines.slice(1)) {
      const i = l.indexOf(':');
      headers[l.slice(0, i).trim().toLowerCase()] = l.slice(i + 1).trim();
    }
    pos = end + 4;
    let body = '';
    if (headers['transfer-encoding'] === 'chunked') {
      while (true) {
        const le = data.indexOf('\r\n', pos);
        if (le < 0) { pos = data.length; break; }
        const n = parseInt(data.slice(pos, le), 16);
        pos = le + 2;
        if (n === 0) { pos += 2; break; }
        body += data.slice(pos, pos + n);
        pos += n + 2;
      }
    } else {
      const n = Number(headers['content-length'] ?? 0);
      body = data.slice(pos, pos + n);
      pos += n;
    }
    out.push({ status, headers, body });
  }
  return out;
}

// Resident set size of a process in MiB (Linux).
export function rssMiB(pid) {
  const s = readFileSync(`/proc/${pid}/status`, 'utf8');
  return Number(s.match(/VmRSS:\s+(\d+)/)[1]) / 1024;
}

// Streams one completion with fetch; resolves to { status, events (data payloads), text, finish }.
export async function streamCompletion(url, body, init = {}) {
  const r = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ ...body, stream: true }),
    ...init,
  });
  const raw = await r.text();
  const events = raw.split('\n\n').filter((e) => e.startsWith('data: ')).map((e) => e.slice(6));
  let text = '';
  let finish = null;
  let error = null;
  for (const e of events) {
    if (e === '[DONE]') continue;
    const j = JSON.parse(e);
    if (j.error) { error = j.error; continue; }
    for (const c of j.choices ?? []) {
      text += c.text ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { status: r.status, events, text, finish, error };
}

// Milliseconds for one GET of `path`.
export async function timedGet(url, path = '/health') {
  const t0 = performance.now();
  const r = await fetch(`${url}${path}`);
  await r.text();
  return { ms: performance.now() - t0, status: r.status };
}

// Milliseconds for one GET measured by curl in its own process: the server's latency, not this
// test process's event loop (busy with hundreds of its own streams).
export function curlTime(url, path = '/health') {
  return new Promise((resolve) => {
    execFile('curl', ['-s', '-o', '/dev/null', '-m', '10', '-w', '%{http_code} %{time_total}', `${url}${path}`], (err, out) => {
      const [code, t] = String(out).trim().split(' ');
      resolve({ status: Number(code), ms: Number(t) * 1000 });
    });
  });
}

// Shared helpers of the server's end-to-end tests: where the binary and the model are, starting
// `firsttoken serve --port 0` (the bound port is read from its log), and reading /metrics.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, '../../..');
export const BINARY = process.env.FT_BINARY || join(root, 'build/firsttoken');
export const SHARED = process.env.FT_SHARED_DIR || resolve(root, '../shared');
export const MODEL = join(SHARED, 'models/stories260K.gguf');
export const GOLDEN = join(SHARED, 'models/stories260K.golden.json');
export const MODEL_ID = 'stories260K';

// Why the tests cannot run here, or false. `packages`: the npm packages a test file needs (each
// installed, and this node at least the major its package.json's engines.node asks for).
export function skipReason(packages = ['openai']) {
  for (const p of packages) {
    const manifest = join(here, 'node_modules', p, 'package.json');
    if (!existsSync(manifest)) return `node_modules/${p} absent (run scripts/setup.sh or npm ci in tests/e2e/node)`;
    const need = /^>=\s*(\d+)/.exec(JSON.parse(readFileSync(manifest, 'utf8')).engines?.node ?? '')?.[1];
    if (need && Number(process.versions.node.split('.')[0]) < Number(need))
      return `${p} needs node >= ${need}, this is ${process.versions.node}`;
  }
  if (!existsSync(BINARY)) return `firsttoken binary absent: ${BINARY}`;
  if (!existsSync(MODEL)) return `shared test model absent: ${MODEL}`;
  return false;
}

// Makes every fetch() of this process to a host other than the loopback fail, and returns the
// list of the URLs refused: a client that reaches for the network (LangChain's tokenizer table
// for token counting, telemetry) fails its test instead of depending on the network.
export function refuseNetwork() {
  const refused = [];
  const real = globalThis.fetch;
  globalThis.fetch = (input, init) => {
    const url = new URL(typeof input === 'string' || input instanceof URL ? input : input.url);
    if (!['127.0.0.1', 'localhost', '[::1]'].includes(url.hostname)) {
      refused.push(url.href);
      return Promise.reject(new Error(`network access refused in the tests: ${url.href}`));
    }
    return real(input, init);
  };
  return refused;
}

export function golden() {
  return JSON.parse(readFileSync(GOLDEN, 'utf8')).cases.find((c) => c.prompt === 'Once upon a time');
}

// The server's log once it matches re (the logger is asynchronous and stderr arrives on its own
// schedule: a line about a request may come after the response); fails after timeoutMs.
export async function waitLog(server, re, timeoutMs = 5_000) {
  for (const t0 = Date.now(); !re.test(server.log()); await new Promise((res) => setTimeout(res, 10)))
    if (Date.now() - t0 > timeoutMs) assert.fail(`no log line matching ${re} within ${timeoutMs} ms:\n${server.log()}`);
  return server.log();
}

// Starts the server; resolves once it logs "listening on http://HOST:PORT" (60 s at most).
export async function startServer(args = []) {
  const proc = spawn(BINARY, ['serve', '--port', '0', '--log-level', 'info', ...args], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let log = '';
  const exited = new Promise((res) => proc.on('exit', (code, signal) => res({ code, signal })));
  const url = await new Promise((res, rej) => {
    const timer = setTimeout(() => rej(new Error(`server did not start within 60 s:\n${log}`)), 60_000);
    proc.stderr.on('data', (d) => {
      log += d;
      const m = log.match(/listening on (http:\/\/[0-9.:]+)/);
      if (m) {
        clearTimeout(timer);
        res(m[1]);
      }
    });
    exited.then(({ code }) => {
      clearTimeout(timer);
      rej(new Error(`server exited with ${code} before listening:\n${log}`));
    });
  });
  return {
    proc,
    url,
    exited,
    log: () => log,
    // SIGTERM and wait (bounded); resolves to {code, signal, ms}.
    async stop(timeoutMs = 30_000) {
      if (proc.exitCode !== null || proc.signalCode !== null) return exited;
      const t0 = Date.now();
      proc.kill('SIGTERM');
      const killer = setTimeout(() => proc.kill('SIGKILL'), timeoutMs);
      const r = await exited;
      clearTimeout(killer);
      return { ...r, ms: Date.now() - t0 };
    },
  };
}

// Runs `firsttoken serve ARGS` expecting it to exit (a start-up error): {code, log}.
export function runToExit(args, timeoutMs = 60_000) {
  return new Promise((res) => {
    const proc = spawn(BINARY, ['serve', ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
    let log = '';
    proc.stderr.on('data', (d) => (log += d));
    const timer = setTimeout(() => proc.kill('SIGKILL'), timeoutMs);
    proc.on('exit', (code) => {
      clearTimeout(timer);
      res({ code, log });
    });
  });
}

// Parses Prometheus text into {"name{labels}": value}.
export async function metrics(url) {
  const r = await fetch(`${url}/metrics`);
  if (r.status !== 200) throw new Error(`/metrics: ${r.status}`);
  const out = {};
  for (const line of (await r.text()).split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    out[line.slice(0, i)] = Number(line.slice(i + 1));
  }
  return out;
}

// Polls until pred(metrics) holds (bounded); returns the last metrics.
export async function waitMetrics(url, pred, timeoutMs = 20_000) {
  const t0 = Date.now();
  for (;;) {
    const m = await metrics(url);
    if (pred(m)) return m;
    if (Date.now() - t0 > timeoutMs) throw new Error(`metrics condition not met in ${timeoutMs} ms: ${JSON.stringify(m)}`);
    await new Promise((r) => setTimeout(r, 25));  // (awaited: no stray timer)
  }
}

export async function postJson(url, path, body, headers = {}) {
  const r = await fetch(url + path, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await r.text();
  let json = null;
  try {
    json = JSON.parse(text);
  } catch {}
  return { status: r.status, headers: r.headers, text, json };
}

// A usage object without prompt_tokens_details (its cached_tokens depends on what the prefix cache
// holds from earlier requests), for exact comparisons; the details must be there, a count.
export function usageCounts(u) {
  if (u === null || u === undefined) return u;
  const { prompt_tokens_details, ...rest } = u;
  assert.equal(typeof prompt_tokens_details?.cached_tokens, 'number', JSON.stringify(u));
  assert.ok(prompt_tokens_details.cached_tokens >= 0 && prompt_tokens_details.cached_tokens <= u.prompt_tokens, JSON.stringify(u));
  return rest;
}

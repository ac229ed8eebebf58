// Start-up, overload and shutdown of `firsttoken serve`: the config file (unknown keys, features
// not built yet, CLI flags overriding it), 429 with Retry-After over --max-queue and from
// --reject-late, the built-in
// model without -m, and SIGTERM during load (exit 0 within the deadline; every client gets a
// complete response or a clean error).
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';

import { MODEL, MODEL_ID, golden, metrics, postJson, runToExit, skipReason, startServer } from './helpers.mjs';

const skip = skipReason();

describe('serve lifecycle', { skip }, () => {
  let dir, OpenAI, gold;
  before(async () => {
    OpenAI = (await import('openai')).default;
    gold = golden();
    dir = mkdtempSync(join(tmpdir(), `ft-serve-${process.pid}-`));
  });
  after(() => dir && rmSync(dir, { recursive: true, force: true }));

  const config = (name, obj) => {
    const p = join(dir, name);
    writeFileSync(p, typeof obj === 'string' ? obj : JSON.stringify(obj));
    return p;
  };

  test('config file errors: unknown key named, bad values named, unbuilt features "not supported yet", exit 1', async () => {
    const cases = [
      [{ scheduler: { prefill_chunk: 64 } }, /unknown key 'scheduler\.prefill_chunk'/],
      [{ sched: {} }, /unknown key 'sched'/],
      [{ scheduler: { enable_speculative_decoding: true }, speculative: { method: 'lookahead' } },
        /speculative\.method.*unknown speculative decoding method 'lookahead'/],
      // tp_size / pp_size 2 outside mpirun (or in a build without MPI): named, not ignored
      [{ parallel_config: { tp_size: 2 } }, /tp_size x pp_size = 2 x 1 = 2 but the job has 1 MPI ranks|needs MPI/],
      [{ parallel_config: { pp_size: 2 } }, /tp_size x pp_size = 1 x 2 = 2 but the job has 1 MPI ranks|needs MPI/],
      [{ kv_cache: { block_size: 'big' } }, /kv_cache\.block_size' must be an integer/],
      ['{not json', /not valid JSON/],
    ];
    for (const [i, [obj, re]] of cases.entries()) {
      const r = await runToExit(['-m', MODEL, '--config', config(`bad${i}.json`, obj)]);
      assert.equal(r.code, 1, r.log);
      assert.match(r.log, re);
    }
  });

  test('--max-queue: 429 with Retry-After and an error body; CLI flags override the config file', async () => {
    const cfg = config('q.json', {
      scheduler: { prefill_chunk_size: 'auto', step_latency_target_ms: 50, max_active_adapters: 0, enable_speculative_decoding: false },
      parallel_config: { tp_size: 1, pp_size: 1, optimize_for_latency: true },
      server: { max_queue: 1, http_threads: 2 },
      kv_cache: { memory_mib: 16, block_size: 16, prefix_caching: true },
    });
    const s = await startServer(['-m', MODEL, '--config', cfg, '--threads', '1']);
    try {
      // One request may wait (0 is refused at start-up: it refused every request); of many sent at
      // once, some wait behind the first's prefill and are refused. Each prompt its own (a prefix
      // cache hit would make a prefill, the time a request waits, next to nothing).
      const prompt = (i) => `${i} ` + 'Once upon a time there was a little girl. '.repeat(30);
      const rs = await Promise.all(Array.from({ length: 24 }, (_, i) =>
        postJson(s.url, '/v1/completions', { model: MODEL_ID, prompt: prompt(i), max_tokens: 4 })));
      const refused = rs.filter((r) => r.status === 429);
      assert.ok(refused.length >= 1, rs.map((r) => r.status).join(','));
      for (const r of rs) assert.ok(r.status === 200 || r.status === 429, r.text);
      assert.ok(Number(refused[0].headers.get('retry-after')) >= 1);
      assert.equal(typeof refused[0].json.error.message, 'string');
      const client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'x', maxRetries: 0 });
      const cs = await Promise.allSettled(Array.from({ length: 24 }, (_, i) =>
        client.completions.create({ model: MODEL_ID, prompt: prompt(100 + i), max_tokens: 2 })));
      const clientRefused = cs.filter((c) => c.status === 'rejected');
      assert.ok(clientRefused.length >= 1);
      for (const c of clientRefused) assert.equal(c.reason.status, 429);
      assert.equal((await metrics(s.url))['firsttoken:request_rejected_total'], refused.length + clientRefused.length);
      assert.equal((await fetch(`${s.url}/health`)).status, 200);
    } finally {
      assert.equal((await s.stop()).code, 0);
    }
    const s2 = await startServer(['-m', MODEL, '--config', cfg, '--max-queue', '8', '--threads', '1']);
    try {
      const r = await postJson(s2.url, '/v1/completions', { model: MODEL_ID, prompt: gold.prompt, max_tokens: 4, temperature: 0 });
      assert.equal(r.status, 200, r.text);
    } finally {
      assert.equal((await s2.stop()).code, 0);
    }
  });

  test('--reject-late: a request that cannot meet its ttft_slo_ms gets 429 + Retry-After at once, counted', async () => {
    const s = await startServer(['-m', MODEL, '--reject-late', '1', '--threads', '1']);
    try {
      const r = await postJson(s.url, '/v1/completions', { model: MODEL_ID, prompt: 'Once', max_tokens: 4, ttft_slo_ms: 0.001 });
      assert.equal(r.status, 429, r.text);
      assert.ok(Number(r.headers.get('retry-after')) >= 1);
      assert.equal(r.json.error.code, 'deadline_unmeetable');
      const ok = await postJson(s.url, '/v1/completions', { model: MODEL_ID, prompt: 'Once', max_tokens: 4, priority: -1 });
      assert.equal(ok.status, 200, ok.text);
      const m = await metrics(s.url);
      assert.equal(m['firsttoken:request_rejected_late_total'], 1);
      assert.equal(m['firsttoken:request_rejected_total'], 1);
      assert.ok(m['firsttoken:step_time_prediction_error_ratio_count'] >= 1);
    } finally {
      assert.equal((await s.stop()).code, 0);
    }
  });

  test('header and body read timeouts close stalled connections; Expect: 100-continue is answered', async () => {
    const cfg = config('t.json', { server: { header_timeout_s: 0.5, body_timeout_s: 0.5 } });
    const s = await startServer(['-m', MODEL, '--config', cfg, '--threads', '1']);
    try {
      const net = await import('node:net');
      const { hostname, port } = new URL(s.url);
      // Resolves with what the server sent and how long until it closed the connection.
      const stall = (bytes) => new Promise((res) => {
        const t0 = Date.now();
        let data = '';
        const c = net.connect(Number(port), hostname, () => c.write(bytes));
        c.on('data', (d) => (data += d));
        c.on('close', () => res({ data, ms: Date.now() - t0 }));
        c.on('error', () => {});
        setTimeout(() => c.destroy(), 20_000).unref();
      });
      const h = await stall('POST /v1/completions HTTP/1.1\r\nHost: x\r\n');  // headers never finish
      assert.ok(h.ms < 10_000, `header timeout: closed after ${h.ms} ms`);
      const b = await stall('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n' +
                            'Expect: 100-continue\r\nContent-Length: 100\r\n\r\n{"model"');  // body never finishes
      assert.ok(b.ms < 10_000, `body timeout: closed after ${b.ms} ms`);
      assert.match(b.data, /^HTTP\/1\.1 100 Continue\r\n\r\n/);
      assert.equal((await fetch(`${s.url}/health`)).status, 200);
    } finally {
      assert.equal((await s.stop()).code, 0);
    }
  });

  test('without -m: the built-in synthetic model serves', async () => {
    const s = await startServer(['--threads', '1']);
    try {
      const client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'x', maxRetries: 0 });
      const models = await client.models.list();
      assert.equal(models.data[0].id, 'tiny');
      const r = await client.completions.create({ model: 'tiny', prompt: 'hello', max_tokens: 8, temperature: 0, ignore_eos: true });
      assert.equal(r.usage.completion_tokens, 8);
      assert.match(s.log(), /random weights/);
    } finally {
      assert.equal((await s.stop()).code, 0);
    }
  });

  test('SIGTERM during load: exit 0 within the deadline; complete responses or clean errors', async () => {
    const deadlineS = 2;
    const s = await startServer(['-m', MODEL, '--threads', '1', '--kv-memory', '128', '--shutdown-timeout', String(deadlineS)]);
    const client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'x', maxRetries: 0, timeout: 60_000 });
    let started = 0;
    let signalStarted;
    const allStarted = new Promise((r) => (signalStarted = r));
    const streaming = async () => {
      const stream = await client.completions.create({ model: MODEL_ID, prompt: gold.prompt, max_tokens: 2000, temperature: 0, ignore_eos: true, stream: true });
      let finish = null, first = true;
      for await (const c of stream) {
        if (first && ++started === 16) signalStarted();
        first = false;
        finish = c.choices[0].finish_reason ?? finish;
      }
      return finish;
    };
    const plain = async () => (await client.completions.create({ model: MODEL_ID, prompt: gold.prompt, max_tokens: 1500, temperature: 0, ignore_eos: true })).choices[0].finish_reason;
    const outcome = (p) => p.then((finish) => ({ finish }), (error) => ({ error }));
    const clients = [...Array.from({ length: 16 }, () => outcome(streaming())), ...Array.from({ length: 8 }, () => outcome(plain()))];
    await Promise.race([allStarted, new Promise((r) => setTimeout(r, 30_000).unref())]);
    const t0 = Date.now();
    const r = await s.stop(60_000);
    const ms = Date.now() - t0;
    assert.equal(r.code, 0, s.log());
    assert.ok(ms < (deadlineS + 4) * 1000, `took ${ms} ms to exit`);
    let complete = 0, cancelled = 0;
    for (const o of await Promise.all(clients)) {
      if (o.error) {
        // A clean error: the server's OpenAI-style error (an SSE error event or a 503 body), not a torn connection.
        assert.ok(o.error instanceof OpenAI.APIError && !(o.error instanceof OpenAI.APIConnectionError), `unclean: ${o.error}`);
        assert.match(String(o.error.message), /shutting down/);
        ++cancelled;
      } else {
        assert.equal(o.finish, 'length');
        ++complete;
      }
    }
    assert.equal(complete + cancelled, 24);
    // 24 requests of up to 2000 tokens on one thread outlast a 2 s deadline: the cancel path ran.
    assert.ok(cancelled > 0, 'no request was cancelled: the test did not exercise the deadline');
    assert.match(s.log(), /shutting down/);
  });
});

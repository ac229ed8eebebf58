// Several choices (`n`, completions' `best_of`) and completions' `echo` (with the prompt's
// logprobs), through the official openai client on stories260K: the n choices share one prefill
// of the prompt (one engine request whose forks take its KV blocks, with or without the prefix
// cache), are independent samples under sampling (choice i is seed + i) and all equal the n = 1
// answer under greedy; best_of returns the candidates with the highest mean logprob per token; an
// echoed prompt's logprobs are what the model predicts for each prompt token at generation time.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';

import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';

import { BINARY, MODEL, MODEL_ID, SHARED, golden, metrics, postJson, skipReason, startServer, usageCounts, waitLog, waitMetrics } from './helpers.mjs';

const skip = skipReason();
const HITS = 'firsttoken:prefix_cache_hits_total';
const PREFILL = 'firsttoken:prefill_tokens_total';

// A streamed completion with include_usage against the same request unstreamed (want): each
// choice's text by its index, one finish per choice, the usage once and last.
async function expectStreamed(stream, want) {
  const text = want.choices.map(() => ''), finish = want.choices.map(() => []);
  let usage = null, after_usage = 0;
  for await (const c of stream) {
    if (usage) ++after_usage;
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      text[ch.index] += ch.text;
      if (ch.finish_reason) finish[ch.index].push(ch.finish_reason);
    }
  }
  assert.deepEqual(text, want.choices.map((c) => c.text));
  assert.deepEqual(finish, want.choices.map((c) => [c.finish_reason]));
  assert.deepEqual(usageCounts(usage), usageCounts(want.usage));
  assert.equal(after_usage, 0);
}

describe('choices and echo (stories260K)', { skip }, () => {
  let server, client, gold;

  before(async () => {
    const OpenAI = (await import('openai')).default;
    gold = golden();
    server = await startServer(['-m', MODEL, '--threads', '1']);
    client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'x', maxRetries: 0, timeout: 120_000 });
  });
  after(async () => {
    if (!server) return;
    const r = await server.stop();
    assert.equal(r.code, 0, server.log());
  });

  const tokenize = async (prompt) => (await postJson(server.url, '/tokenize', { prompt })).json.tokens;

  test('n > 1, greedy: one prefill of the prompt; every choice equals the n = 1 answer', async () => {
    const prompt = `${gold.prompt} there was a little girl who lived in a small house near the big forest with her mother`;
    const P = (await tokenize(prompt)).length;
    const m0 = await metrics(server.url);
    const r = await client.completions.create({ model: MODEL_ID, prompt, n: 3, max_tokens: 12, temperature: 0 });
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
    // The prompt was computed once; choices 1 and 2 forked its KV (no prefix-cache lookups).
    const m = await waitMetrics(server.url, (x) => x[PREFILL] - m0[PREFILL] >= P);
    assert.equal(m[PREFILL] - m0[PREFILL], P);
    assert.equal(m[HITS] - m0[HITS], 0);
    const log = await waitLog(server, new RegExp(`${r.id} completion choice=2 finish=\\w+ prompt=${P} cached=0 `));
    assert.match(log, new RegExp(`${r.id} completion choice=1 finish=\\w+ prompt=${P} cached=0 `));

    const one = await client.completions.create({ model: MODEL_ID, prompt, max_tokens: 12, temperature: 0 });
    for (const c of r.choices) {
      assert.equal(c.text, one.choices[0].text);
      assert.equal(c.finish_reason, one.choices[0].finish_reason);
    }
    assert.equal(r.usage.prompt_tokens, P);  // the prompt once, every choice's tokens
    assert.equal(r.usage.completion_tokens, 3 * one.usage.completion_tokens);

    const chat = await client.chat.completions.create({ model: MODEL_ID, messages: [{ role: 'user', content: prompt }], n: 2, max_tokens: 8, temperature: 0 });
    assert.equal(chat.choices.length, 2);
    assert.equal(chat.choices[1].index, 1);
    assert.equal(chat.choices[0].message.content, chat.choices[1].message.content);
  });

  test('n > 1 without the prefix cache (kv_cache.prefix_caching false): still one prefill, the same choices', async () => {
    const dir = mkdtempSync(join(tmpdir(), `ft-choices-${process.pid}-`));
    const config = join(dir, 'serve.json');
    writeFileSync(config, JSON.stringify({ kv_cache: { prefix_caching: false } }));
    const plain = await startServer(['-m', MODEL, '--threads', '1', '--config', config]);
    try {
      const c2 = new (await import('openai')).default({ baseURL: `${plain.url}/v1`, apiKey: 'x', maxRetries: 0, timeout: 120_000 });
      const prompt = `${gold.prompt} a small boat sailed on the river under the bright sun`;
      const P = (await tokenize(prompt)).length;
      const m0 = await metrics(plain.url);
      const r = await c2.completions.create({ model: MODEL_ID, prompt, n: 4, max_tokens: 10, temperature: 0 });
      const m = await waitMetrics(plain.url, (x) => x[PREFILL] - m0[PREFILL] >= P);
      assert.equal(m[PREFILL] - m0[PREFILL], P);  // not 4 P
      assert.equal(m[HITS], 0);
      const one = await c2.completions.create({ model: MODEL_ID, prompt, max_tokens: 10, temperature: 0 });
      for (const c of r.choices) assert.equal(c.text, one.choices[0].text);
      const req = { model: MODEL_ID, prompt, max_tokens: 10, temperature: 1, seed: 5 };
      const s = await c2.completions.create({ ...req, n: 3 });
      for (const i of [1, 2]) assert.equal(s.choices[i].text, (await c2.completions.create({ ...req, seed: 5 + i })).choices[0].text);
    } finally {
      const x = await plain.stop();
      rmSync(dir, { recursive: true, force: true });
      assert.equal(x.code, 0, plain.log());
    }
  });

  test('best_of: the n candidates with the highest mean logprob per token, best first; usage counts every candidate', async () => {
    const prompt = `${gold.prompt} a frog`;
    const req = { model: MODEL_ID, prompt, max_tokens: 8, temperature: 1, seed: 21, ignore_eos: true };
    const r = await client.completions.create({ ...req, n: 2, best_of: 5 });
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1]);
    assert.equal(r.choices[0].logprobs, null);  // ranked by logprobs it was not asked for
    // Candidate i is the n = 1 answer with seed + i.
    const cands = [];
    for (let i = 0; i < 5; ++i) {
      const one = await client.completions.create({ ...req, seed: 21 + i, logprobs: 0 });
      const lp = one.choices[0].logprobs.token_logprobs;
      cands.push({ text: one.choices[0].text, mean: lp.reduce((a, b) => a + b, 0) / lp.length });
    }
    cands.sort((a, b) => b.mean - a.mean);
    assert.ok(cands[1].mean > cands[2].mean + 1e-4, JSON.stringify(cands));  // a clear cut (seed chosen so)
    assert.deepEqual(r.choices.map((c) => c.text), [cands[0].text, cands[1].text]);
    assert.deepEqual(usageCounts(r.usage), { prompt_tokens: r.usage.prompt_tokens, completion_tokens: 5 * 8, total_tokens: r.usage.prompt_tokens + 40 });
    // With logprobs: each returned choice carries its own.
    const w = await client.completions.create({ ...req, n: 1, best_of: 3, logprobs: 1 });
    const lp = w.choices[0].logprobs.token_logprobs;
    assert.equal(lp.length, 8);
    const best = cands.filter((c) => c.text === w.choices[0].text);
    assert.ok(best.length === 1 && Math.abs(best[0].mean - lp.reduce((a, b) => a + b, 0) / 8) < 1e-4);
    // OpenAI's rules: best_of >= n; not streamable when it ranks.
    await assert.rejects(client.completions.create({ ...req, n: 2, best_of: 3, stream: true }),
      (e) => e.status === 400 && e.param === 'best_of' && /cannot be streamed/.test(e.message));
    await assert.rejects(client.completions.create({ ...req, n: 3, best_of: 2 }), (e) => e.status === 400 && e.param === 'best_of');
  });

  test('n > 1, sampling: independent choices, choice i is the n = 1 answer with seed + i', async () => {
    const prompt = `${gold.prompt} a dog`;
    const req = { model: MODEL_ID, prompt, max_tokens: 16, temperature: 1, seed: 11 };
    const r = await client.completions.create({ ...req, n: 4 });
    assert.equal(r.choices.length, 4);
    assert.ok(new Set(r.choices.map((c) => c.text)).size >= 3, JSON.stringify(r.choices.map((c) => c.text)));
    for (const i of [0, 3]) {
      const one = await client.completions.create({ ...req, seed: 11 + i });
      assert.equal(r.choices[i].text, one.choices[0].text, `choice ${i}`);
    }
  });

  test('n > 1, streaming: chunks carry their choice index; one finish per choice; usage once, last', async () => {
    const prompt = `${gold.prompt} a cat`;
    const want = await client.completions.create({ model: MODEL_ID, prompt, n: 2, max_tokens: 10, temperature: 0 });
    await expectStreamed(await client.completions.create({ model: MODEL_ID, prompt, n: 2, max_tokens: 10, temperature: 0, stream: true, stream_options: { include_usage: true } }), want);

    const chat = await client.chat.completions.create({ model: MODEL_ID, messages: [{ role: 'user', content: prompt }], n: 2, max_tokens: 6, temperature: 0, stream: true });
    const roles = new Set(), content = ['', ''];
    for await (const c of chat) {
      for (const ch of c.choices) {
        if (ch.delta.role) roles.add(ch.index);
        content[ch.index] += ch.delta.content ?? '';
      }
    }
    assert.deepEqual([...roles].sort(), [0, 1]);  // each choice's first chunk names the role
    assert.equal(content[0], content[1]);
  });

  test('batched prompts (string[] and int[][]): prompt i\'s choices at i*n.., each its single answer; usage summed', async () => {
    const prompts = [`${gold.prompt} a fox`, `${gold.prompt} a small red boat`, 'Lily and Ben'];
    const req = { model: MODEL_ID, max_tokens: 8, temperature: 0 };
    const singles = [];
    for (const prompt of prompts) singles.push(await client.completions.create({ ...req, prompt }));
    const r = await client.completions.create({ ...req, prompt: prompts, n: 2 });
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2, 3, 4, 5]);
    for (let i = 0; i < prompts.length; ++i)
      for (const j of [0, 1]) {
        assert.equal(r.choices[2 * i + j].text, singles[i].choices[0].text, `prompt ${i} choice ${j}`);
        assert.equal(r.choices[2 * i + j].finish_reason, singles[i].choices[0].finish_reason);
      }
    const sum = (k) => singles.reduce((a, x) => a + x.usage[k], 0);
    assert.equal(r.usage.prompt_tokens, sum('prompt_tokens'));  // each prompt once
    assert.equal(r.usage.completion_tokens, 2 * sum('completion_tokens'));

    // Token id arrays, echoed: each choice starts with its own prompt.
    const ids = [await tokenize(prompts[0]), await tokenize(prompts[2])];
    const t = await client.completions.create({ ...req, prompt: ids, echo: true });
    assert.equal(t.choices.length, 2);
    for (const i of [0, 1]) {
      const one = await client.completions.create({ ...req, prompt: ids[i], echo: true });
      assert.equal(t.choices[i].text, one.choices[0].text);
    }

    // Streamed: the same texts by index, one finish per choice, usage once and last.
    await expectStreamed(await client.completions.create({ ...req, prompt: prompts, n: 2, stream: true, stream_options: { include_usage: true } }), r);

    // A prompt that cannot be served refuses the request before any of its prompts runs.
    const before = await metrics(server.url);
    const long = Array(20000).fill(ids[0][1]);
    await assert.rejects(client.completions.create({ ...req, prompt: [ids[0], long] }), (e) => e.status === 400 && /prompt|context/.test(e.message));
    // ('' is a document's start, BOS alone; without BOS it is nothing: refused.)
    await assert.rejects(client.completions.create({ ...req, prompt: ['a', ''], add_special_tokens: false }),
      (e) => e.status === 400 && e.param === 'prompt');
    await waitMetrics(server.url, (x) => x['firsttoken:num_requests_running'] === 0 && x['firsttoken:num_requests_waiting'] === 0 &&
      x['firsttoken:kv_cache_used_blocks'] === 0);
    const after = await metrics(server.url);
    assert.equal(after['firsttoken:generation_tokens_total'], before['firsttoken:generation_tokens_total']);
    assert.equal(after['firsttoken:prefill_tokens_total'], before['firsttoken:prefill_tokens_total']);
    assert.equal((await client.completions.create({ ...req, prompt: prompts.slice(0, 2) })).choices.length, 2);  // still serving

    // The refused prompts' admissions are given back: with --max-queue 2, batches of two good
    // prompts and a refused one, again and again, leave room for the next request.
    const small = await startServer(['-m', MODEL, '--threads', '1', '--max-queue', '2']);
    try {
      const c2 = new (await import('openai')).default({ baseURL: `${small.url}/v1`, apiKey: 'x', maxRetries: 0, timeout: 120_000 });
      for (let k = 0; k < 3; ++k)
        await assert.rejects(c2.completions.create({ ...req, prompt: [ids[0], ids[1], long] }), (e) => e.status === 400);
      await assert.rejects(c2.completions.create({ ...req, prompt: [ids[0], ids[1], ids[0]] }), (e) => e.status === 429);
      assert.equal((await c2.completions.create({ ...req, prompt: ids })).choices.length, 2);
    } finally {
      const x = await small.stop();
      assert.equal(x.code, 0, small.log());
    }
  });

  test("vLLM's truncate_prompt_tokens (the prompt's last k tokens), add_special_tokens and include_stop_str_in_output", async () => {
    const req = { model: MODEL_ID, max_tokens: 8, temperature: 0 };
    const prompt = `${gold.prompt} a small red boat sailed on the river`;
    const ids = await tokenize(prompt);
    const r = await client.completions.create({ ...req, prompt, truncate_prompt_tokens: 5 });
    assert.equal(r.usage.prompt_tokens, 5);
    const tail = await client.completions.create({ ...req, prompt: ids.slice(-5) });
    assert.equal(r.choices[0].text, tail.choices[0].text);
    const all = await client.completions.create({ ...req, prompt, truncate_prompt_tokens: -1 });  // fits: all of it
    assert.equal(all.usage.prompt_tokens, ids.length);
    // add_special_tokens: false: no BOS before the text.
    const plainIds = (await postJson(server.url, '/tokenize', { prompt, add_special_tokens: false })).json.tokens;
    assert.equal(plainIds.length, ids.length - 1);
    const nobos = await client.completions.create({ ...req, prompt, add_special_tokens: false });
    assert.equal(nobos.usage.prompt_tokens, plainIds.length);
    assert.equal(nobos.choices[0].text, (await client.completions.create({ ...req, prompt: plainIds })).choices[0].text);

    const plain = await client.completions.create({ ...req, prompt: gold.prompt, max_tokens: 24 });
    const text = plain.choices[0].text;
    const stop = text.slice(6, 9);
    const at = text.indexOf(stop);
    assert.ok(stop.length === 3 && at >= 0, JSON.stringify(text));
    const cut = await client.completions.create({ ...req, prompt: gold.prompt, max_tokens: 24, stop: [stop] });
    assert.equal(cut.choices[0].text, text.slice(0, at));
    assert.equal(cut.choices[0].finish_reason, 'stop');
    const kept = await client.completions.create({ ...req, prompt: gold.prompt, max_tokens: 24, stop: [stop], include_stop_str_in_output: true });
    assert.equal(kept.choices[0].text, text.slice(0, at + stop.length));
    assert.equal(kept.choices[0].finish_reason, 'stop');
  });

  test("vLLM's continue_final_message: the assistant's last message continued, not closed", async () => {
    const messages = [{ role: 'user', content: 'Tell me a story.' }, { role: 'assistant', content: 'Once upon a time, a little' }];
    // The built-in chatml rendering, cut after the final message's content: no <|im_end|>, no new turn.
    const text = '<|im_start|>user\nTell me a story.<|im_end|>\n<|im_start|>assistant\nOnce upon a time, a little';
    const ids = (await postJson(server.url, '/tokenize', { prompt: text, add_special_tokens: false })).json.tokens;
    const want = await client.completions.create({ model: MODEL_ID, prompt: ids, max_tokens: 8, temperature: 0 });
    const r = await client.chat.completions.create({ model: MODEL_ID, messages, max_tokens: 8, temperature: 0, continue_final_message: true });
    assert.equal(r.usage.prompt_tokens, ids.length);
    assert.equal(r.choices[0].message.content, want.choices[0].text);
    const closed = await client.chat.completions.create({ model: MODEL_ID, messages, max_tokens: 8, temperature: 0, add_generation_prompt: false });
    assert.ok(closed.usage.prompt_tokens > ids.length);  // (without it the message is closed)
    await assert.rejects(client.chat.completions.create({ model: MODEL_ID, messages: messages.slice(0, 1), max_tokens: 4, continue_final_message: true }),
      (e) => e.status === 400 && e.param === 'continue_final_message');
    await assert.rejects(client.chat.completions.create({ model: MODEL_ID, messages, max_tokens: 4, continue_final_message: true, add_generation_prompt: true }),
      (e) => e.status === 400 && e.param === 'continue_final_message');
  });

  test("vLLM's cache_salt: prefix-cache blocks are shared only under the same salt", async () => {
    const prompt = `${gold.prompt} the salty sea was wide and blue and the little fish swam in it all day long`;
    const req = { model: MODEL_ID, prompt, max_tokens: 2, temperature: 0 };
    const hits = async () => (await metrics(server.url))[HITS];
    const h0 = await hits();
    const a = await client.completions.create({ ...req, cache_salt: 'tenant-a' });
    const h1 = await hits();
    assert.equal(h1, h0);  // a fresh prompt
    await client.completions.create({ ...req, cache_salt: 'tenant-b' });
    await client.completions.create(req);  // no salt: the unsalted key space
    assert.equal(await hits(), h1);
    const again = await client.completions.create({ ...req, cache_salt: 'tenant-a' });
    assert.ok(await hits() > h1);
    assert.equal(again.choices[0].text, a.choices[0].text);
    await assert.rejects(client.completions.create({ ...req, cache_salt: '' }), (e) => e.status === 400 && e.param === 'cache_salt');
  });

  test('n > 1: a client that disconnects mid-stream cancels every choice and frees their KV blocks', async () => {
    const before = await metrics(server.url);
    const ac = new AbortController();
    const stream = await client.completions.create(
      { model: MODEL_ID, prompt: `${gold.prompt} a bird`, n: 3, max_tokens: 2000, temperature: 0, ignore_eos: true, stream: true },
      { signal: ac.signal });
    const seen = new Set();
    try {
      for await (const c of stream) {
        for (const ch of c.choices) seen.add(ch.index);
        if (seen.size === 3) ac.abort();  // every choice is running
      }
    } catch (e) {
      assert.ok(ac.signal.aborted, `unexpected error: ${e}`);
    }
    assert.equal(seen.size, 3);
    const abort = 'firsttoken:request_success_total{finished_reason="abort"}';
    const m = await waitMetrics(server.url, (x) => x[abort] === before[abort] + 3 &&
      x['firsttoken:num_requests_running'] === 0 && x['firsttoken:kv_cache_used_blocks'] === 0);
    assert.ok(m['firsttoken:generation_tokens_total'] - before['firsttoken:generation_tokens_total'] < 3 * 2000);
    const r = await client.completions.create({ model: MODEL_ID, prompt: gold.prompt, n: 2, max_tokens: 3 });
    assert.equal(r.choices.length, 2);  // still serving
  });

  test('echo: the prompt before the completion; with logprobs, the prompt tokens first (the first null)', async () => {
    const req = { model: MODEL_ID, prompt: gold.prompt, max_tokens: 6, temperature: 0 };
    const plain = await client.completions.create({ ...req, logprobs: 2 });
    const echoed = await client.completions.create({ ...req, echo: true });
    assert.equal(echoed.choices[0].text, gold.prompt + plain.choices[0].text);
    assert.equal(echoed.choices[0].logprobs, null);

    const r = await client.completions.create({ ...req, echo: true, logprobs: 2 });
    assert.equal(r.choices[0].text, gold.prompt + plain.choices[0].text);
    const lp = r.choices[0].logprobs, want = plain.choices[0].logprobs;
    const P = r.usage.prompt_tokens;
    assert.equal(P, gold.prompt_tokens.length);
    assert.equal(lp.tokens.length, P + want.tokens.length);
    assert.equal(lp.token_logprobs[0], null);
    assert.equal(lp.top_logprobs[0], null);
    for (let i = 1; i < P; ++i) {
      assert.ok(lp.token_logprobs[i] <= 0, `${i}: ${lp.token_logprobs[i]}`);
      const top = Object.values(lp.top_logprobs[i]);
      assert.ok(top.length >= 1 && top.length <= 2);
      assert.ok(Math.max(...top) >= lp.token_logprobs[i] - 1e-6);
    }
    assert.deepEqual(lp.tokens.slice(P), want.tokens);  // the completion's part is the plain request's
    assert.deepEqual(lp.token_logprobs.slice(P), want.token_logprobs);
    assert.deepEqual(lp.top_logprobs.slice(P), want.top_logprobs);
    // The tokens add up to the text (the space a tokenizer puts before it is not in either).
    assert.equal(lp.tokens.join(''), r.choices[0].text);
    assert.equal(lp.text_offset[0], 0);
    for (let i = 1; i < lp.text_offset.length; ++i)
      assert.equal(lp.text_offset[i], lp.text_offset[i - 1] + [...lp.tokens[i - 1]].length);
    assert.equal(lp.text_offset[P], [...gold.prompt].length);  // the completion's first token

    // Streamed: the prompt goes out with the first chunk.
    const stream = await client.completions.create({ ...req, echo: true, stream: true });
    let text = '', first = null;
    for await (const c of stream) {
      if (first === null && c.choices.length) first = c.choices[0].text;
      text += c.choices[0]?.text ?? '';
    }
    assert.ok(first.startsWith(gold.prompt), first);
    assert.equal(text, echoed.choices[0].text);
    // max_tokens 0: the prompt alone, scored (what evaluation harnesses ask for).
    const scored = await client.completions.create({ ...req, echo: true, logprobs: 2, max_tokens: 0 });
    assert.equal(scored.choices[0].text, gold.prompt);
    assert.equal(scored.choices[0].finish_reason, 'length');
    assert.deepEqual(usageCounts(scored.usage), { prompt_tokens: P, completion_tokens: 0, total_tokens: P });
    for (const k of ['tokens', 'token_logprobs', 'top_logprobs', 'text_offset'])
      assert.deepEqual(scored.choices[0].logprobs[k], lp[k].slice(0, P), k);
    // Every choice echoes it.
    const two = await client.completions.create({ ...req, echo: true, n: 2 });
    for (const c of two.choices) assert.equal(c.text, echoed.choices[0].text);
  });

  test("vLLM's prompt_logprobs (ranks, alternatives, echo's numbers), return_tokens_as_token_ids, skip_special_tokens", async () => {
    const ids = await tokenize(`${gold.prompt} there was a big red ball`);
    const P = ids.length;
    const req = { model: MODEL_ID, prompt: ids, max_tokens: 2, temperature: 0 };
    const echoed = await client.completions.create({ ...req, echo: true, logprobs: 5, max_tokens: 0 });
    const elp = echoed.choices[0].logprobs;
    const r = await client.completions.create({ ...req, prompt_logprobs: 3, n: 2 });
    const plp = r.choices[0].prompt_logprobs;
    assert.equal(plp.length, P);
    assert.equal(plp[0], null);
    let ranked_out = 0;
    for (let i = 1; i < P; ++i) {
      const pos = plp[i], own = pos[String(ids[i])];
      assert.ok(own, `position ${i}: the prompt token itself`);
      assert.ok(Math.abs(own.logprob - elp.token_logprobs[i]) < 1e-5, `position ${i}: ${own.logprob} vs echo's ${elp.token_logprobs[i]}`);
      if (i >= 2) assert.equal(own.decoded_token, elp.tokens[i]);  // (echo trims the first piece's space)
      // The alternatives are echo's best 3, ranks 1..3 in order; the token's own rank is its place.
      const echo_best = Object.values(elp.top_logprobs[i]).sort((a, b) => b - a);
      const alts = Object.entries(pos).filter(([id]) => id !== String(ids[i]) || own.rank <= 3).map(([, v]) => v);
      alts.sort((a, b) => a.rank - b.rank);
      assert.deepEqual(alts.map((v) => v.rank), [1, 2, 3], `position ${i}`);
      for (let k = 0; k < 3; ++k) assert.ok(Math.abs(alts[k].logprob - echo_best[k]) < 1e-5, `position ${i} rank ${k + 1}`);
      if (own.rank > 3) {
        ++ranked_out;
        assert.ok(own.logprob < alts[2].logprob, `position ${i}: rank ${own.rank} above the third best`);
      }
      assert.equal(own.rank === 1, own.logprob >= echo_best[0] - 1e-6, `position ${i}: rank 1 iff the best`);
    }
    assert.ok(ranked_out >= 1, 'some prompt token outside the best 3 (its rank > 3)');
    assert.deepEqual(r.choices[1].prompt_logprobs, plp);  // every choice of the prompt carries them
    const plain = await client.completions.create(req);
    assert.equal(r.choices[0].text, plain.choices[0].text);
    assert.equal(plain.choices[0].prompt_logprobs, undefined);
    // Chat: once, for the response.
    const chat = await client.chat.completions.create({ model: MODEL_ID, messages: [{ role: 'user', content: 'Hi' }],
      max_tokens: 2, temperature: 0, prompt_logprobs: 0 });
    assert.equal(chat.prompt_logprobs.length, chat.usage.prompt_tokens);
    assert.ok(chat.prompt_logprobs.slice(1).every((pos) => Object.keys(pos).length === 1));
    // Streamed: more than 0 is refused (vLLM's rule).
    await assert.rejects(client.completions.create({ ...req, stream: true, prompt_logprobs: 1 }), (e) => e.status === 400);
    // Every choice carries them: a response past 2^20 entries is refused before any work.
    const long = (await tokenize(`${gold.prompt} there was a dog`.repeat(60))).slice(0, 400);
    assert.equal(long.length, 400);
    await assert.rejects(client.completions.create({ ...req, prompt: long, n: 128, prompt_logprobs: 20 }),
      (e) => e.status === 400 && e.param === 'prompt_logprobs' && /entries/.test(e.message));
    await assert.rejects(client.completions.create({ ...req, prompt: long, n: 128, echo: true, logprobs: 20 }),
      (e) => e.status === 400 && /entries/.test(e.message));
    assert.equal((await client.completions.create({ ...req, prompt: long, n: 2, prompt_logprobs: 20 })).choices.length, 2);
    // A held response's output logprobs count too (choices x max_tokens x (alternatives + 1):
    // 128 x 400 x 21 here); a stream's go out as they are made.
    const many = { ...req, n: 128, max_tokens: 400, logprobs: 20, ignore_eos: true };
    await assert.rejects(client.completions.create(many),
      (e) => e.status === 400 && e.param === 'logprobs' && /entries/.test(e.message));
    const streamed = await client.completions.create({ ...many, stream: true });
    for await (const chunk of streamed) {
      assert.ok(chunk.choices.length > 0);
      break;  // (leaving the loop aborts the request)
    }

    // return_tokens_as_token_ids: echo's tokens are the prompt's ids.
    const as_ids = await client.completions.create({ ...req, echo: true, logprobs: 1, return_tokens_as_token_ids: true });
    assert.deepEqual(as_ids.choices[0].logprobs.tokens.slice(0, P), ids.map((t) => `token_id:${t}`));
    for (const top of as_ids.choices[0].logprobs.top_logprobs.slice(1))
      for (const k of Object.keys(top)) assert.match(k, /^token_id:\d+$/);

    // skip_special_tokens: false outputs a control token's text (BOS forced by logit_bias).
    const bos = { ...req, max_tokens: 3, logit_bias: { [ids[0]]: 100 } };
    assert.equal((await client.completions.create(bos)).choices[0].text, '');
    assert.equal((await client.completions.create({ ...bos, skip_special_tokens: false })).choices[0].text, '<s><s><s>');
  });

  test("vLLM's return_token_ids: the prompt's ids and each choice's, streamed as deltas; the ending token kept", async () => {
    const ids = await tokenize(gold.prompt);
    const req = { model: MODEL_ID, prompt: gold.prompt, max_tokens: 12, temperature: 0, return_token_ids: true };
    const r = await client.completions.create({ ...req, n: 2 });
    for (const c of r.choices) {
      assert.deepEqual(c.prompt_token_ids, ids);
      assert.equal(c.token_ids.length, 12);
      const text = (await postJson(server.url, '/detokenize', { tokens: c.token_ids })).json.prompt;
      assert.equal(text.trim(), c.text.trim());
    }
    // Streamed: the deltas add up, the prompt's ids come once.
    let streamed = [], prompts = 0;
    for await (const c of await client.completions.create({ ...req, stream: true })) {
      for (const ch of c.choices) {
        streamed.push(...(ch.token_ids ?? []));
        if (ch.prompt_token_ids) ++prompts, assert.deepEqual(ch.prompt_token_ids, ids);
      }
    }
    assert.deepEqual(streamed, r.choices[0].token_ids);
    assert.equal(prompts, 1);
    // The token that ends a choice is an id too (not text): end-of-generation, a stop token.
    const eos = await client.completions.create({ ...req, logit_bias: { 2: 100 } });
    assert.deepEqual(eos.choices[0].token_ids, [2]);
    assert.equal(eos.choices[0].text, '');
    const stop = await client.completions.create({ ...req, stop_token_ids: [r.choices[0].token_ids[3]] });
    assert.deepEqual(stop.choices[0].token_ids, r.choices[0].token_ids.slice(0, 4));
    // Chat: the prompt's ids once for the response (streamed: in a chunk's top level).
    const messages = [{ role: 'user', content: 'Tell me a story.' }];
    const chat = await client.chat.completions.create({ model: MODEL_ID, messages, max_tokens: 6, temperature: 0, return_token_ids: true });
    assert.equal(chat.prompt_token_ids.length, chat.usage.prompt_tokens);
    assert.equal(chat.choices[0].token_ids.length, chat.usage.completion_tokens);
    let chat_ids = [], chat_prompt = null;
    for await (const c of await client.chat.completions.create({ model: MODEL_ID, messages, max_tokens: 6, temperature: 0,
      return_token_ids: true, stream: true })) {
      if (c.prompt_token_ids) chat_prompt = c.prompt_token_ids;
      for (const ch of c.choices) chat_ids.push(...(ch.token_ids ?? []));
    }
    assert.deepEqual(chat_prompt, chat.prompt_token_ids);
    assert.deepEqual(chat_ids, chat.choices[0].token_ids);
    const plain = await client.completions.create({ ...req, return_token_ids: undefined });
    assert.equal(plain.choices[0].token_ids, undefined);
  });

  test("echo's prompt logprobs are the model's own predictions: each equals a generation from the prompt's prefix", async () => {
    const ids = await tokenize(`${gold.prompt} there was a big red ball in the garden`);
    const r = await client.completions.create({ model: MODEL_ID, prompt: ids, max_tokens: 1, temperature: 0, echo: true, logprobs: 5 });
    const lp = r.choices[0].logprobs;
    let compared = 0;
    for (const k of [2, Math.floor(ids.length / 2), ids.length - 1]) {
      // Generating from ids[0, k): the distribution of the token at position k.
      const g = await client.completions.create({ model: MODEL_ID, prompt: ids.slice(0, k), max_tokens: 1, temperature: 0, logprobs: 5 });
      const gl = g.choices[0].logprobs;
      if (gl.tokens.length === 0) continue;  // an end-of-generation token has no logprob
      const want = gl.top_logprobs[0], got = lp.top_logprobs[k];
      assert.deepEqual(Object.keys(got).sort(), Object.keys(want).sort(), `position ${k}`);
      for (const [t, v] of Object.entries(want)) assert.ok(Math.abs(got[t] - v) < 1e-4, `position ${k} ${t}: ${got[t]} vs ${v}`);
      if (lp.tokens[k] in want) assert.ok(Math.abs(lp.token_logprobs[k] - want[lp.tokens[k]]) < 1e-4, `position ${k}`);
      ++compared;
    }
    assert.ok(compared >= 2, `${compared} positions compared`);
  });
});


// Completions' suffix (fill in the middle) on a model with StarCoder's vocabulary: the prompt is
// <fim_prefix> prompt <fim_suffix> suffix <fim_middle> (the PSM order), so the completion equals
// the one of that token sequence given as ids; a model without FIM tokens refuses it (400).
const STARCODER = join(SHARED, 'tokenizer/ggml-vocab-starcoder.gguf');
describe('fill in the middle (suffix)', { skip: skip || (!existsSync(STARCODER) && `${STARCODER} absent`) }, () => {
  let dir, server, plain;
  before(async () => {
    dir = mkdtempSync(join(tmpdir(), `ft-fim-${process.pid}-`));
    const r = spawnSync(BINARY, ['make-model', '--shape', 'tiny', '--type', 'q8_0', '--vocab', STARCODER, '-o', join(dir, 'coder.gguf')],
      { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    // (-c 4096: /infill gives other files what the context holds past llama.cpp's 2048-token batch)
    server = await startServer(['-m', join(dir, 'coder.gguf'), '--served-model-name', 'coder', '-t', '1', '-c', '4096']);
    plain = await startServer(['-m', MODEL, '-t', '1']);
  });
  after(async () => {
    for (const s of [server, plain]) if (s) assert.equal((await s.stop()).code, 0, s.log());
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  test('the prompt is <fim_prefix> prompt <fim_suffix> suffix <fim_middle>; without FIM tokens a 400', async () => {
    const ids = async (content, add_special = false) =>
      (await postJson(server.url, '/tokenize', { content, add_special })).json.tokens;
    const [pre] = await ids('<fim_prefix>'), [suf] = await ids('<fim_suffix>'), [mid] = await ids('<fim_middle>');
    assert.ok(pre !== suf && suf !== mid && mid !== pre, `${pre} ${suf} ${mid}`);
    const prefix = 'def add(a, b):\n    ', suffix = '\n    return c\n';
    const want = [pre, ...(await ids(prefix)), suf, ...(await ids(suffix)), mid];
    const req = { model: 'coder', max_tokens: 8, temperature: 0, ignore_eos: true };
    const fim = await postJson(server.url, '/v1/completions', { ...req, prompt: prefix, suffix });
    assert.equal(fim.status, 200, fim.text);
    assert.equal(fim.json.usage.prompt_tokens, want.length);
    const explicit = await postJson(server.url, '/v1/completions', { ...req, prompt: want });
    assert.equal(fim.json.choices[0].text, explicit.json.choices[0].text);
    // Token ids as the prefix, and an empty suffix is no insertion at all.
    const fromIds = await postJson(server.url, '/v1/completions', { ...req, prompt: await ids(prefix), suffix });
    assert.equal(fromIds.json.choices[0].text, fim.json.choices[0].text);
    const none = await postJson(server.url, '/v1/completions', { ...req, prompt: prefix, suffix: '' });
    assert.equal(none.json.usage.prompt_tokens, (await ids(prefix, true)).length);
    // Refusals: echo with a suffix; a model without FIM tokens.
    const echo = await postJson(server.url, '/v1/completions', { ...req, prompt: prefix, suffix, echo: true });
    assert.equal(echo.status, 400);
    const r = await postJson(plain.url, '/v1/completions', { model: MODEL_ID, prompt: 'Once', suffix: ' the end.', max_tokens: 4 });
    assert.equal(r.status, 400);
    assert.equal(r.json.error.param, 'suffix');
    assert.match(r.json.error.message, /fill-in-the-middle/);
  });

  test("llama.cpp's /infill: input_extra as snippets, then <fim_prefix> prefix prompt <fim_suffix> suffix <fim_middle>", async () => {
    // (This vocabulary has no repository tokens llama.cpp knows: other files go in as snippets.)
    const ids = async (content) => (await postJson(server.url, '/tokenize', { content, add_special: false })).json.tokens;
    const [pre] = await ids('<fim_prefix>'), [suf] = await ids('<fim_suffix>'), [mid] = await ids('<fim_middle>');
    const snippet = await ids('\n\n--- snippet ---\n\n');
    const body = { input_prefix: 'def add(a, b):\n    ', input_suffix: '\n    return c\n', prompt: 'c =',
                   input_extra: [{ filename: 'util.py', text: 'def sub(a, b):\n    return a - b\n' }],
                   n_predict: 8, temperature: 0, ignore_eos: true };
    const want = [...snippet, ...(await ids(body.input_extra[0].text)), pre, ...(await ids(body.input_prefix)), ...(await ids(body.prompt)),
                  suf, ...(await ids(body.input_suffix)), mid];
    const r = await postJson(server.url, '/infill', body);
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.tokens_evaluated, want.length);
    assert.equal(r.json.tokens_predicted, 8);
    const explicit = await postJson(server.url, '/completion', { prompt: want, n_predict: 8, temperature: 0, ignore_eos: true });
    assert.equal(r.json.content, explicit.json.content);
    // llama.vim's cache warm-up: n_predict 0, the prompt evaluated and nothing generated.
    const warm = await postJson(server.url, '/infill', { ...body, n_predict: 0 });
    assert.equal(warm.status, 200, warm.text);
    assert.equal(warm.json.content, '');
    assert.equal(warm.json.tokens_predicted, 0);
    assert.equal(warm.json.stop_type, 'limit');
    const bad = await postJson(server.url, '/infill', { ...body, input_extra: [{ filename: 'x' }] });
    assert.equal(bad.status, 400);
    assert.equal(bad.json.error.param, 'input_extra');
    const none = await postJson(plain.url, '/infill', { input_prefix: 'Once', input_suffix: ' end.', n_predict: 4 });
    assert.equal(none.status, 400);
    assert.match(none.json.error.message, /fill-in-the-middle/);
  });
});

// A reasoning model's chat (R1's template, which opens <think> for the model): the text before
// </think> comes as message.reasoning_content / delta.reasoning_content, the rest as content;
// --reasoning-format none leaves it all content. (The output is forced by guided_choice.)
const R1 = join(SHARED, 'templates/deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja');
describe('reasoning_content (R1 template)', { skip: skip || (!existsSync(R1) && `${R1} absent`) }, () => {
  let r1, none, client;
  before(async () => {
    const OpenAI = (await import('openai')).default;
    r1 = await startServer(['-m', MODEL, '-t', '1', '--chat-template-file', R1]);
    none = await startServer(['-m', MODEL, '-t', '1', '--chat-template-file', R1, '--reasoning-format', 'none']);
    client = (s) => new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'x', maxRetries: 0, timeout: 120_000 });
  });
  after(async () => {
    for (const s of [r1, none]) if (s) assert.equal((await s.stop()).code, 0, s.log());
  });

  test('reasoning before </think>, content after it; streamed as deltas of each; off with none', async () => {
    // (Under a grammar the reasoning is not open from the start: the output opens it itself.)
    const output = '<think>Let me see.\n</think>\n\nThe answer.';
    const req = { model: MODEL_ID, messages: [{ role: 'user', content: 'Hi' }], guided_choice: [output], max_tokens: 80 };
    const r = await client(r1).chat.completions.create(req);
    assert.equal(r.choices[0].message.reasoning_content, 'Let me see.\n');
    assert.equal(r.choices[0].message.content, '\n\nThe answer.');
    let reasoning = '', content = '', order = [];
    for await (const c of await client(r1).chat.completions.create({ ...req, stream: true })) {
      const d = c.choices[0]?.delta ?? {};
      if (d.reasoning_content) reasoning += d.reasoning_content, order.push('r');
      if (d.content) content += d.content, order.push('c');
    }
    assert.equal(reasoning, 'Let me see.\n');
    assert.equal(content, '\n\nThe answer.');
    assert.ok(order.lastIndexOf('r') < order.indexOf('c'), order.join(''));
    const plain = await client(none).chat.completions.create(req);
    assert.equal(plain.choices[0].message.content, output);
    assert.equal(plain.choices[0].message.reasoning_content, undefined);
    // A grammar's JSON (here a forced tool call's) is content, though the template opens <think>.
    const tools = [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { x: { type: 'integer' } }, required: ['x'] } } }];
    const call = await client(r1).chat.completions.create({ model: MODEL_ID, messages: req.messages, tools, tool_choice: 'required',
      parallel_tool_calls: false, max_tokens: 100, temperature: 0 });
    assert.equal(call.choices[0].message.reasoning_content, undefined);
    assert.equal(call.choices[0].message.tool_calls[0].function.name, 'f');
  });
});

// A template that opens the reasoning on request (DeepSeek V3.1's way: chat_template_kwargs
// thinking): each request's own rendered prompt decides whether the output starts as reasoning.
// (No grammar here, which would keep it closed: stories260K's greedy text, with no </think>, is
// all reasoning when the prompt opens it, all content otherwise.)
describe('reasoning opened per request (chat_template_kwargs)', { skip }, () => {
  let server, dir, client;
  before(async () => {
    const OpenAI = (await import('openai')).default;
    dir = mkdtempSync(join(tmpdir(), 'ft-think-'));
    const template = join(dir, 'thinking.jinja');
    writeFileSync(template, "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}" +
      "{% if add_generation_prompt %}<|assistant|>{% if thinking %}<think>\n{% else %}</think>{% endif %}{% endif %}");
    server = await startServer(['-m', MODEL, '-t', '1', '--chat-template-file', template]);
    client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'x', maxRetries: 0, timeout: 120_000 });
  });
  after(async () => {
    if (server) assert.equal((await server.stop()).code, 0, server.log());
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  test('thinking on: the output is reasoning_content; off: content', async () => {
    const req = { model: MODEL_ID, messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 12, temperature: 0 };
    const on = await client.chat.completions.create({ ...req, chat_template_kwargs: { thinking: true } });
    assert.ok(on.choices[0].message.reasoning_content.length > 0, JSON.stringify(on.choices[0].message));
    assert.equal(on.choices[0].message.content, '');
    let streamed = '', content = '';
    for await (const c of await client.chat.completions.create({ ...req, chat_template_kwargs: { thinking: true }, stream: true })) {
      streamed += c.choices[0]?.delta?.reasoning_content ?? '';
      content += c.choices[0]?.delta?.content ?? '';
    }
    assert.equal(streamed, on.choices[0].message.reasoning_content);
    assert.equal(content, '');
    for (const kwargs of [{ thinking: false }, undefined]) {
      const off = await client.chat.completions.create({ ...req, chat_template_kwargs: kwargs });
      assert.ok(off.choices[0].message.content.length > 0);
      assert.equal(off.choices[0].message.reasoning_content, undefined);
    }
  });

  test('the Responses API: a reasoning item (reasoning_text) before the message; streamed as reasoning_text deltas', async () => {
    const req = { model: MODEL_ID, input: 'Once upon a time', max_output_tokens: 12, temperature: 0 };
    const chat = await client.chat.completions.create({ model: MODEL_ID, messages: [{ role: 'user', content: 'Once upon a time' }],
      max_tokens: 12, temperature: 0, chat_template_kwargs: { thinking: true } });
    const r = await client.responses.create({ ...req, chat_template_kwargs: { thinking: true } });
    assert.deepEqual(r.output.map((o) => o.type), ['reasoning', 'message']);
    assert.equal(r.output[0].content[0].type, 'reasoning_text');
    assert.equal(r.output[0].content[0].text, chat.choices[0].message.reasoning_content);
    assert.equal(r.output[1].content[0].text, '');
    const events = [];
    for await (const e of await client.responses.create({ ...req, chat_template_kwargs: { thinking: true }, stream: true })) events.push(e);
    const deltas = events.filter((e) => e.type === 'response.reasoning_text.delta').map((e) => e.delta).join('');
    assert.equal(deltas, r.output[0].content[0].text);
    const added = events.filter((e) => e.type === 'response.output_item.added').map((e) => [e.output_index, e.item.type]);
    assert.deepEqual(added, [[0, 'reasoning'], [1, 'message']]);
    const done = events.find((e) => e.type === 'response.incomplete').response;  // (max_output_tokens)
    const strip = (output) => output.map(({ id, ...rest }) => rest);  // (ids are per response)
    assert.deepEqual(strip(done.output), strip(r.output));
    const itemDone = events.filter((e) => e.type === 'response.output_item.done').map((e) => e.item);
    assert.deepEqual(strip(itemDone), strip(r.output));
    assert.ok(r.usage.output_tokens_details.reasoning_tokens > 0 && r.usage.output_tokens_details.reasoning_tokens <= r.usage.output_tokens,
              JSON.stringify(r.usage));
    const parts = events.filter((e) => e.type.startsWith('response.content_part.')).map((e) => [e.type, e.output_index, e.part.type]);
    assert.deepEqual(parts, [['response.content_part.added', 0, 'reasoning_text'], ['response.content_part.done', 0, 'reasoning_text'],
                             ['response.content_part.added', 1, 'output_text'], ['response.content_part.done', 1, 'output_text']]);
    const plain = await client.responses.create(req);  // not opened: the message alone
    assert.deepEqual(plain.output.map((o) => o.type), ['message']);
    assert.ok(plain.output[0].content[0].text.length > 0);
  });
});

// Several choices (`n`) and completions' `echo` (with the prompt's logprobs), through the official
// openai client on stories260K: the n choices share one prefill of the prompt (every other choice
// attaches its full KV blocks from the prefix cache), are independent samples under sampling
// (choice i is seed + i) and all equal the n = 1 answer under greedy; an echoed prompt's logprobs
// are what the model predicts for each prompt token at generation time.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { MODEL, MODEL_ID, golden, metrics, postJson, skipReason, startServer, waitLog, waitMetrics } from './helpers.mjs';

const skip = skipReason();
const BLOCK = 16;  // the server's default KV block size (kv_cache.block_size)
const HITS = 'firsttoken:prefix_cache_hits_total';

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
    const full = BLOCK * Math.floor((P - 1) / BLOCK);  // the prompt's full blocks (its last token is always computed)
    assert.ok(full >= 2 * BLOCK, `prompt of ${P} tokens`);
    const h0 = (await metrics(server.url))[HITS];
    const r = await client.completions.create({ model: MODEL_ID, prompt, n: 3, max_tokens: 12, temperature: 0 });
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
    // Choice 0 computed the prompt; choices 1 and 2 attached all its full blocks.
    const m = await waitMetrics(server.url, (x) => x[HITS] - h0 >= 2 * full);
    assert.equal(m[HITS] - h0, 2 * full);
    const log = await waitLog(server, new RegExp(`${r.id} completion choice=2 finish=\\w+ prompt=${P} cached=${full} `));
    assert.match(log, new RegExp(`${r.id} completion choice=0 finish=\\w+ prompt=${P} cached=0 `));
    assert.match(log, new RegExp(`${r.id} completion choice=1 finish=\\w+ prompt=${P} cached=${full} `));

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
    const stream = await client.completions.create({ model: MODEL_ID, prompt, n: 2, max_tokens: 10, temperature: 0, stream: true, stream_options: { include_usage: true } });
    const text = ['', ''], finish = [[], []];
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
    assert.deepEqual(usage, want.usage);
    assert.equal(after_usage, 0);

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
      assert.equal(lp.text_offset[i], lp.text_offset[i - 1] + Buffer.byteLength(lp.tokens[i - 1]));
    assert.equal(lp.text_offset[P], Buffer.byteLength(gold.prompt));  // the completion's first token

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
    assert.deepEqual(scored.usage, { prompt_tokens: P, completion_tokens: 0, total_tokens: P });
    for (const k of ['tokens', 'token_logprobs', 'top_logprobs', 'text_offset'])
      assert.deepEqual(scored.choices[0].logprobs[k], lp[k].slice(0, P), k);
    // Every choice echoes it.
    const two = await client.completions.create({ ...req, echo: true, n: 2 });
    for (const c of two.choices) assert.equal(c.text, echoed.choices[0].text);
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


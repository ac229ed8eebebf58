// What ordinary client requests need beyond plain chat, through the official openai client on
// stories260K: every OpenAI field accepted, structured output (json_schema) and tool calls by
// constrained decoding (plain and streamed, with the tool result sent back), the Responses API
// (plain and streamed) and its Conversations API (the v6 client, `openai-next`), embeddings,
// GET /v1/models/{id}, --api-key, CORS and X-Request-Id.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { MODEL, MODEL_ID, postJson, skipReason, startServer, waitLog } from './helpers.mjs';

const skip = skipReason();
const KEY = 'sk-test-key';
const ORIGIN = 'https://app.example';

describe('OpenAI compatibility (stories260K)', { skip }, () => {
  let server, client;

  before(async () => {
    const OpenAI = (await import('openai')).default;
    server = await startServer(['-m', MODEL, '--threads', '1', '--api-key', KEY, '--allowed-origins', ORIGIN]);
    client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: KEY, maxRetries: 0, timeout: 120_000 });
  });
  after(async () => {
    if (!server) return;
    const r = await server.stop();
    assert.equal(r.code, 0, server.log());
  });

  const user = (content) => [{ role: 'user', content }];

  test('every Chat Completions field a client may send is accepted; foreign ones are a warning', async () => {
    const r = await client.chat.completions.create({
      model: MODEL_ID,
      messages: [{ role: 'developer', content: 'Be brief' }, { role: 'user', content: [{ type: 'text', text: 'Once upon a time' }] }],
      max_completion_tokens: 5, temperature: 0, store: false, metadata: { a: 'b' }, service_tier: 'auto',
      parallel_tool_calls: true, prompt_cache_key: 'k', reasoning_effort: 'low', verbosity: 'low', safety_identifier: 's',
      modalities: ['text'], prediction: { type: 'content', content: 'x' }, web_search_options: {}, audio: null,
      response_format: { type: 'text' }, tools: null, tool_choice: null, user: 'u', seed: null, logit_bias: { 5: 1 },
      stream_options: null, top_k: 4, min_tokens: 2, stop_token_ids: [], frobnicate: true,
    });
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.equal(r.usage.completion_tokens, 5);
    await waitLog(server, /ignoring the unknown field 'frobnicate'/);
  });

  test('response_format json_schema: the content parses and follows the schema', async () => {
    const schema = {
      type: 'object',
      properties: { name: { type: 'string', maxLength: 12 }, age: { type: 'integer' }, kind: { enum: ['cat', 'dog'] } },
      required: ['name', 'age', 'kind'], additionalProperties: false,
    };
    const r = await client.chat.completions.create({
      model: MODEL_ID, messages: user('Describe a pet as JSON'), temperature: 0, max_tokens: 200,
      response_format: { type: 'json_schema', json_schema: { name: 'pet', schema, strict: true } },
    });
    assert.equal(r.choices[0].finish_reason, 'stop', r.choices[0].message.content);
    const pet = JSON.parse(r.choices[0].message.content);
    assert.deepEqual(Object.keys(pet).sort(), ['age', 'kind', 'name']);
    assert.equal(typeof pet.name, 'string');
    assert.ok(Number.isInteger(pet.age));
    assert.ok(['cat', 'dog'].includes(pet.kind));
  });

  test('structured outputs follow the schema\'s property order (zeta, alpha, mid), wherever the schema enters', async () => {
    const schema = {
      type: 'object', additionalProperties: false, required: ['zeta', 'alpha', 'mid'],
      properties: { zeta: { type: 'integer' }, alpha: { type: 'boolean' }, mid: { type: 'string', maxLength: 8 } },
    };
    const inOrder = (text, what) => {
      const at = ['"zeta"', '"alpha"', '"mid"'].map((k) => text.indexOf(k));
      assert.ok(at[0] >= 0 && at[0] < at[1] && at[1] < at[2], `${what}: ${text}`);
      assert.deepEqual(Object.keys(JSON.parse(text)), ['zeta', 'alpha', 'mid'], what);
    };
    const common = { model: MODEL_ID, temperature: 0, max_tokens: 200 };
    const rf = { type: 'json_schema', json_schema: { name: 'o', schema, strict: true } };
    const chat = await client.chat.completions.create({ ...common, messages: user('JSON please'), response_format: rf });
    inOrder(chat.choices[0].message.content, 'chat response_format');
    const cmpl = await client.completions.create({ ...common, prompt: 'JSON:', response_format: rf });
    inOrder(cmpl.choices[0].text, 'completions response_format');
    const guided = await client.completions.create({ ...common, prompt: 'JSON:', guided_json: schema });
    inOrder(guided.choices[0].text, 'guided_json');
    const resp = await client.responses.create({
      model: MODEL_ID, input: 'JSON please', temperature: 0, max_output_tokens: 200,
      text: { format: { type: 'json_schema', name: 'o', schema, strict: true } },
    });
    inOrder(resp.output_text, 'Responses text.format');
    const call = await client.chat.completions.create({
      ...common, messages: user('Call f'), tools: [{ type: 'function', function: { name: 'f', parameters: schema } }],
      tool_choice: { type: 'function', function: { name: 'f' } },
    });
    inOrder(call.choices[0].message.tool_calls[0].function.arguments, 'tool parameters');
    const msgs = await postJson(server.url, '/v1/messages', {
      model: MODEL_ID, max_tokens: 200, temperature: 0, messages: user('JSON please'), output_format: { type: 'json_schema', schema },
    }, { authorization: `Bearer ${KEY}` });
    assert.equal(msgs.status, 200, msgs.text);
    inOrder(msgs.json.content[0].text, 'Messages output_format');
  });

  test('pattern, format and integer/number bounds hold in the output (what a strict client parse checks)', async () => {
    const schema = {
      type: 'object', additionalProperties: false, required: ['code', 'n', 'x', 'day', 'id'],
      properties: {
        code: { type: 'string', pattern: '^[A-Z]{3}-\\d{2}$' },
        n: { type: 'integer', minimum: 10, maximum: 20 },
        x: { type: 'number', exclusiveMinimum: 0, maximum: 1 },
        day: { type: 'string', format: 'date' },
        id: { type: 'string', format: 'uuid' },
      },
    };
    const rf = (s) => ({ type: 'json_schema', json_schema: { name: 'o', schema: s, strict: true } });
    const r = await client.chat.completions.create({
      model: MODEL_ID, messages: user('JSON please'), temperature: 0, max_tokens: 400, response_format: rf(schema),
    });
    assert.equal(r.choices[0].finish_reason, 'stop', r.choices[0].message.content);
    const o = JSON.parse(r.choices[0].message.content);
    assert.match(o.code, /^[A-Z]{3}-\d{2}$/);
    assert.ok(Number.isInteger(o.n) && o.n >= 10 && o.n <= 20, String(o.n));
    assert.ok(o.x > 0 && o.x <= 1, String(o.x));
    assert.match(o.day, /^\d{4}-\d{2}-\d{2}$/);
    assert.equal(new Date(`${o.day}T00:00:00Z`).toISOString().slice(0, 10), o.day);  // a real date
    assert.match(o.id, /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i);
    // A construct outside the subset: a 400 saying which and where.
    await assert.rejects(
      client.chat.completions.create({ model: MODEL_ID, messages: user('x'), max_tokens: 5,
                                       response_format: rf({ type: 'string', pattern: '(?=a)b' }) }),
      (e) => e.status === 400 && /lookaround is not supported/.test(e.message));
  });

  test('formats as Zod reads them back: zodResponseFormat and parse() on sampled outputs', async () => {
    const { z } = await import('zod');
    const { zodResponseFormat } = await import('openai/helpers/zod');
    const Event = z.object({ day: z.string().date(), at: z.string().time(), when: z.string().datetime(), id: z.string().uuid() });
    for (const seed of [1, 2, 3, 4, 5, 6]) {
      const r = await client.beta.chat.completions.parse({
        model: MODEL_ID, messages: user('An event'), temperature: 1.5, seed, max_tokens: 400,
        response_format: zodResponseFormat(Event, 'event'),
      });
      assert.equal(r.choices[0].finish_reason, 'stop', r.choices[0].message.content);
      assert.ok(r.choices[0].message.parsed, r.choices[0].message.content);  // (parse() threw on a value Zod refuses)
    }
  });

  const tools = [{
    type: 'function',
    function: { name: 'get_weather', description: 'Weather in a city',
                parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 16 } }, required: ['city'] } },
  }];

  test('a tool call round trip: forced call, tool result, answer', async () => {
    const r = await client.chat.completions.create({
      model: MODEL_ID, messages: user('Weather in Paris?'), temperature: 0, max_tokens: 100, tools,
      tool_choice: { type: 'function', function: { name: 'get_weather' } },
    });
    const msg = r.choices[0].message;
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
    assert.equal(msg.tool_calls.length, 1);
    assert.equal(msg.tool_calls[0].type, 'function');
    assert.equal(msg.tool_calls[0].function.name, 'get_weather');
    assert.equal(typeof JSON.parse(msg.tool_calls[0].function.arguments).city, 'string');
    const answer = await client.chat.completions.create({
      model: MODEL_ID, temperature: 0, max_tokens: 8, tools,
      messages: [...user('Weather in Paris?'), msg, { role: 'tool', tool_call_id: msg.tool_calls[0].id, content: '{"temp": 21}' }],
    });
    assert.equal(typeof answer.choices[0].message.content, 'string');
    assert.equal(answer.usage.completion_tokens, 8);
  });

  test('tool calls streamed as deltas (tool_choice required)', async () => {
    const stream = await client.chat.completions.create({
      model: MODEL_ID, messages: user('Weather?'), temperature: 0, max_tokens: 150, tools, tool_choice: 'required', stream: true,
      parallel_tool_calls: false,  // one call: the grammar ends after it
    });
    const calls = [];
    let finish = null;
    for await (const chunk of stream) {
      const c = chunk.choices[0];
      if (!c) continue;
      for (const d of c.delta.tool_calls ?? []) {
        calls[d.index] ??= { id: '', name: '', arguments: '' };
        if (d.id) calls[d.index].id = d.id;
        if (d.function?.name) calls[d.index].name += d.function.name;
        if (d.function?.arguments) calls[d.index].arguments += d.function.arguments;
      }
      if (c.finish_reason) finish = c.finish_reason;
    }
    assert.equal(finish, 'tool_calls');
    assert.equal(calls.length, 1);
    assert.equal(calls[0].name, 'get_weather');
    assert.match(calls[0].id, /^call_/);
    assert.equal(typeof JSON.parse(calls[0].arguments).city, 'string');
  });

  // A model that writes text, then a call (Qwen's and Hermes' habit): the text streams as content as
  // it comes, the call is held back and sent as a call, on chat and the Responses API alike.
  // (The output is forced by guided_choice; the tool choice is auto.)
  test('text before a tool call streams as content, the call comes as a call (auto; chat and Responses)', async () => {
    const preamble = 'Let me check the weather.';
    const output = `${preamble}\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>`;
    const req = { model: MODEL_ID, messages: user('Weather?'), tools, max_tokens: 300, guided_choice: [output] };
    const whole = await client.chat.completions.create(req);
    assert.equal(whole.choices[0].message.content, preamble);
    assert.equal(whole.choices[0].finish_reason, 'tool_calls');
    assert.deepEqual(JSON.parse(whole.choices[0].message.tool_calls[0].function.arguments), { city: 'Paris' });
    const pieces = [];
    let calls = null, finish = null;
    for await (const chunk of await client.chat.completions.create({ ...req, stream: true })) {
      const c = chunk.choices[0];
      if (!c) continue;
      if (c.delta.content) {
        assert.equal(calls, null, 'content after the call');
        pieces.push(c.delta.content);
      }
      if (c.delta.tool_calls) calls = c.delta.tool_calls;
      if (c.finish_reason) finish = c.finish_reason;
    }
    assert.equal(pieces.join(''), preamble);
    assert.ok(pieces.length > 1, `the text came in ${pieces.length} piece(s)`);
    assert.equal(finish, 'tool_calls');
    assert.equal(calls[0].function.name, 'get_weather');
    assert.deepEqual(JSON.parse(calls[0].function.arguments), { city: 'Paris' });

    const rtools = [{ type: 'function', name: 'get_weather', parameters: tools[0].function.parameters }];
    const rreq = { model: MODEL_ID, input: 'Weather?', tools: rtools, max_output_tokens: 300, guided_choice: [output] };
    const r = await client.responses.create(rreq);
    assert.deepEqual(r.output.map((o) => o.type), ['message', 'function_call']);
    assert.equal(r.output_text, preamble);
    const deltas = [];
    let done = null;
    for await (const ev of await client.responses.create({ ...rreq, stream: true })) {
      if (ev.type === 'response.output_text.delta') deltas.push(ev.delta);
      if (ev.type === 'response.output_item.added' && ev.item.type === 'function_call') assert.equal(deltas.join(''), preamble);
      if (ev.type === 'response.completed') done = ev.response;
    }
    assert.ok(deltas.length > 1, `the text came in ${deltas.length} delta(s)`);
    assert.deepEqual(done.output.map((o) => o.type), ['message', 'function_call']);
    assert.equal(done.output[0].content[0].text, preamble);
    assert.deepEqual(JSON.parse(done.output[1].arguments), { city: 'Paris' });
  });

  test('tools offered (auto) with logprobs: every token\'s logprobs reach the stream, held text or not', async () => {
    const base = { model: MODEL_ID, messages: user('Once upon a time'), tools, max_tokens: 16, temperature: 0, logprobs: true };
    const text = (await client.chat.completions.create(base)).choices[0].message.content;
    const word = text.trim().split(/\s+/)[2];
    for (const extra of [{}, { stop: [` ${word}`] }]) {  // (a stop string: its tokens' text is never released)
      const whole = await client.chat.completions.create({ ...base, ...extra });
      let n = 0;
      for await (const chunk of await client.chat.completions.create({ ...base, ...extra, stream: true }))
        n += chunk.choices[0]?.logprobs?.content?.length ?? 0;
      assert.equal(n, whole.choices[0].logprobs.content.length, JSON.stringify(extra));
    }
  });

  test('the Responses API: plain and streamed, on the same generation path', async () => {
    const r = await client.responses.create({ model: MODEL_ID, input: 'Once upon a time', max_output_tokens: 12, temperature: 0 });
    assert.equal(r.object, 'response');
    assert.equal(r.status, r.usage.output_tokens === 12 ? 'incomplete' : 'completed');
    assert.ok(r.usage.output_tokens <= 12 && r.usage.output_tokens > 0);
    assert.equal(r.output[0].type, 'message');
    const stream = await client.responses.create({
      model: MODEL_ID, input: [{ role: 'user', content: [{ type: 'input_text', text: 'Once upon a time' }] }],
      max_output_tokens: 12, temperature: 0, stream: true,
    });
    const types = [], seqs = [];
    let text = '', final = null;
    for await (const ev of stream) {
      types.push(ev.type);
      seqs.push(ev.sequence_number);
      if (ev.type === 'response.output_text.delta') text += ev.delta;
      if (ev.type === 'response.incomplete' || ev.type === 'response.completed') final = ev.response;
    }
    assert.deepEqual(seqs, types.map((_, i) => i));  // numbered in the order sent
    assert.equal(types[0], 'response.created');
    assert.equal(types.at(-1), `response.${r.status}`);
    assert.ok(types.includes('response.output_text.done'));
    assert.equal(text, r.output_text);  // greedy: the same text either way
    assert.equal(final.output[0].content[0].text, text);
  });

  test('the Responses API with tools: tools and tool_choice echoed, a function_call item, its output sent back', async () => {
    const rtools = [{ type: 'function', name: 'get_weather', description: 'Weather in a city', strict: true,
                      parameters: tools[0].function.parameters }];
    const tool_choice = { type: 'function', name: 'get_weather' };
    const input = [{ role: 'user', content: 'Weather in Paris?' }];
    const r = await client.responses.create({ model: MODEL_ID, input, tools: rtools, tool_choice, temperature: 0, max_output_tokens: 100, store: false });
    assert.deepEqual(r.tools, rtools);  // as the request gave them (OpenAI echoes both)
    assert.deepEqual(r.tool_choice, tool_choice);
    assert.equal(r.temperature, 0);
    assert.equal(r.max_output_tokens, 100);
    const call = r.output.find((o) => o.type === 'function_call');
    assert.ok(call, JSON.stringify(r.output));
    assert.equal(call.name, 'get_weather');
    assert.match(call.call_id, /^call_/);
    assert.equal(typeof JSON.parse(call.arguments).city, 'string');
    // The call and its output go back as input items; the answer is text.
    const answer = await client.responses.create({
      model: MODEL_ID, tools: rtools, temperature: 0, max_output_tokens: 8, store: false,
      input: [...input, call, { type: 'function_call_output', call_id: call.call_id, output: '{"temp": 21}' }],
    });
    assert.equal(answer.tool_choice, 'auto');  // tools, no choice: auto
    assert.equal(answer.output[0].type, 'message');
    assert.equal(typeof answer.output_text, 'string');
    assert.ok(answer.usage.output_tokens > 0 && answer.usage.output_tokens <= 8);
    assert.ok(answer.usage.input_tokens > r.usage.input_tokens);  // the call and its result reached the prompt
    // Streamed: the function_call item's events, and the echo in the final object.
    const stream = await client.responses.create({ model: MODEL_ID, input, tools: rtools, tool_choice, temperature: 0, max_output_tokens: 100, stream: true });
    let done = null, args = '';
    for await (const ev of stream) {
      if (ev.type === 'response.function_call_arguments.delta') args += ev.delta;
      if (ev.type === 'response.completed') done = ev.response;
    }
    assert.deepEqual(done.tools, rtools);
    assert.equal(done.output.find((o) => o.type === 'function_call').arguments, args);
  });

  test('background responses: queued at once, polled to the foreground answer, cancel', async () => {
    const base = { model: MODEL_ID, input: 'Once upon a time', max_output_tokens: 16, temperature: 0 };
    const fg = await client.responses.create(base);
    let r = await client.responses.create({ ...base, background: true });
    assert.equal(r.status, 'queued');
    assert.equal(r.background, true);
    for (let i = 0; i < 500 && (r.status === 'queued' || r.status === 'in_progress'); ++i) {
      await new Promise((ok) => setTimeout(ok, 20));
      r = await client.responses.retrieve(r.id);
    }
    assert.equal(r.status, fg.status);
    assert.equal(r.output[0].content[0].text, fg.output_text);
    await client.responses.cancel(r.id);  // (ended: it stays as it ended)
    assert.deepEqual((await client.responses.retrieve(r.id)).output, r.output);
    await assert.rejects(client.responses.cancel(fg.id), (e) => e.status === 400);  // (not a background response)
    await assert.rejects(client.responses.create({ ...base, background: true, store: false }),
                         (e) => e.status === 400 && e.param === 'background');
    // Streamed: the client leaves after the first delta and picks the stream up again where it left.
    const stream = await client.responses.create({ ...base, max_output_tokens: 400, background: true, stream: true });
    let id = null, seq = -1, text = '';
    for await (const ev of stream) {
      if (ev.type === 'response.created') id = ev.response.id;
      seq = ev.sequence_number;
      if (ev.type === 'response.output_text.delta') { text += ev.delta; break; }
    }
    let last = null;
    for await (const ev of await client.responses.retrieve(id, { stream: true, starting_after: seq })) {
      assert.equal(ev.sequence_number, ++seq);
      if (ev.type === 'response.output_text.delta') text += ev.delta;
      last = ev;
    }
    assert.equal(last.type, 'response.incomplete');
    assert.equal(text, (await client.responses.retrieve(id)).output[0].content[0].text);
  });

  test('stored responses: previous_response_id over 3 turns, retrieve, input items, delete', async () => {
    const base = { model: MODEL_ID, max_output_tokens: 8, temperature: 0 };
    const r1 = await client.responses.create({ ...base, input: 'Once upon a time' });
    assert.equal(r1.store, true);  // (OpenAI's default)
    const r2 = await client.responses.create({ ...base, input: 'The cat', previous_response_id: r1.id });
    const r3 = await client.responses.create({ ...base, input: 'The end', previous_response_id: r2.id, instructions: 'Be brief' });
    assert.equal(r3.previous_response_id, r2.id);
    assert.ok(r1.usage.input_tokens < r2.usage.input_tokens && r2.usage.input_tokens < r3.usage.input_tokens);
    // The third turn's prompt is the whole conversation, as if sent item by item (and its greedy answer the same).
    const whole = await client.responses.create({
      ...base, store: false, instructions: 'Be brief',
      input: [{ role: 'user', content: 'Once upon a time' }, ...r1.output, { role: 'user', content: 'The cat' }, ...r2.output,
              { role: 'user', content: 'The end' }],
    });
    assert.equal(whole.store, false);
    assert.equal(r3.usage.input_tokens, whole.usage.input_tokens);
    assert.equal(r3.output_text, whole.output_text);
    const got = await client.responses.retrieve(r3.id);
    assert.equal(got.id, r3.id);
    assert.deepEqual(got.output, r3.output);
    // Its input items: the conversation before its output (instructions are not items), each with an id.
    const page = await client.responses.inputItems.list(r3.id, { order: 'asc' });
    assert.deepEqual(page.data.map((i) => i.role), ['user', 'assistant', 'user', 'assistant', 'user']);
    assert.equal(page.data[0].content[0].text, 'Once upon a time');
    assert.deepEqual(page.data[1], r1.output[0]);
    assert.equal(page.data[4].content[0].text, 'The end');
    assert.equal(new Set(page.data.map((i) => i.id)).size, 5);
    const paged = [];  // (the client's own paging: limit 2, after the last id)
    for await (const item of client.responses.inputItems.list(r3.id, { limit: 2 })) paged.push(item.id);
    assert.deepEqual(paged, page.data.map((i) => i.id).reverse());  // (desc by default)
    await client.responses.del(r3.id);
    await assert.rejects(client.responses.retrieve(r3.id), (e) => e.status === 404);
    await assert.rejects(client.responses.create({ ...base, input: 'x', previous_response_id: r3.id }),
                         (e) => e.status === 400 && e.code === 'previous_response_not_found' && e.param === 'previous_response_id');
    // store: false is not stored.
    await assert.rejects(client.responses.retrieve(whole.id), (e) => e.status === 404);
  });

  test('the Conversations API (openai v6): create, retrieve, items list and create, a response in it, delete', async () => {
    const OpenAINext = (await import('openai-next')).default;  // (v4 has no conversations resource)
    const next = new OpenAINext({ baseURL: `${server.url}/v1`, apiKey: KEY, maxRetries: 0, timeout: 120_000 });
    const conv = await next.conversations.create({ metadata: { topic: 'cats' }, items: [{ role: 'user', content: 'Once upon a time' }] });
    assert.match(conv.id, /^conv_[0-9a-f]{24}$/);
    assert.equal(conv.object, 'conversation');
    assert.deepEqual(conv.metadata, { topic: 'cats' });
    assert.deepEqual(await next.conversations.retrieve(conv.id), conv);
    const added = await next.conversations.items.create(conv.id, {
      items: [{ type: 'message', role: 'assistant', content: 'there was a cat' }, { role: 'user', content: 'The cat' }],
    });
    assert.deepEqual(added.data.map((i) => i.id.slice(0, 4)), ['msg_', 'msg_']);
    // A response in it: prompted with its items first, as if they were sent whole; they and its output join it.
    const base = { model: MODEL_ID, max_output_tokens: 8, temperature: 0 };
    const r = await next.responses.create({ ...base, conversation: conv.id, input: 'The end' });
    assert.deepEqual(r.conversation, { id: conv.id });
    const whole = await next.responses.create({
      ...base, store: false, input: [{ role: 'user', content: 'Once upon a time' }, { role: 'assistant', content: 'there was a cat' },
                                     { role: 'user', content: 'The cat' }, { role: 'user', content: 'The end' }],
    });
    assert.equal(r.usage.input_tokens, whole.usage.input_tokens);
    assert.equal(r.output_text, whole.output_text);
    const items = [];  // (the client's own paging: limit 2, after the last id)
    for await (const item of next.conversations.items.list(conv.id, { order: 'asc', limit: 2 })) items.push(item);
    assert.deepEqual(items.map((i) => i.role), ['user', 'assistant', 'user', 'user', 'assistant']);
    assert.equal(items[3].content[0].text, 'The end');
    assert.deepEqual(items[4], r.output[0]);
    assert.deepEqual(await next.conversations.items.retrieve(items[1].id, { conversation_id: conv.id }), items[1]);
    assert.equal((await next.conversations.items.delete(items[1].id, { conversation_id: conv.id })).id, conv.id);
    assert.equal((await next.conversations.items.list(conv.id)).data.length, 4);
    assert.deepEqual((await next.conversations.update(conv.id, { metadata: { topic: 'dogs' } })).metadata, { topic: 'dogs' });
    await assert.rejects(next.responses.create({ ...base, conversation: conv.id, previous_response_id: r.id, input: 'x' }),
                         (e) => e.status === 400 && e.param === 'conversation');
    assert.deepEqual(await next.conversations.delete(conv.id), { id: conv.id, object: 'conversation.deleted', deleted: true });
    await assert.rejects(next.conversations.retrieve(conv.id), (e) => e.status === 404);
    await assert.rejects(next.responses.create({ ...base, conversation: conv.id, input: 'x' }), (e) => e.status === 404);
  });

  test('embeddings: the base64 and float forms agree; unit norm; one vector per input, in order', async () => {
    const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
    const input = ['Once upon a time', 'There was a little cat', 'Once upon a time'];
    const r = await client.embeddings.create({ model: MODEL_ID, input });  // (the client asks base64 and decodes it)
    assert.equal(r.object, 'list');
    assert.equal(r.data.length, 3);
    const dim = r.data[0].embedding.length;
    assert.ok(dim > 0);
    for (const [i, d] of r.data.entries()) {
      assert.equal(d.index, i);
      assert.equal(d.embedding.length, dim);
      assert.ok(Math.abs(norm(d.embedding) - 1) < 1e-5, `norm ${norm(d.embedding)}`);
    }
    assert.deepEqual(r.data[2].embedding, r.data[0].embedding);  // the same text, the same vector
    assert.notDeepEqual(r.data[1].embedding, r.data[0].embedding);
    assert.ok(r.usage.prompt_tokens > 0);
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens);
    const f = await client.embeddings.create({ model: MODEL_ID, input: input[1], encoding_format: 'float', dimensions: dim });
    // (floats print in their shortest form: read back as float32, the same values)
    assert.deepEqual(f.data[0].embedding.map(Math.fround), Array.from(new Float32Array(r.data[1].embedding)));
    // vLLM's normalize: false gives the raw pooled state; the same direction.
    const raw = await postJson(server.url, '/v1/embeddings', { input: input[1], normalize: false },
                               { authorization: `Bearer ${KEY}` });
    assert.equal(raw.status, 200, raw.text);
    const v = raw.json.data[0].embedding, n = norm(v);
    assert.ok(Math.abs(n - 1) > 1e-3, `raw norm ${n}`);
    v.forEach((x, i) => assert.ok(Math.abs(x / n - f.data[0].embedding[i]) < 1e-5));
    await assert.rejects(client.embeddings.create({ model: MODEL_ID, input: 'x', dimensions: dim + 1 }),
                         (e) => e.status === 400 && e.param === 'dimensions');
    await assert.rejects(client.embeddings.create({ model: MODEL_ID, input: 'x '.repeat(5000) }),
                         (e) => e.status === 400 && e.param === 'input');
    await assert.rejects(client.embeddings.create({ model: 'other', input: 'x' }), (e) => e.status === 404);
  });

  test('GET /v1/models/{id}; an unknown model is 404', async () => {
    assert.equal((await client.models.retrieve(MODEL_ID)).id, MODEL_ID);
    await assert.rejects(client.models.retrieve('gpt-4'), (e) => e.status === 404 && e.code === 'model_not_found');
  });

  test('--api-key: 401 without it (/health open); X-Request-Id echoed; CORS', async () => {
    const body = { model: MODEL_ID, prompt: 'x', max_tokens: 1 };
    const no = await postJson(server.url, '/v1/completions', body);
    assert.equal(no.status, 401);
    assert.equal(no.json.error.code, 'invalid_api_key');
    assert.equal((await fetch(`${server.url}/health`)).status, 200);
    const ok = await postJson(server.url, '/v1/completions', body,
                              { authorization: `Bearer ${KEY}`, 'x-request-id': 'trace-123', origin: ORIGIN });
    assert.equal(ok.status, 200, ok.text);
    assert.equal(ok.headers.get('x-request-id'), 'trace-123');
    assert.equal(ok.headers.get('access-control-allow-origin'), ORIGIN);
    await waitLog(server, /trace-123 completion finish=/);
    const pre = await fetch(`${server.url}/v1/chat/completions`, {
      method: 'OPTIONS', headers: { origin: ORIGIN, 'access-control-request-method': 'POST', 'access-control-request-headers': 'authorization, content-type' },
    });
    assert.equal(pre.status, 204);
    assert.equal(pre.headers.get('access-control-allow-origin'), ORIGIN);
    assert.match(pre.headers.get('access-control-allow-methods'), /POST/);
    const other = await postJson(server.url, '/v1/completions', body, { authorization: `Bearer ${KEY}`, origin: 'https://evil.example' });
    assert.equal(other.headers.get('access-control-allow-origin'), null);
  });
});

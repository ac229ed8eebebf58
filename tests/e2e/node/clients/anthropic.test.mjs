// The official Anthropic client (`@anthropic-ai/sdk`) against `firsttoken serve` on stories260K:
// Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) as llama.cpp and vLLM serve
// it, on the same generation path as /v1/chat/completions. Greedy answers equal chat's for the same
// conversation; the streamed events add up to the unstreamed message; a forced tool call comes back
// as a tool_use block and its tool_result goes back in; stop sequences, a prefill, the key in
// x-api-key, and errors in Anthropic's shape (the client's error classes).
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';

import { MODEL, MODEL_ID, postJson, refuseNetwork, skipReason, startServer } from '../helpers.mjs';

const NODE_MAJOR = Number(process.versions.node.split('.')[0]);
const skip = skipReason(['@anthropic-ai/sdk']) ||
  (NODE_MAJOR < 20 ? `@anthropic-ai/sdk needs node >= 20, this is ${process.versions.node}` : false);
const KEY = 'sk-ant-test';
const ALIAS = 'claude-sonnet-4-5';

describe('Anthropic SDK (stories260K)', { skip }, () => {
  let server, refused, Anthropic, client;

  before(async () => {
    refused = refuseNetwork();
    Anthropic = (await import('@anthropic-ai/sdk')).default;
    // An alias as Claude Code needs one: it asks for its own model names.
    server = await startServer(['-m', MODEL, '--threads', '1', '--api-key', KEY, '--served-model-name', `${MODEL_ID},${ALIAS}`]);
    client = new Anthropic({ baseURL: server.url, apiKey: KEY, maxRetries: 0, timeout: 120_000 });
  });
  after(async () => {
    if (!server) return;
    const r = await server.stop();
    assert.equal(r.code, 0, server.log());
    assert.deepEqual(refused, [], 'a client tried to reach the network');
  });

  const auth = { Authorization: `Bearer ${KEY}` };
  const system = 'You tell stories.';
  const messages = [{ role: 'user', content: 'Once upon a time' }];
  // The same conversation through /v1/chat/completions, greedy.
  const chat = async (body) => {
    const r = await postJson(server.url, '/v1/chat/completions', { model: MODEL_ID, temperature: 0, ...body }, auth);
    assert.equal(r.status, 200, r.text);
    return r.json;
  };

  test('messages.create: the greedy answer is chat\'s for the same conversation; usage; count_tokens agrees', async () => {
    const m = await client.messages.create({ model: MODEL_ID, max_tokens: 24, temperature: 0, system, messages });
    assert.match(m.id, /^msg_/);
    assert.equal(m.type, 'message');
    assert.equal(m.role, 'assistant');
    assert.equal(m.model, MODEL_ID);
    assert.equal(m.content.length, 1);
    assert.equal(m.content[0].type, 'text');
    const c = await chat({ max_tokens: 24, messages: [{ role: 'system', content: system }, ...messages] });
    assert.equal(m.content[0].text, c.choices[0].message.content);
    assert.ok(m.content[0].text.length > 0);
    assert.equal(m.stop_reason, c.choices[0].finish_reason === 'length' ? 'max_tokens' : 'end_turn');
    assert.equal(m.stop_sequence, null);
    // (Anthropic's split: the prompt = the tokens computed + those the prefix cache served)
    assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens, c.usage.prompt_tokens);
    assert.equal(m.usage.cache_creation_input_tokens, 0);
    assert.equal(m.usage.output_tokens, c.usage.completion_tokens);
    const n = await client.messages.countTokens({ model: MODEL_ID, system, messages });
    assert.equal(n.input_tokens, c.usage.prompt_tokens);
    // A max_tokens past the context is a cap (Claude Code sends 32000), not an error.
    const big = await client.messages.create({ model: MODEL_ID, max_tokens: 1_000_000, temperature: 0, messages,
                                               stop_sequences: ['.'] });
    assert.ok(['stop_sequence', 'end_turn', 'max_tokens'].includes(big.stop_reason));
  });

  test('messages.stream: the events add up to the unstreamed message; raw events in Anthropic\'s order', async () => {
    const params = { model: MODEL_ID, max_tokens: 24, temperature: 0, system, messages };
    const whole = await client.messages.create(params);
    const stream = client.messages.stream(params);
    let text = '';
    stream.on('text', (t) => { text += t; });
    const final = await stream.finalMessage();
    assert.equal(text, whole.content[0].text);
    assert.deepEqual(final.content, whole.content);
    assert.equal(final.stop_reason, whole.stop_reason);
    assert.deepEqual(final.usage.output_tokens, whole.usage.output_tokens);
    assert.equal(final.usage.input_tokens + final.usage.cache_read_input_tokens,
                 whole.usage.input_tokens + whole.usage.cache_read_input_tokens);
    assert.ok(final.usage.cache_read_input_tokens > 0);  // (the same prompt again: message_delta's usage says so)

    const raw = await client.messages.create({ ...params, stream: true });
    const types = [];
    for await (const ev of raw) types.push(ev.type);
    assert.equal(types[0], 'message_start');
    assert.equal(types.at(-1), 'message_stop');
    assert.equal(types.at(-2), 'message_delta');
    const blocks = types.filter((t) => t.startsWith('content_block'));
    assert.equal(blocks[0], 'content_block_start');
    assert.equal(blocks.at(-1), 'content_block_stop');
    assert.ok(blocks.slice(1, -1).every((t) => t === 'content_block_delta'), types.join(' '));
  });

  test('--served-model-name NAME,ALIAS: the alias is the model (answers name NAME); GET /v1/models/ALIAS', async () => {
    const params = { max_tokens: 8, temperature: 0, messages };
    const a = await client.messages.create({ model: ALIAS, ...params });
    const b = await client.messages.create({ model: MODEL_ID, ...params });
    assert.equal(a.model, MODEL_ID);
    assert.deepEqual(a.content, b.content);
    const card = await (await fetch(`${server.url}/v1/models/${ALIAS}`, { headers: auth })).json();
    assert.equal(card.id, MODEL_ID);
    const list = await (await fetch(`${server.url}/v1/models`, { headers: auth })).json();
    assert.deepEqual(list.data.map((m) => m.id), [MODEL_ID]);
    const models = [];
    for await (const m of client.models.list()) models.push([m.id, m.type, m.display_name]);  // (the client's pages)
    assert.deepEqual(models, [[MODEL_ID, 'model', MODEL_ID]]);
  });

  test('stop_sequences: the text before the first match, stop_reason stop_sequence naming it', async () => {
    const whole = await client.messages.create({ model: MODEL_ID, max_tokens: 24, temperature: 0, messages });
    const text = whole.content[0].text;
    const word = text.trim().split(/\s+/)[2];
    assert.ok(word, text);
    for (const stream of [false, true]) {
      const params = { model: MODEL_ID, max_tokens: 24, temperature: 0, messages, stop_sequences: [word] };
      const m = stream ? await client.messages.stream(params).finalMessage() : await client.messages.create(params);
      assert.equal(m.stop_reason, 'stop_sequence');
      assert.equal(m.stop_sequence, word);
      assert.equal(m.content[0].text, text.slice(0, text.indexOf(word)));
    }
  });

  test('a prefill: a final assistant turn is continued, as chat\'s continue_final_message', async () => {
    const prefill = [...messages, { role: 'assistant', content: 'There was a' }];
    const m = await client.messages.create({ model: MODEL_ID, max_tokens: 12, temperature: 0, messages: prefill });
    const c = await chat({ max_tokens: 12, messages: prefill, continue_final_message: true, add_generation_prompt: false });
    assert.equal(m.content[0].text, c.choices[0].message.content);
  });

  test('a forced tool call: a tool_use block (plain and streamed), its tool_result sent back, an answer', async () => {
    const tools = [{
      name: 'get_weather', description: 'Weather in a city',
      input_schema: { type: 'object', properties: { city: { type: 'string', maxLength: 16 } }, required: ['city'] },
    }];
    const params = { model: MODEL_ID, max_tokens: 60, temperature: 0, tools,
                     tool_choice: { type: 'tool', name: 'get_weather' },
                     messages: [{ role: 'user', content: 'What is the weather in Paris?' }] };
    const m = await client.messages.create(params);
    assert.equal(m.stop_reason, 'tool_use');
    const call = m.content.find((b) => b.type === 'tool_use');
    assert.ok(call, JSON.stringify(m.content));
    assert.match(call.id, /^toolu_/);
    assert.equal(call.name, 'get_weather');
    assert.equal(typeof call.input.city, 'string');
    const streamed = await client.messages.stream(params).finalMessage();
    assert.equal(streamed.stop_reason, 'tool_use');
    const scall = streamed.content.find((b) => b.type === 'tool_use');
    assert.deepEqual(scall.input, call.input);  // (the client parses the input_json_delta events)

    const answer = await client.messages.create({
      model: MODEL_ID, max_tokens: 8, temperature: 0, tools,
      messages: [...params.messages, { role: 'assistant', content: m.content },
                 { role: 'user', content: [{ type: 'tool_result', tool_use_id: call.id, content: 'Sunny, 21 C' }] }],
    });
    assert.ok(['end_turn', 'max_tokens', 'tool_use'].includes(answer.stop_reason));
    // The tool result reached the prompt: more input than the conversation without it.
    const without = await client.messages.countTokens({ model: MODEL_ID, tools, messages: [...params.messages,
      { role: 'assistant', content: m.content }, { role: 'user', content: 'ok' }] });
    const answered = answer.usage.input_tokens + answer.usage.cache_read_input_tokens;
    assert.ok(answered > without.input_tokens, `${answered} vs ${without.input_tokens}`);

    // Tools offered, the choice left to the model (auto, what Claude Code sends): its text is not a
    // call, so it is a text block, chat's content; streamed once it cannot become one.
    const auto = { ...params, tool_choice: undefined, max_tokens: 16 };
    const free = await client.messages.create(auto);
    const chatAuto = await chat({ max_tokens: 16, messages: params.messages,
      tools: tools.map((t) => ({ type: 'function', function: { name: t.name, parameters: t.input_schema } })) });
    assert.equal(chatAuto.choices[0].message.tool_calls, undefined);
    assert.deepEqual(free.content, [{ type: 'text', text: chatAuto.choices[0].message.content }]);
    let deltas = 0, streamedText = '';
    const autoStream = client.messages.stream(auto);
    autoStream.on('text', (t) => { deltas += 1; streamedText += t; });
    await autoStream.finalMessage();
    assert.equal(streamedText, free.content[0].text);
    assert.ok(deltas > 1, `${deltas} text deltas`);

    // tool_choice any = chat's tool_choice required (disable_parallel_tool_use = parallel_tool_calls
    // false): the same generation, in each API's form.
    const any = await client.messages.create({ ...params, tool_choice: { type: 'any', disable_parallel_tool_use: true } });
    const c = await chat({ max_tokens: 60, messages: params.messages, tool_choice: 'required', parallel_tool_calls: false,
                           tools: tools.map((t) => ({ type: 'function', function: { name: t.name, parameters: t.input_schema } })) });
    const calls = any.content.filter((b) => b.type === 'tool_use');
    if (c.choices[0].finish_reason === 'tool_calls') {
      assert.equal(any.stop_reason, 'tool_use');
      assert.deepEqual(calls.map((b) => [b.name, b.input]),
                       c.choices[0].message.tool_calls.map((t) => [t.function.name, JSON.parse(t.function.arguments)]));
    } else {  // (the random model may fill max_tokens with the grammar's whitespace: then both are cut)
      assert.equal(any.stop_reason, 'max_tokens');
      assert.equal(calls.length, 0);
      assert.equal(any.content[0].text, c.choices[0].message.content);
    }
  });

  test('text before a tool call: a text block streamed as it comes, then the tool_use block (auto)', async () => {
    const preamble = 'Let me check the weather.';
    const output = `${preamble}\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>`;
    const tools = [{ name: 'get_weather', input_schema: { type: 'object', properties: { city: { type: 'string' } } } }];
    const params = { model: MODEL_ID, max_tokens: 300, tools, messages: [{ role: 'user', content: 'Weather?' }], guided_choice: [output] };
    const m = await client.messages.create(params);
    assert.equal(m.stop_reason, 'tool_use');
    assert.deepEqual(m.content.map((b) => b.type), ['text', 'tool_use']);
    assert.equal(m.content[0].text, preamble);
    assert.deepEqual(m.content[1].input, { city: 'Paris' });
    const stream = client.messages.stream(params);
    const pieces = [];
    let callStarted = false;
    stream.on('streamEvent', (ev) => {
      if (ev.type === 'content_block_start' && ev.content_block.type === 'tool_use') callStarted = true;
      if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') {
        assert.ok(!callStarted, 'text after the call');
        pieces.push(ev.delta.text);
      }
    });
    const final = await stream.finalMessage();
    assert.equal(pieces.join(''), preamble);
    assert.ok(pieces.length > 1, `the text came in ${pieces.length} piece(s)`);
    assert.deepEqual(final.content.map((b) => [b.type, b.text ?? b.input]), [['text', preamble], ['tool_use', { city: 'Paris' }]]);
    assert.equal(final.stop_reason, 'tool_use');
  });

  test('errors in Anthropic\'s shape: the client\'s classes; the key in x-api-key or as a bearer token', async () => {
    await assert.rejects(client.messages.create({ model: 'claude-haiku-4-5', max_tokens: 5, messages }),
      (e) => e instanceof Anthropic.NotFoundError && e.error?.error?.type === 'not_found_error');
    await assert.rejects(client.messages.create({ model: MODEL_ID, messages }),  // no max_tokens
      (e) => e instanceof Anthropic.BadRequestError && e.error?.error?.type === 'invalid_request_error' &&
             /max_tokens/.test(e.message));
    await assert.rejects(client.messages.create({ model: MODEL_ID, max_tokens: 5, messages: [{ role: 'user',
      content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AAAA' } }] }] }),
      (e) => e instanceof Anthropic.BadRequestError && /not supported/.test(e.message));
    const wrong = new Anthropic({ baseURL: server.url, apiKey: 'sk-wrong', maxRetries: 0 });
    await assert.rejects(wrong.messages.create({ model: MODEL_ID, max_tokens: 5, messages }),
      (e) => e instanceof Anthropic.AuthenticationError && e.error?.error?.type === 'authentication_error');
    // Its other routes answer it in its shape too (it sends anthropic-version).
    await assert.rejects(wrong.models.list(),
      (e) => e instanceof Anthropic.AuthenticationError && e.error?.error?.type === 'authentication_error');
    await assert.rejects(client.models.retrieve('claude-haiku-4-5'),
      (e) => e instanceof Anthropic.NotFoundError && e.error?.error?.type === 'not_found_error');
    // The key as a bearer token works too (authToken: Authorization), and on OpenAI's routes x-api-key does.
    const bearer = new Anthropic({ baseURL: server.url, apiKey: null, authToken: KEY, maxRetries: 0 });
    const m = await bearer.messages.create({ model: MODEL_ID, max_tokens: 3, temperature: 0, messages });
    assert.equal(m.usage.output_tokens, 3);
    const r = await postJson(server.url, '/v1/completions', { model: MODEL_ID, prompt: 'Once', max_tokens: 2 }, { 'x-api-key': KEY });
    assert.equal(r.status, 200);
    // OpenAI's routes keep OpenAI's error shape.
    const e = await postJson(server.url, '/v1/completions', { model: 'nope', prompt: 'Once' }, auth);
    assert.equal(e.status, 404);
    assert.equal(e.json.error.code, 'model_not_found');
  });
});

// Extended thinking on a template that opens the reasoning on request (DeepSeek V3.1's `thinking`):
// thinking enabled renders the prompt open, so stories260K's greedy text (no </think>) is all a
// thinking block, equal to chat's reasoning_content; disabled, it is the text block.
describe('Anthropic SDK: extended thinking (a template that opens <think> on request)', { skip }, () => {
  let server, dir, Anthropic, client;
  before(async () => {
    Anthropic = (await import('@anthropic-ai/sdk')).default;
    dir = mkdtempSync(join(tmpdir(), 'ft-think-'));
    const template = join(dir, 'thinking.jinja');
    writeFileSync(template, "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}" +
      "{% if add_generation_prompt %}<|assistant|>{% if thinking %}<think>\n{% else %}</think>{% endif %}{% endif %}");
    server = await startServer(['-m', MODEL, '-t', '1', '--chat-template-file', template]);
    client = new Anthropic({ baseURL: server.url, apiKey: 'x', maxRetries: 0, timeout: 120_000 });
  });
  after(async () => {
    if (server) assert.equal((await server.stop()).code, 0, server.log());
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  test('thinking enabled: a thinking block (plain and streamed) holding chat\'s reasoning; disabled: text', async () => {
    const messages = [{ role: 'user', content: 'Once upon a time' }];
    const req = { model: MODEL_ID, max_tokens: 12, temperature: 0, messages };
    const chat = async (thinking) => (await postJson(server.url, '/v1/chat/completions', {
      ...req, chat_template_kwargs: { thinking } })).json.choices[0].message;
    const on = await client.messages.create({ ...req, thinking: { type: 'enabled', budget_tokens: 1024 } });
    assert.deepEqual(on.content.map((b) => b.type), ['thinking']);
    const reasoning = (await chat(true)).reasoning_content;
    assert.ok(reasoning.length > 0);
    assert.equal(on.content[0].thinking, reasoning);
    const stream = client.messages.stream({ ...req, thinking: { type: 'enabled', budget_tokens: 1024 } });
    let streamed = '';
    stream.on('thinking', (delta) => { streamed += delta; });
    const final = await stream.finalMessage();
    assert.equal(streamed, reasoning);
    assert.deepEqual(final.content.map((b) => [b.type, b.thinking]), [['thinking', reasoning]]);
    const off = await client.messages.create({ ...req, thinking: { type: 'disabled' } });
    assert.deepEqual(off.content, [{ type: 'text', text: (await chat(false)).content }]);
  });
});

// LlamaIndex TS (`@llamaindex/openai`: OpenAI and OpenAIResponses) against `firsttoken serve` on
// stories260K: chat, streaming, structured output (responseFormat, a json_schema; and exec's
// format_output tool) parsed by its zod schema, a tool round trip (exec: a forced call and its
// executed result, then the answer; plain and streamed) on Chat Completions and the Responses API (OpenAIResponses),
// and OpenAIEmbedding.
// The model is tiny and random: structure is forced by the server's constrained decoding, and the
// tests check well-formedness, not content. refuseNetwork() proves nothing leaves the machine.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { MODEL, MODEL_ID, refuseNetwork, skipReason, startServer } from '../helpers.mjs';

const skip = skipReason(['@llamaindex/openai', '@llamaindex/core', 'zod']);

describe('LlamaIndex (stories260K)', { skip }, () => {
  let server, refused, li, tool, z;
  const options = (fields) => ({ model: MODEL_ID, apiKey: 'unused', baseURL: `${server.url}/v1`, temperature: 0, maxRetries: 0, ...fields });
  const chatLlm = (maxTokens) => new li.OpenAI(options({ maxTokens }));
  // (OpenAIResponses does not send its temperature: given as an additional option.)
  const responsesLlm = (maxTokens) => new li.OpenAIResponses(options({ maxOutputTokens: maxTokens, additionalChatOptions: { temperature: 0 } }));

  before(async () => {
    refused = refuseNetwork();
    li = await import('@llamaindex/openai');
    ({ tool } = await import('@llamaindex/core/tools'));
    ({ z } = await import('zod'));
    server = await startServer(['-m', MODEL, '--threads', '1']);
  });
  after(async () => {
    if (!server) return;
    const r = await server.stop();
    assert.equal(r.code, 0, server.log());
    assert.deepEqual(refused, [], 'a client tried to reach the network');
  });

  const user = (content) => [{ role: 'user', content }];
  const pet = () => z.object({ name: z.string().max(12), age: z.number().int(), kind: z.enum(['cat', 'dog']) });
  const weather = () => tool({
    name: 'get_weather', description: 'Weather in a city', parameters: z.object({ city: z.string().max(16) }),
    execute: ({ city }) => JSON.stringify({ city, temp: 21 }),
  });
  const apis = [['chat completions', chatLlm], ['responses', responsesLlm]];

  test('OpenAIEmbedding: text and query embeddings, one unit vector per text', async () => {
    const emb = new li.OpenAIEmbedding({ model: MODEL_ID, apiKey: 'unused', baseURL: `${server.url}/v1`, maxRetries: 0,
                                         embedBatchSize: 2 });
    const texts = await emb.getTextEmbeddings(['Once upon a time', 'a cat', 'a dog']);
    assert.equal(texts.length, 3);
    for (const v of texts) assert.ok(Math.abs(Math.hypot(...v) - 1) < 1e-5);
    assert.deepEqual(await emb.getQueryEmbedding({ type: 'text', text: 'a cat' }), texts[1]);
  });

  test('chat and streamed chat', async () => {
    for (const [what, llm] of apis) {
      const r = await llm(8).chat({ messages: user('Once upon a time') });
      assert.equal(r.message.role, 'assistant', what);
      assert.equal(typeof r.message.content, 'string', what);
      assert.ok(r.message.content.length > 0, what);
      let text = '';
      // (OpenAIResponses repeats the last delta on each later event: only the delta events count.)
      for await (const chunk of await llm(8).chat({ messages: user('Once upon a time'), stream: true }))
        if (!chunk.raw?.type || chunk.raw.type === 'response.output_text.delta') text += chunk.delta;
      assert.equal(text, r.message.content, what);  // greedy: the same text either way
    }
  });

  test('structured output: responseFormat (json_schema) parses against its schema', async () => {
    const schema = pet();
    const r = await chatLlm(200).chat({ messages: user('Describe a pet'), responseFormat: schema });
    const obj = JSON.parse(r.message.content);
    assert.deepEqual(schema.parse(obj), obj);
  });

  test('structured output: exec with responseFormat (the format_output tool, forced)', async () => {
    for (const [what, llm] of apis) {
      const schema = pet();
      const r = await llm(200).exec({ messages: user('Describe a pet'), responseFormat: schema,
                                      additionalChatOptions: { tool_choice: 'required', parallel_tool_calls: false } });
      assert.equal(r.toolCalls.length, 1, what);
      assert.deepEqual(schema.parse(r.object), r.object, what);
    }
  });

  test('a tool round trip: exec (forced call, executed result), then the answer', async () => {
    for (const [what, llm] of apis) {
      const messages = user('Weather in Paris?');
      const r = await llm(100).exec({ messages, tools: [weather()],
                                      additionalChatOptions: { tool_choice: 'required', parallel_tool_calls: false } });
      assert.equal(r.toolCalls.length, 1, what);
      assert.equal(r.toolCalls[0].name, 'get_weather', what);
      const result = r.newMessages.at(-1).options.toolResult;
      assert.equal(result.id, r.toolCalls[0].id, what);
      assert.equal(result.isError, false, what);
      assert.equal(JSON.parse(result.result).temp, 21, what);
      const answer = await llm(8).chat({ messages: [...messages, ...r.newMessages], tools: [weather()] });
      assert.equal(typeof answer.message.content, 'string', what);
      assert.ok(answer.message.content.length > 0, what);
    }
  });

  test('a streamed tool call: chat with stream, and exec with stream', async () => {
    const forced = { tool_choice: 'required', parallel_tool_calls: false };
    for (const [what, llm] of apis) {
      let calls = [];
      for await (const chunk of await llm(100).chat({ messages: user('Weather?'), tools: [weather()], stream: true,
                                                      additionalChatOptions: forced }))
        if (chunk.options?.toolCall) calls = chunk.options.toolCall;
      assert.equal(calls.length, 1, what);
      assert.equal(calls[0].name, 'get_weather', what);
      assert.equal(typeof calls[0].input.city, 'string', what);
    }
    // exec's streamed form looks for calls in the first chunk only: a Chat Completions stream (a
    // Responses stream opens with response.created, so LlamaIndex never finds its calls there).
    const r = await chatLlm(100).exec({ messages: user('Weather?'), tools: [weather()], stream: true, additionalChatOptions: forced });
    for await (const _ of r.stream);
    assert.equal(r.toolCalls.length, 1);
    assert.equal(r.toolCalls[0].name, 'get_weather');
    assert.equal(typeof r.toolCalls[0].input.city, 'string');
  });
});

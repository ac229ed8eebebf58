// LangChain JS (`@langchain/openai` ChatOpenAI) against `firsttoken serve` on stories260K: chat,
// streaming, withStructuredOutput (json_schema and function calling) parsed by its zod schema, a
// tool round trip (forced call, ToolMessage, answer; plain and streamed), the Responses API and
// OpenAIEmbeddings.
// The model is tiny and random: structure is forced by the server's constrained decoding, and
// the tests check well-formedness, not content. No network: LangChain's token counting (a
// tokenizer table fetched from the web) is never reached, and refuseNetwork() proves it.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { MODEL, MODEL_ID, refuseNetwork, skipReason, startServer } from '../helpers.mjs';

const skip = skipReason(['@langchain/openai', '@langchain/core', 'zod']);
process.env.LANGSMITH_TRACING = 'false';  // no tracing to a LangSmith server
process.env.LANGCHAIN_TRACING_V2 = 'false';

describe('LangChain JS (stories260K)', { skip }, () => {
  let server, refused, ChatOpenAI, OpenAIEmbeddings, HumanMessage, tool, z;
  const chat = (fields = {}) =>
    new ChatOpenAI({ model: MODEL_ID, apiKey: 'unused', configuration: { baseURL: `${server.url}/v1` },
                     temperature: 0, maxRetries: 0, timeout: 120_000, ...fields });

  before(async () => {
    refused = refuseNetwork();
    ({ ChatOpenAI, OpenAIEmbeddings } = await import('@langchain/openai'));
    ({ HumanMessage } = await import('@langchain/core/messages'));
    ({ tool } = await import('@langchain/core/tools'));
    ({ z } = await import('zod'));
    server = await startServer(['-m', MODEL, '--threads', '1']);
  });
  after(async () => {
    if (!server) return;
    const r = await server.stop();
    assert.equal(r.code, 0, server.log());
    assert.deepEqual(refused, [], 'a client tried to reach the network');
  });

  const pet = () => z.object({ name: z.string().max(12), age: z.number().int(), kind: z.enum(['cat', 'dog']) });
  const weather = () => tool(async ({ city }) => JSON.stringify({ city, temp: 21 }), {
    name: 'get_weather', description: 'Weather in a city', schema: z.object({ city: z.string().max(16) }),
  });

  test('OpenAIEmbeddings: embedDocuments and embedQuery, one unit vector per text', async () => {
    const emb = new OpenAIEmbeddings({ model: MODEL_ID, apiKey: 'unused', configuration: { baseURL: `${server.url}/v1` },
                                       maxRetries: 0, batchSize: 2 });
    const docs = await emb.embedDocuments(['Once upon a time', 'a cat', 'a dog']);  // two requests of 2 and 1
    assert.equal(docs.length, 3);
    for (const d of docs) assert.ok(Math.abs(Math.hypot(...d) - 1) < 1e-5);
    assert.deepEqual(await emb.embedQuery('a dog'), docs[2]);
  });

  test('invoke and stream: text and usage', async () => {
    const r = await chat({ maxTokens: 8 }).invoke('Once upon a time');
    assert.equal(typeof r.content, 'string');
    assert.equal(r.usage_metadata.output_tokens, 8);
    assert.equal(r.response_metadata.finish_reason, 'length');
    let text = '', usage = null;
    for await (const chunk of await chat({ maxTokens: 8 }).stream('Once upon a time')) {
      text += chunk.content;
      if (chunk.usage_metadata) usage = chunk.usage_metadata;
    }
    assert.equal(text, r.content);  // greedy: the same text either way
    assert.equal(usage.output_tokens, 8);
  });

  for (const method of ['jsonSchema', 'functionCalling']) {
    test(`withStructuredOutput (${method}): the result parses against its schema`, async () => {
      const schema = pet();
      const r = await chat({ maxTokens: 200 }).withStructuredOutput(schema, { name: 'pet', method, strict: true })
        .invoke('Describe a pet');
      assert.deepEqual(schema.parse(r), r);
    });
  }

  test('a tool round trip: forced call, ToolMessage, answer', async () => {
    const get = weather();
    const question = [new HumanMessage('Weather in Paris?')];
    // One call (parallel_tool_calls false): a random model left free to add calls fills max_tokens.
    const call = await chat({ maxTokens: 100 }).bindTools([get], { tool_choice: 'required', parallel_tool_calls: false })
      .invoke(question);
    assert.equal(call.tool_calls.length, 1);
    assert.equal(call.tool_calls[0].name, 'get_weather');
    assert.equal(typeof call.tool_calls[0].args.city, 'string');
    const result = await get.invoke(call.tool_calls[0]);  // a ToolMessage answering that call id
    assert.equal(result.tool_call_id, call.tool_calls[0].id);
    const answer = await chat({ maxTokens: 8 }).bindTools([get]).invoke([...question, call, result]);
    assert.equal(typeof answer.content, 'string');
    assert.equal(answer.usage_metadata.output_tokens, 8);
  });

  test('a streamed tool call is assembled from its chunks', async () => {
    let whole = null;
    const model = chat({ maxTokens: 100 }).bindTools([weather()], { tool_choice: 'required', parallel_tool_calls: false });
    for await (const chunk of await model.stream('Weather?')) whole = whole ? whole.concat(chunk) : chunk;
    assert.equal(whole.tool_calls.length, 1);
    assert.equal(whole.tool_calls[0].name, 'get_weather');
    assert.equal(typeof whole.tool_calls[0].args.city, 'string');
    assert.equal(whole.response_metadata.finish_reason, 'tool_calls');
  });

  test('the Responses API (useResponsesApi): text, stream, structured output, tool round trip', async () => {
    const model = (fields) => chat({ useResponsesApi: true, ...fields });
    const r = await model({ maxTokens: 8 }).invoke('Once upon a time');
    assert.equal(typeof r.text, 'string');
    assert.equal(r.usage_metadata.output_tokens, 8);
    let text = '';
    for await (const chunk of await model({ maxTokens: 8 }).stream('Once upon a time')) text += chunk.text;
    assert.equal(text, r.text);
    const schema = pet();
    const obj = await model({ maxTokens: 200 }).withStructuredOutput(schema, { name: 'pet', method: 'jsonSchema' }).invoke('A pet');
    assert.deepEqual(schema.parse(obj), obj);
    const get = weather();
    const question = [new HumanMessage('Weather in Paris?')];
    // A named tool_choice: LangChain's Responses path drops a string one ('required'), and an
    // unforced random model answers in prose.
    const call = await model({ maxTokens: 100 }).bindTools([get], { tool_choice: 'get_weather', parallel_tool_calls: false })
      .invoke(question);
    assert.equal(call.tool_calls.length, 1);
    assert.equal(call.tool_calls[0].name, 'get_weather');
    const answer = await model({ maxTokens: 8 }).bindTools([get]).invoke([...question, call, await get.invoke(call.tool_calls[0])]);
    assert.equal(typeof answer.text, 'string');
    assert.equal(answer.usage_metadata.output_tokens, 8);
  });
});

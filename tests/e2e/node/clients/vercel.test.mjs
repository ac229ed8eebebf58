// The Vercel AI SDK (`ai` with `@ai-sdk/openai-compatible` and `@ai-sdk/openai`) against
// `firsttoken serve` on stories260K: generateText, streamText, generateObject parsed by its zod
// schema, a tool round trip (a forced call, its executed result, an answer: one two-step
// generateText) on Chat Completions, and the same through the Responses API (`openai.responses`);
// a two-turn conversation on the Responses API whose second turn refers to the first answer by id;
// embed and embedMany.
// The model is tiny and random: structure is forced by the server's constrained decoding, and the
// tests check well-formedness, not content. refuseNetwork() proves nothing leaves the machine.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { MODEL, MODEL_ID, refuseNetwork, skipReason, startServer } from '../helpers.mjs';

const skip = skipReason(['ai', '@ai-sdk/openai-compatible', '@ai-sdk/openai', 'zod']);

describe('Vercel AI SDK (stories260K)', { skip }, () => {
  let server, refused, ai, z, compatible, openai;

  before(async () => {
    refused = refuseNetwork();
    ai = await import('ai');
    ({ z } = await import('zod'));
    server = await startServer(['-m', MODEL, '--threads', '1']);
    const { createOpenAICompatible } = await import('@ai-sdk/openai-compatible');
    const { createOpenAI } = await import('@ai-sdk/openai');
    compatible = createOpenAICompatible({ name: 'firsttoken', baseURL: `${server.url}/v1`, apiKey: 'unused',
                                          supportsStructuredOutputs: true, includeUsage: true });
    openai = createOpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused' });
  });
  after(async () => {
    if (!server) return;
    const r = await server.stop();
    assert.equal(r.code, 0, server.log());
    assert.deepEqual(refused, [], 'a client tried to reach the network');
  });

  const common = { temperature: 0, maxRetries: 0 };
  // One tool call per turn (parallel_tool_calls false), in each provider's spelling: a random model
  // left free to add calls goes on until max_tokens.
  const oneCall = { providerOptions: { openai: { parallelToolCalls: false }, firsttoken: { parallel_tool_calls: false } } };
  const pet = () => z.object({ name: z.string().max(12), age: z.number().int(), kind: z.enum(['cat', 'dog']) });
  const weather = () => ai.tool({
    description: 'Weather in a city', inputSchema: z.object({ city: z.string().max(16) }),
    execute: async ({ city }) => ({ city, temp: 21 }),
  });

  // Each API surface the SDK offers for an OpenAI-style server.
  const models = () => [
    ['openai-compatible chat', compatible.chatModel(MODEL_ID)],
    ['openai chat', openai.chat(MODEL_ID)],
    ['openai responses', openai.responses(MODEL_ID)],
  ];

  test('embed and embedMany, through both providers: one unit vector per value, in order', async () => {
    for (const model of [compatible.textEmbeddingModel(MODEL_ID), openai.embedding(MODEL_ID)]) {
      const many = await ai.embedMany({ model, values: ['Once upon a time', 'a cat', 'a dog'], maxRetries: 0 });
      assert.equal(many.embeddings.length, 3);
      for (const v of many.embeddings) assert.ok(Math.abs(Math.hypot(...v) - 1) < 1e-5);
      assert.ok(many.usage.tokens > 0);
      const one = await ai.embed({ model, value: 'a cat', maxRetries: 0 });
      assert.deepEqual(one.embedding.map(Math.fround), many.embeddings[1].map(Math.fround));
      assert.ok(ai.cosineSimilarity(one.embedding, many.embeddings[1]) > 0.999999);
    }
  });

  test('generateText and streamText: text and usage', async () => {
    for (const [what, model] of models()) {
      const r = await ai.generateText({ model, prompt: 'Once upon a time', maxOutputTokens: 8, ...common });
      assert.equal(typeof r.text, 'string', what);
      assert.equal(r.usage.outputTokens, 8, what);
      assert.equal(r.finishReason, 'length', what);
      const s = ai.streamText({ model, prompt: 'Once upon a time', maxOutputTokens: 8, ...common,
                                onError: ({ error }) => { throw error; } });
      let text = '';
      for await (const delta of s.textStream) text += delta;
      assert.equal(text, r.text, what);  // greedy: the same text either way
      assert.equal((await s.usage).outputTokens, 8, what);
    }
  });

  test('generateObject: the object parses against its schema', async () => {
    for (const [what, model] of models()) {
      const schema = pet();
      const r = await ai.generateObject({ model, schema, schemaName: 'pet', prompt: 'Describe a pet', maxOutputTokens: 200, ...common });
      assert.deepEqual(schema.parse(r.object), r.object, what);
      assert.equal(r.finishReason, 'stop', what);
    }
  });

  test('a tool round trip: forced call, executed result, answer (two steps)', async () => {
    for (const [what, model] of models()) {
      const r = await ai.generateText({
        model, prompt: 'Weather in Paris?', maxOutputTokens: 150, ...common, ...oneCall,
        tools: { get_weather: weather() }, stopWhen: ai.stepCountIs(2),
        prepareStep: ({ stepNumber }) => ({ toolChoice: stepNumber === 0 ? 'required' : 'none' }),
      });
      assert.equal(r.steps.length, 2, what);
      const [call] = r.steps[0].toolCalls;
      assert.equal(r.steps[0].finishReason, 'tool-calls', what);
      assert.equal(call.toolName, 'get_weather', what);
      assert.equal(typeof call.input.city, 'string', what);
      assert.deepEqual(r.steps[0].toolResults[0].output, { city: call.input.city, temp: 21 }, what);
      assert.equal(r.steps[1].toolCalls.length, 0, what);
      assert.equal(typeof r.text, 'string', what);
    }
  });

  // On its second turn the SDK sends the first answer's message as an item_reference (store: true,
  // its default): the server resolves it from its store. The prompt is the one the same
  // conversation makes sent by value (store: false), streamed or not.
  test('the Responses API over two turns: the first answer sent back by reference', async () => {
    const bodies = [];  // (each request's body, as the SDK sent it)
    const recording = (await import('@ai-sdk/openai')).createOpenAI({
      baseURL: `${server.url}/v1`, apiKey: 'unused',
      fetch: (url, init) => {
        if (typeof init?.body === 'string') bodies.push(JSON.parse(init.body));
        return fetch(url, init);
      },
    });
    const model = recording.responses(MODEL_ID);
    for (const stream of [false, true]) {
      const run = async (messages, providerOptions = {}) => {
        const args = { model, messages, maxOutputTokens: 8, ...common, providerOptions };
        if (!stream) return ai.generateText(args);
        const s = ai.streamText({ ...args, onError: ({ error }) => { throw error; } });
        return { text: await s.text, usage: await s.usage, response: await s.response };
      };
      const question = { role: 'user', content: 'Once upon a time' }, next = { role: 'user', content: 'The end' };
      const first = await run([question]);
      const second = await run([question, ...first.response.messages, next]);
      const sent = bodies.at(-1).input;
      assert.ok(sent.some((i) => i.type === 'item_reference'), `stream ${stream}: ${JSON.stringify(sent)}`);
      const byValue = await run([question, ...first.response.messages, next], { openai: { store: false } });
      assert.ok(!bodies.at(-1).input.some((i) => i.type === 'item_reference'), JSON.stringify(bodies.at(-1).input));
      assert.equal(second.usage.inputTokens, byValue.usage.inputTokens, `stream ${stream}`);
      assert.ok(second.usage.inputTokens > first.usage.inputTokens, `stream ${stream}`);
      assert.equal(second.text, byValue.text, `stream ${stream}`);
    }
  });

  test('a streamed tool call (streamText)', async () => {
    for (const [what, model] of models()) {
      const s = ai.streamText({ model, prompt: 'Weather?', maxOutputTokens: 150, ...common, ...oneCall, tools: { get_weather: weather() },
                                toolChoice: 'required', onError: ({ error }) => { throw error; } });
      const calls = await s.toolCalls;
      assert.equal(calls.length, 1, what);
      assert.equal(calls[0].toolName, 'get_weather', what);
      assert.equal(typeof calls[0].input.city, 'string', what);
      assert.equal(await s.finishReason, 'tool-calls', what);
    }
  });
});

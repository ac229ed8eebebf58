// LoRA adapters over HTTP (issue 17): `serve --lora NAME=FILE`, /v1/models with `parent`, a
// completion picking an adapter by `model` (greedy text equal to the merged model's, served by a
// second server), /v1/load_lora_adapter and /v1/unload_lora_adapter with their documented errors:
// a bad file or a taken name 400 (load_inplace: true replaces it), an unknown name 404, unloading
// one that a request is using 400 ("in use"), and once unloaded its name is an unknown model (404).
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';

import { BINARY, postJson, skipReason, startServer } from './helpers.mjs';

const skip = skipReason([]);
const BASE_ID = 'base';

function makeModel(args, shape = 'tiny', type = 'f32') {
  const r = spawnSync(BINARY, ['make-model', '--shape', shape, '--type', type, ...args], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
}

async function complete(url, model, prompt = 'Hello there', max_tokens = 12) {
  const r = await postJson(url, '/v1/completions', { model, prompt, max_tokens, temperature: 0, ignore_eos: true });
  assert.equal(r.status, 200, r.text);
  return r.json.choices[0].text;
}

describe('LoRA adapters over HTTP', { skip }, () => {
  let dir, server, merged;
  const file = (n) => join(dir, n);

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), `ft-lora-${process.pid}-`));
    makeModel(['-o', file('base.gguf'), '--lora-rank', '4', '--lora-out', file('sql.gguf'), '--merged-out', file('merged.gguf')]);
    makeModel(['-o', file('base2.gguf'), '--lora-rank', '8', '--lora-seed', '2', '--lora-out', file('chat.gguf')]);
    writeFileSync(file('not-an-adapter.gguf'), 'GGUF but not really');
    server = await startServer(['-m', file('base.gguf'), '--served-model-name', BASE_ID, '-t', '1', '--lora', `sql=${file('sql.gguf')}`]);
    merged = await startServer(['-m', file('merged.gguf'), '--served-model-name', BASE_ID, '-t', '1']);
  });
  after(async () => {
    await server?.stop();
    await merged?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  test('/v1/models lists the base and each adapter with its parent', async () => {
    const r = await fetch(`${server.url}/v1/models`).then((x) => x.json());
    const ids = Object.fromEntries(r.data.map((m) => [m.id, m]));
    assert.ok(ids[BASE_ID], JSON.stringify(r));
    assert.equal(ids.sql?.parent, BASE_ID, JSON.stringify(r));
    assert.ok(!ids[BASE_ID].parent, JSON.stringify(r));
  });

  test('model = the adapter name gives the merged model\'s greedy text; the base differs', async () => {
    const viaAdapter = await complete(server.url, 'sql');
    const viaMerged = await complete(merged.url, BASE_ID);
    const viaBase = await complete(server.url, BASE_ID);
    assert.equal(viaAdapter, viaMerged);
    assert.notEqual(viaAdapter, viaBase, 'the adapter changed nothing: the test cannot tell adapters apart');
  });

  test('load at run time; a bad file, a taken name and unknown fields are 400', async () => {
    let r = await postJson(server.url, '/v1/load_lora_adapter', { lora_name: 'chat', lora_path: file('chat.gguf') });
    assert.equal(r.status, 200, r.text);
    const models = await fetch(`${server.url}/v1/models`).then((x) => x.json());
    assert.equal(models.data.find((m) => m.id === 'chat')?.parent, BASE_ID);
    assert.notEqual(await complete(server.url, 'chat'), await complete(server.url, 'sql'));

    r = await postJson(server.url, '/v1/load_lora_adapter', { lora_name: 'chat', lora_path: file('chat.gguf') });
    assert.equal(r.status, 400, r.text);
    assert.match(r.text, /already loaded/);
    r = await postJson(server.url, '/v1/load_lora_adapter', { lora_name: 'bad', lora_path: file('not-an-adapter.gguf') });
    assert.equal(r.status, 400, r.text);
    r = await postJson(server.url, '/v1/load_lora_adapter', { lora_name: 'gone', lora_path: file('no-such-file.gguf') });
    assert.equal(r.status, 400, r.text);
    r = await postJson(server.url, '/v1/load_lora_adapter', { lora_name: 'x', lora_path: file('chat.gguf'), colour: 'red' });
    assert.equal(r.status, 400, r.text);
    r = await postJson(server.url, '/v1/load_lora_adapter', { lora_name: BASE_ID, lora_path: file('chat.gguf') });
    assert.equal(r.status, 400, r.text);
    const after = await fetch(`${server.url}/v1/models`).then((x) => x.json());
    for (const name of ['bad', 'gone', 'x']) assert.ok(!after.data.some((m) => m.id === name), name);
  });

  test('load_inplace replaces a loaded adapter under its name; a non-boolean one is 400', async () => {
    let r = await postJson(server.url, '/v1/load_lora_adapter', { lora_name: 'swap', lora_path: file('sql.gguf') });
    assert.equal(r.status, 200, r.text);
    r = await postJson(server.url, '/v1/load_lora_adapter', { lora_name: 'swap-ref', lora_path: file('chat.gguf') });
    assert.equal(r.status, 200, r.text);
    const before = await complete(server.url, 'swap');
    assert.equal(before, await complete(server.url, 'sql'));
    const ref = await complete(server.url, 'swap-ref');
    assert.notEqual(before, ref, 'the two adapters agree: the test cannot tell them apart');
    r = await postJson(server.url, '/v1/load_lora_adapter', { lora_name: 'swap', lora_path: file('chat.gguf'), load_inplace: 'yes' });
    assert.equal(r.status, 400, r.text);
    r = await postJson(server.url, '/v1/load_lora_adapter', { lora_name: 'swap', lora_path: file('chat.gguf'), load_inplace: true });
    assert.equal(r.status, 200, r.text);
    assert.equal(await complete(server.url, 'swap'), ref);
    const models = await fetch(`${server.url}/v1/models`).then((x) => x.json());
    assert.equal(models.data.filter((m) => m.id === 'swap').length, 1, JSON.stringify(models));
    assert.equal(models.data.find((m) => m.id === 'swap').root, file('chat.gguf'));
  });

  test('unload: unknown name 404, in use 400, then done; its name is then an unknown model', async () => {
    let r = await postJson(server.url, '/v1/unload_lora_adapter', { lora_name: 'nobody' });
    assert.equal(r.status, 404, r.text);

    // A model slow enough that a long request is still running when the unload arrives (the tiny
    // one writes 2,000 tokens in ~0.2 s): 110m Q8_0, a few ms per token.
    makeModel(['-o', file('110m.gguf'), '--lora-rank', '4', '--lora-out', file('110m-a.gguf')], '110m', 'q8_0');
    const slow = await startServer(['-m', file('110m.gguf'), '--served-model-name', BASE_ID, '-t', '1']);
    try {
      r = await postJson(slow.url, '/v1/load_lora_adapter', { lora_name: 'busy', lora_path: file('110m-a.gguf') });
      assert.equal(r.status, 200, r.text);
      // A long streamed request keeps the adapter in use until the client leaves.
      const ctl = new AbortController();
      const res = await fetch(`${slow.url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'busy', prompt: 'Hello', max_tokens: 1500, ignore_eos: true, stream: true }),
        signal: ctl.signal,
      });
      assert.equal(res.status, 200);
      const reader = res.body.getReader();
      await reader.read();  // a first chunk: the request is running
      r = await postJson(slow.url, '/v1/unload_lora_adapter', { lora_name: 'busy' });
      assert.equal(r.status, 400, r.text);
      assert.match(r.text, /in use by 1 request/);
      ctl.abort();
      await reader.read().catch(() => {});

      // The disconnect frees it: the unload succeeds within a few seconds.
      const t0 = Date.now();
      for (;;) {
        r = await postJson(slow.url, '/v1/unload_lora_adapter', { lora_name: 'busy' });
        if (r.status === 200 || Date.now() - t0 > 10_000) break;
        await new Promise((res2) => setTimeout(res2, 50));
      }
      assert.equal(r.status, 200, r.text);
      r = await postJson(slow.url, '/v1/completions', { model: 'busy', prompt: 'Hello', max_tokens: 2 });
      assert.equal(r.status, 404, r.text);
      // Loaded again under the same name, it serves again.
      r = await postJson(slow.url, '/v1/load_lora_adapter', { lora_name: 'busy', lora_path: file('110m-a.gguf') });
      assert.equal(r.status, 200, r.text);
      await complete(slow.url, 'busy', 'Hello', 2);
    } finally {
      await slow.stop();
    }
    // The first server's adapters are untouched by all this.
    assert.equal(await complete(server.url, 'sql'), await complete(merged.url, BASE_ID));
  });
});

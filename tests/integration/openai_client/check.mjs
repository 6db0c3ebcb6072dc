// The official `openai` npm client against Ballast's gateway: models.list,
// completions.create and chat.completions.create (plain and streamed, with
// usage and logprobs; chat with the Qwen3 tokenizer's own template) and the
// error classes the client maps from HTTP codes.
// Usage: node check.mjs path/to/ballast qwen3-tokenizer-dir (run.sh installs
// the client first). Exits non-zero on any failure.
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServe, untilReady } from './serve.mjs';
import { checkChat } from './check_chat.mjs';
import { checkCurl } from './check_curl.mjs';

const serve = await startServe(process.argv[2], {
  models: ['a', { name: 'chat', tokenizer: process.argv[3] }],
});
try {
  const client = new OpenAI({ baseURL: `${serve.base}/v1`, apiKey: 'unused', maxRetries: 0 });
  const params = { model: 'a', prompt: 'Hello', max_tokens: 8, temperature: 0, ignore_eos: true };
  const plain = await untilReady(() => client.completions.create(params));

  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id).sort(), ['a', 'chat']);
  assert.equal(models.data[0].object, 'model');

  assert.equal(plain.object, 'text_completion');
  assert.match(plain.id, /^cmpl-/);
  assert.equal(plain.model, 'a');
  assert.equal(plain.choices.length, 1);
  assert.equal(typeof plain.choices[0].text, 'string');
  assert.equal(plain.choices[0].finish_reason, 'length');
  assert.equal(plain.usage.completion_tokens, 8);
  assert.equal(plain.usage.total_tokens, plain.usage.prompt_tokens + 8);

  const stream = await client.completions.create({
    ...params,
    stream: true,
    stream_options: { include_usage: true },
  });
  let text = '';
  let finish = null;
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    assert.equal(chunk.object, 'text_completion');
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.text;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.ok(chunks >= 2, `only ${chunks} chunks`);
  assert.equal(finish, 'length');
  assert.equal(text, plain.choices[0].text, 'greedy: streamed text equals the plain one');
  assert.equal(usage.completion_tokens, 8);

  await assert.rejects(client.completions.create({ ...params, model: 'nope' }), (e) => {
    assert.ok(e instanceof OpenAI.NotFoundError, String(e));
    assert.equal(e.code, 'model_not_found');
    return true;
  });
  await assert.rejects(client.completions.create({ ...params, n: 2 }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError, String(e));
    assert.equal(e.param, 'n');
    return true;
  });
  // Completions with logprobs: one entry per token, 2 alternatives each.
  const lp = await client.completions.create({ ...params, logprobs: 2 });
  assert.equal(lp.choices[0].logprobs.tokens.length, 8);
  assert.equal(lp.choices[0].logprobs.token_logprobs.length, 8);
  for (const top of lp.choices[0].logprobs.top_logprobs) assert.equal(Object.keys(top).length, 2);
  assert.equal(lp.choices[0].text, plain.choices[0].text, 'logprobs do not change greedy text');

  await checkChat(client, untilReady);
  const curlChunks = checkCurl(serve.base);
  console.log(`openai client and curl checks passed (${chunks}, ${curlChunks} stream chunks)`);
} catch (e) {
  console.error(serve.log());
  throw e;
} finally {
  await serve.stop();
}

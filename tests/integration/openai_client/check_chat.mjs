// chat.completions.create through the official client: a random-weight
// model served with the real Qwen3 tokenizer and chat template ("chat"),
// plain and streamed, with logprobs, a server-kept session (Ballast's
// session_id extension), and a model without a template (a 400).
import assert from 'node:assert/strict';
import OpenAI from 'openai';

export async function checkChat(client, untilReady) {
  const messages = [
    { role: 'system', content: 'You are terse.' },
    { role: 'user', content: 'Name a colour.' },
  ];
  const params = { model: 'chat', messages, max_tokens: 6, temperature: 0, ignore_eos: true };
  const plain = await untilReady(() => client.chat.completions.create(params));
  assert.equal(plain.object, 'chat.completion');
  assert.match(plain.id, /^chatcmpl-/);
  assert.equal(plain.choices[0].message.role, 'assistant');
  assert.equal(typeof plain.choices[0].message.content, 'string');
  assert.equal(plain.choices[0].finish_reason, 'length');
  assert.equal(plain.usage.completion_tokens, 6);
  // Qwen3's template around the two messages: far more tokens than their text.
  assert.ok(plain.usage.prompt_tokens > 12, `prompt_tokens ${plain.usage.prompt_tokens}`);

  const stream = await client.chat.completions.create({
    ...params,
    stream: true,
    stream_options: { include_usage: true },
    logprobs: true,
    top_logprobs: 3,
  });
  let text = '';
  let role = null;
  let finish = null;
  let usage = null;
  let scored = 0;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (c.delta.role) role = c.delta.role;
      if (c.delta.content) text += c.delta.content;
      if (c.finish_reason) finish = c.finish_reason;
      for (const t of c.logprobs?.content ?? []) {
        assert.ok(t.logprob <= 0, `logprob ${t.logprob}`);
        assert.equal(t.top_logprobs.length, 3);
        assert.ok(t.top_logprobs[0].logprob >= t.logprob - 1e-5, 'greedy picks the top token');
        scored++;
      }
    }
  }
  assert.equal(role, 'assistant');
  assert.equal(finish, 'length');
  assert.equal(text, plain.choices[0].message.content, 'greedy: streamed text equals the plain one');
  assert.equal(scored, 6, 'one logprobs entry per generated token');
  assert.equal(usage.completion_tokens, 6);

  // A session kept by the server: the second turn sends only its message
  // and reuses the KV of the first.
  const session = { ...params, session_id: `s-${process.pid}` };
  const t1 = await client.chat.completions.create(session);
  const t2 = await client.chat.completions.create({
    ...session,
    messages: [{ role: 'user', content: 'Another one.' }],
  });
  assert.ok(t2.usage.prompt_tokens > t1.usage.prompt_tokens + 6, 'turn 2 renders turn 1 too');
  assert.ok(t2.usage.prompt_tokens_details.cached_tokens > 0, 'turn 2 reuses turn 1 KV');

  // Model 'a' has no chat template; a request the client cannot fix.
  await assert.rejects(
    client.chat.completions.create({ ...params, model: 'a' }),
    (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError, String(e));
      assert.match(e.message, /chat template/);
      return true;
    },
  );
  await assert.rejects(client.chat.completions.create({ ...params, tools: [{}] }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError, String(e));
    assert.equal(e.param, 'tools');
    return true;
  });
}

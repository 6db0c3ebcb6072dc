// The gateway as curl users meet it (README's commands): a plain
// completion, a streamed chat completion read with `curl -N`, and an error
// body. curl comes from Debian (deploy/install-deps.sh).
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';

function curl(base, path, body, extra = []) {
  const args = ['-sS', ...extra, `${base}${path}`];
  if (body) args.push('-H', 'Content-Type: application/json', '-d', JSON.stringify(body));
  return execFileSync('curl', args, { encoding: 'utf8' });
}

export function checkCurl(base) {
  const plain = JSON.parse(
    curl(base, '/v1/completions', { model: 'a', prompt: 'Once', max_tokens: 4, temperature: 0 }),
  );
  assert.equal(plain.object, 'text_completion');
  assert.equal(plain.usage.completion_tokens, 4);

  const sse = curl(
    base,
    '/v1/chat/completions',
    {
      model: 'chat',
      messages: [{ role: 'user', content: 'Hello!' }],
      max_tokens: 5,
      temperature: 0,
      ignore_eos: true,
      stream: true,
    },
    ['-N'],
  );
  const events = sse.split('\n\n').filter((e) => e.length > 0);
  assert.equal(events.at(-1), 'data: [DONE]', sse);
  const chunks = events.slice(0, -1).map((e) => {
    assert.ok(e.startsWith('data: '), e);
    return JSON.parse(e.slice(6));
  });
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  assert.equal(chunks.at(-1).choices[0].finish_reason, 'length');
  for (const c of chunks) assert.equal(c.object, 'chat.completion.chunk');

  const err = JSON.parse(curl(base, '/v1/completions', { model: 'nope', prompt: 'x' }));
  assert.equal(err.error.code, 'model_not_found');
  return chunks.length;
}

// Load measurement (not a test): N concurrent SSE streams on loopback
// against the gateway of `ballast serve` with two tiny models. Prints one
// JSON line: streams completed, errors, wall time, time to first chunk, and
// the serve process's thread count (peak, and by thread name at the peak).
// Usage: node load.mjs path/to/ballast [streams=1000] [max_tokens=16]
import http from 'node:http';
import { readFileSync, readdirSync } from 'node:fs';
import { startServe, untilReady } from './serve.mjs';

const [bin, streamsArg = '1000', tokensArg = '16'] = process.argv.slice(2);
const N = Number(streamsArg);
const maxTokens = Number(tokensArg);
const serve = await startServe(bin, { models: ['a', 'b'], maxSeqs: 64 });
const url = new URL(serve.base);

const threads = () => Number(/Threads:\s+(\d+)/.exec(readFileSync(`/proc/${serve.pid}/status`, 'utf8'))[1]);
const byName = () => {
  const h = {};
  for (const t of readdirSync(`/proc/${serve.pid}/task`)) {
    try {
      const n = readFileSync(`/proc/${serve.pid}/task/${t}/comm`, 'utf8').trim();
      h[n] = (h[n] || 0) + 1;
    } catch {}
  }
  return h;
};

function stream(i) {
  const body = JSON.stringify({
    model: i % 2 ? 'b' : 'a', prompt: `stream ${i}`, max_tokens: maxTokens, temperature: 0,
    ignore_eos: true, stream: true,
  });
  return new Promise((resolve) => {
    const t0 = performance.now();
    let first = -1;
    const req = http.request(
      { host: url.hostname, port: url.port, path: '/v1/completions', method: 'POST', agent: false,
        headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } },
      (res) => {
        let data = '';
        res.setEncoding('utf8');
        res.on('data', (d) => {
          if (first < 0) first = performance.now() - t0;
          data += d;
        });
        res.on('end', () => resolve({ ok: res.statusCode === 200 && data.endsWith('data: [DONE]\n\n'),
                                      status: res.statusCode, first, chunks: data.split('\n\n').length - 2 }));
        res.on('error', () => resolve({ ok: false, status: 'reset', first }));
      },
    );
    req.on('error', (e) => resolve({ ok: false, status: e.code, first }));
    req.end(body);
  });
}

try {
  const ping = (model) => fetch(`${serve.base}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model, prompt: 'x', max_tokens: 1 }),
  }).then((r) => { if (r.status !== 200) throw new Error(`status ${r.status}`); });
  await untilReady(() => ping('a'));
  await untilReady(() => ping('b'));
  const idle = threads();
  let peak = idle;
  let peakNames = {};
  let lastNames = 0;
  const sampler = setInterval(() => {
    const n = threads();
    if (n > peak) {
      peak = n;
      if (performance.now() - lastNames > 500) {
        peakNames = byName();
        lastNames = performance.now();
      }
    }
  }, 20);
  const t0 = performance.now();
  const results = await Promise.all(Array.from({ length: N }, (_, i) => stream(i)));
  const wall = (performance.now() - t0) / 1000;
  clearInterval(sampler);
  const firsts = results.filter((r) => r.first >= 0).map((r) => r.first).sort((a, b) => a - b);
  const pct = (p) => (firsts.length ? Math.round(firsts[Math.min(firsts.length - 1, Math.floor(p * firsts.length))]) : null);
  const errors = {};
  for (const r of results) if (!r.ok) errors[r.status] = (errors[r.status] || 0) + 1;
  console.log(JSON.stringify({
    streams: N, max_tokens: maxTokens, completed: results.filter((r) => r.ok).length, errors,
    wall_s: Number(wall.toFixed(2)), first_chunk_ms: { p50: pct(0.5), p99: pct(0.99), max: pct(1) },
    threads: { idle, peak, after: threads(), at_peak_by_name: peakNames },
  }));
} finally {
  await serve.stop();
}

// Starts `ballast serve` on free loopback ports (gRPC and the HTTP gateway
// on port 0) with tiny synthetic models, and resolves once the gateway has
// logged its address. Shared by check.mjs and load.mjs.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

// A model is a name, or {name, tokenizer}: a synthetic model served with a
// real tokenizer directory (its chat template, special tokens and EOS).
const MODEL = (m, arch, seed) => {
  const { name, tokenizer } = typeof m === 'string' ? { name: m } : m;
  return (
    `    - {name: ${name}, architecture: ${arch}, layers: 2, hidden: 64, heads: 4, kv_heads: 2,` +
    ` intermediate: 128, max_position: 4096, seed: ${seed}` +
    (tokenizer ? `, tokenizer: "${tokenizer}"` : '') +
    '}\n'
  );
};

export async function startServe(bin, { models = ['a'], maxSeqs = 64, logLevel = 'info' } = {}) {
  const dir = mkdtempSync(join(tmpdir(), 'ballast-openai-'));
  const config = join(dir, 'serve.yaml');
  writeFileSync(
    config,
    `log_level: ${logLevel}\n` +
      'scheduler: {listen: 127.0.0.1:0, metrics_listen: "", slo: {ttft_ms: 600000, tpot_ms: 60000}}\n' +
      'node:\n  node_id: gw\n  listen: 127.0.0.1:0\n  metrics_listen: ""\n' +
      `  engine: {block_tokens: 16, kv_cache_mib: 64, max_batch_tokens: 256, max_seqs: ${maxSeqs}}\n` +
      `serve:\n  cache_dir: ${join(dir, 'cache')}\n  models:\n` +
      models.map((m, i) => MODEL(m, i % 2 ? 'qwen2' : 'llama', i + 1)).join(''),
  );
  const proc = spawn(
    bin,
    ['serve', '--config', config, '--listen', '127.0.0.1:0', '--http-listen', '127.0.0.1:0'],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let log = '';
  const base = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`gateway not up in 60 s\n${log}`)), 60000);
    const onData = (d) => {
      log += d;
      const m = log.match(/gateway on (http:\/\/[0-9.]+:[0-9]+)/);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]);
      }
    };
    proc.stdout.on('data', onData);
    proc.stderr.on('data', onData);
    proc.on('exit', (code) => reject(new Error(`ballast serve exited (${code})\n${log}`)));
  });
  const stop = async () => {
    if (proc.exitCode === null) {
      const exited = new Promise((r) => proc.once('exit', r));
      proc.kill('SIGTERM');
      await exited;
    }
    rmSync(dir, { recursive: true, force: true });
  };
  return { base, pid: proc.pid, stop, log: () => log };
}

// Retries `fn` until it resolves (the models load after the gateway is up).
export async function untilReady(fn, ms = 60000) {
  const end = Date.now() + ms;
  for (;;) {
    try {
      return await fn();
    } catch (e) {
      if (Date.now() > end) throw e;
      await new Promise((r) => setTimeout(r, 200));
    }
  }
}

#!/usr/bin/env python3
"""How fast an offline run could go: bounds on its wall time from the bytes
and FLOPs its steps must move, against what its steps took.

An offline run (deploy/gpu-host/offline-bench.sh: every request released
at t = 0, one model) is a sequence of steps. Each step reads the weights
once, reads its decodes' KV and multiplies its tokens through the layers.
For each step this computes two times, from a model's shape and the
card's rates:

- roofline: max(bytes / bandwidth, FLOPs / GEMM rate), the step's time if
  its reads and its arithmetic overlapped perfectly;
- serial: max(weight bytes / bandwidth, GEMM FLOPs / GEMM rate) + KV bytes
  / bandwidth + attention FLOPs / GEMM rate: the products (bound by the
  weights' read at small batches and by the tensor cores at large ones)
  and then the attention (bound by the KV's read), one after the other,
  as an engine that runs a step's kernels in order does at best.

With --steps (a CSV of the run's steps: scripts/step-log.py's output for a
node's log, or `ballast simulate --step-log`'s steps-*.csv) it sums both
bounds and the measured time over the steps, in bands of decode batch
size, so the share of the bound each band reaches says where the run
loses time. Without it, it makes the steps of an ideal schedule from the
trace: every prompt prefilled first (at the GEMM rate), then one decode
step per output token with every request still decoding in it.

Rates are what the card reaches, not its datasheet's, where known:
`ballast bench-engine` reports both (`copy_bytes_per_s`,
`gemm_peak_random_tflops`); pass them with --bandwidth and --gemm-tflops.
FLOPs count the products' multiply-adds (2 per parameter and token: the
layers for every token, the LM head for the sampled rows only) and the
attention's (4 per query head, head dimension and key); the embedding
lookup and norms are left out.

Usage: scripts/offline-bound.py TRACE.jsonl [--steps STEPS.csv]
       [--bandwidth TB/s] [--gemm-tflops TFLOP/s] [--config config.json]
       [--weight-bytes 2] [--kv-bytes 2]
"""
import argparse
import collections
import csv
import json
import sys

# Llama-3-8B's shape (the offline benchmark's model).
LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                 tie_word_embeddings=False)
BANDS = [(1, 16), (17, 64), (65, 192), (193, 512), (513, 100000)]


class Shape:
    def __init__(self, c, weight_bytes, kv_bytes):
        h, i, n = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
        heads, kvh = c["num_attention_heads"], c["num_key_value_heads"]
        hd = c.get("head_dim") or h // heads
        q, kv = heads * hd, kvh * hd
        self.layer_params = n * (h * (q + 2 * kv) + q * h + 3 * h * i)
        self.head_params = c["vocab_size"] * h
        self.weight_bytes = (self.layer_params + self.head_params) * weight_bytes
        self.kv_token_bytes = n * 2 * kv * kv_bytes
        self.attn_flops_per_pair = 4 * n * heads * hd


def step_bounds(shape, bw, peak, decodes, context, prefill, pairs, prompts_done):
    """(roofline, serial) seconds of one step."""
    gemm = 2 * shape.layer_params * (decodes + prefill) + 2 * shape.head_params * (
        decodes + prompts_done)
    attn = shape.attn_flops_per_pair * (context + pairs)
    kv_read = context * shape.kv_token_bytes
    kv_write = (decodes + prefill) * shape.kv_token_bytes
    roof = max((shape.weight_bytes + kv_read + kv_write) / bw, (gemm + attn) / peak)
    serial = max(shape.weight_bytes / bw, gemm / peak) + (kv_read + kv_write) / bw + attn / peak
    return roof, serial


def read_trace(path):
    reqs = []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("type", "request") == "request":
                reqs.append((int(r["prompt_tokens"]), int(r["output_tokens"])))
    if not reqs:
        sys.exit("no requests in %s" % path)
    return reqs


def ideal_steps(reqs):
    """The ideal schedule's steps: (decodes, context, prefill, pairs,
    prompts done, measured=None); every prompt in one prefill step, which
    reads the weights once."""
    steps = [(0, 0, sum(p for p, _ in reqs), sum(p * (p + 1) // 2 for p, _ in reqs), len(reqs),
              None)]
    longest = max(o for _, o in reqs)
    for t in range(1, longest):  # the first token comes with the prompt
        live = [(p, o) for p, o in reqs if o > t]
        steps.append((len(live), sum(p + t for p, _ in live), 0, 0, 0, None))
    return steps


def read_steps(path):
    steps = []
    with open(path) as f:
        for r in csv.DictReader(f):
            if "ms" in r:
                ms = float(r["ms"])
                if ms < 0:
                    ms = None
            else:
                ms = (float(r["end_s"]) - float(r["start_s"])) * 1e3
            # The simulator writes a run of n decode steps as one row: the
            # first step's work, each later one attending one more key a
            # decode.
            n = int(r.get("steps") or 1)
            d, c = int(r["decode_tokens"]), int(float(r["decode_context"]))
            for j in range(n):
                steps.append((d, c + j * d, int(r["prefill_tokens"]),
                              int(float(r["prefill_attention"])), int(r["prefill_logits"]),
                              None if ms is None else ms / n))
    if not steps:
        sys.exit("no steps in %s" % path)
    return steps


def summarize(steps, shape, bw, peak):
    """Per band (decode-only steps by batch size, and the steps with
    prefill): steps, roofline s, serial s, and over the measured steps
    only: measured s, their roofline s and serial s."""
    names = ["decode only, %d-%d sequences" % b for b in BANDS] + ["prefill"]
    bands = collections.OrderedDict(
        (name, dict(steps=0, roofline_s=0.0, serial_s=0.0, measured_steps=0, measured_s=0.0,
                    measured_roofline_s=0.0, measured_serial_s=0.0)) for name in names)
    for d, c, p, a, done, ms in steps:
        roof, serial = step_bounds(shape, bw, peak, d, c, p, a, done)
        if p > 0:
            name = "prefill"
        else:
            name = next("decode only, %d-%d sequences" % b for b in BANDS if d <= b[1])
        row = bands[name]
        row["steps"] += 1
        row["roofline_s"] += roof
        row["serial_s"] += serial
        if ms is not None:
            row["measured_steps"] += 1
            row["measured_s"] += ms / 1e3
            row["measured_roofline_s"] += roof
            row["measured_serial_s"] += serial
    total = {k: sum(row[k] for row in bands.values()) for k in next(iter(bands.values()))}
    return bands, total


def report(bands, total, output_tokens):
    measured = total["measured_steps"] > 0
    print("| steps | count | roofline s | serial s |" + (" measured s | serial / measured |"
                                                          if measured else ""))
    print("|---|---:|---:|---:|" + ("---:|---:|" if measured else ""))
    for name, row in bands.items():
        if row["steps"] == 0:
            continue
        line = "| %s | %d | %.2f | %.2f |" % (name, row["steps"], row["roofline_s"],
                                              row["serial_s"])
        if measured:
            share = row["measured_serial_s"] / row["measured_s"] if row["measured_s"] else 0.0
            line += " %.2f | %.0f%% |" % (row["measured_s"], 100 * share)
        print(line)
    print()
    print("whole run: roofline %.2f s (%.0f output tok/s), serial %.2f s (%.0f output tok/s)" %
          (total["roofline_s"], output_tokens / total["roofline_s"], total["serial_s"],
           output_tokens / total["serial_s"]))
    if measured:
        print("measured: %.2f s over the %d measured steps (%d not measured: see step-log.py)" %
              (total["measured_s"], total["measured_steps"],
               total["steps"] - total["measured_steps"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--steps", help="the run's steps (step-log.py or simulate --step-log CSV)")
    ap.add_argument("--bandwidth", type=float, default=3.55, help="TB/s (H200's copy rate)")
    ap.add_argument("--gemm-tflops", type=float, default=807.0,
                    help="TFLOP/s (H200's cuBLASLt 8192^3 BF16 on random data)")
    ap.add_argument("--config", help="the model's config.json (default: Llama-3-8B)")
    ap.add_argument("--weight-bytes", type=int, default=2)
    ap.add_argument("--kv-bytes", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="the sums as JSON, not a table")
    a = ap.parse_args()
    config = LLAMA3_8B
    if a.config:
        with open(a.config) as f:
            config = json.load(f)
    shape = Shape(config, a.weight_bytes, a.kv_bytes)
    reqs = read_trace(a.trace)
    output_tokens = sum(o for _, o in reqs)
    steps = read_steps(a.steps) if a.steps else ideal_steps(reqs)
    bands, total = summarize(steps, shape, a.bandwidth * 1e12, a.gemm_tflops * 1e12)
    if a.json:
        print(json.dumps(dict(requests=len(reqs), output_tokens=output_tokens, bands=bands,
                              total=total)))
        return
    print("%d requests, %d output tokens; weights %.2f GB a step, KV %d KiB a token; "
          "%.2f TB/s, %.0f TFLOP/s" % (len(reqs), output_tokens, shape.weight_bytes / 1e9,
                                         shape.kv_token_bytes // 1024, a.bandwidth,
                                         a.gemm_tflops))
    print()
    report(bands, total, output_tokens)

if __name__ == "__main__":
    main()

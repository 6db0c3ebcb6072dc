#!/usr/bin/env python3
"""Hugging Face transformers' speed on the same weights `ballast bench-engine`
times, for the side-by-side table in docs/benchmarks.md. Runs on the GPU host.

  --create DIR   first writes a Llama-3-8B-shaped checkpoint with random BF16
                 weights (seeded) to DIR (safetensors + config.json)
  then loads DIR with LlamaForCausalLM (BF16, sdpa) and times
    decode: one token per sequence per step at each batch size, with a
            StaticCache of context + steps positions (the cache's contents do
            not change the work; no prefill is run for decode), greedy argmax;
    prefill: one prompt of --prefill tokens, logits of the last token only.
Writes JSON: {"decode": [{"batch", "ms_per_step"}], "prefill": {"tokens", "ms"}}.
"""
import argparse
import json
import time

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM


def create(path, seed):
    cfg = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                      max_position_embeddings=8192, rope_theta=500000.0,
                      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 8192},
                      rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=128000,
                      eos_token_id=128001)
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(path, safe_serialization=True, max_shard_size="20GB")
    del model
    torch.cuda.empty_cache()


def make_cache(model, batch, length):
    from transformers import StaticCache
    try:
        return StaticCache(config=model.config, max_cache_len=length)
    except TypeError:
        return StaticCache(config=model.config, max_batch_size=batch, max_cache_len=length,
                           device="cuda", dtype=torch.bfloat16)


@torch.inference_mode()
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--create", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batches", default="1,16,64,256")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.create:
        t = time.time()
        create(a.model, a.seed)
        print(f"created {a.model} in {time.time() - t:.1f} s", flush=True)
    t = time.time()
    model = LlamaForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16,
                                             attn_implementation="sdpa").cuda().eval()
    print(f"transformers {transformers.__version__}: loaded in {time.time() - t:.1f} s", flush=True)
    out = {"transformers": transformers.__version__, "torch": torch.__version__,
           "device": torch.cuda.get_device_name(), "decode": []}
    for b in [int(x) for x in a.batches.split(",")]:
        length = a.context + a.warmup + a.steps + 1
        cache = make_cache(model, b, length)
        tok = torch.ones((b, 1), dtype=torch.long, device="cuda")
        for i in range(a.warmup + a.steps):
            if i == a.warmup:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
            pos = torch.tensor([a.context + i], device="cuda")
            logits = model(input_ids=tok, past_key_values=cache, cache_position=pos,
                           position_ids=pos.expand(b, 1), use_cache=True).logits
            tok = logits[:, -1].argmax(-1, keepdim=True)
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3 / a.steps
        out["decode"].append({"batch": b, "ms_per_step": ms})
        print(f"decode batch {b}: {ms:.2f} ms/step", flush=True)
        del cache
        torch.cuda.empty_cache()
    if a.prefill > 0:
        ids = (torch.arange(a.prefill, device="cuda") * 7919 + 13) % model.config.vocab_size
        ids = ids.unsqueeze(0)
        times = []
        for r in range(4):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model(input_ids=ids, use_cache=False, logits_to_keep=1)
            torch.cuda.synchronize()
            if r > 0:
                times.append(time.perf_counter() - t0)
        ms = sum(times) / len(times) * 1e3
        out["prefill"] = {"tokens": a.prefill, "ms": ms}
        print(f"prefill {a.prefill}: {ms:.1f} ms", flush=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Produces the golden logits the CPU engine is checked against.

For each model directory under tests/data/golden/ (written by
`ballast make-model`, see tests/data/golden/README.md), loads the checkpoint
with Hugging Face transformers in float32 (TF32 off), and writes
golden.json beside it:
  tokens  - the prompt: BOS then the UTF-8 bytes of PROMPT
  logits  - logits of every prompt position, [len(tokens)][vocab]
  greedy  - 64 greedy tokens continuing the prompt (EOS does not stop it)
Run on the GPU host: python3 tests/gpu/make_golden.py tests/data/golden
"""
import json
import pathlib
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM

PROMPT = ("The quick brown fox jumps over the lazy dog. Ballast keeps many models "
          "resident on few GPUs; every one of them streams tokens!")
GREEDY_STEPS = 64


def main(root: str) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for model_dir in sorted(p for p in pathlib.Path(root).iterdir() if (p / "config.json").exists()):
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation="eager").to(device).eval()
        cfg = json.loads((model_dir / "config.json").read_text())
        tokens = [cfg["bos_token_id"]] + list(PROMPT.encode("utf-8"))
        with torch.no_grad():
            ids = torch.tensor([tokens], device=device)
            logits = model(ids).logits[0].float().cpu()
            seq = list(tokens)
            greedy = []
            for _ in range(GREEDY_STEPS):
                out = model(torch.tensor([seq], device=device)).logits[0, -1]
                nxt = int(torch.argmax(out).item())
                greedy.append(nxt)
                seq.append(nxt)
        golden = {
            "model": model_dir.name,
            "architecture": type(model).__name__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "tokens": tokens,
            "logits": [[round(float(x), 6) for x in row] for row in logits],
            "greedy": greedy,
        }
        (model_dir / "golden.json").write_text(json.dumps(golden) + "\n")
        print(f"{model_dir.name}: {type(model).__name__}, {len(tokens)} tokens, "
              f"vocab {logits.shape[1]}, greedy[:8]={greedy[:8]}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/golden")

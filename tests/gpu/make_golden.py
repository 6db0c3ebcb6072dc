#!/usr/bin/env python3
"""Produces the golden logits the CPU engine is checked against.

For each model directory under tests/data/golden/ (written by
`ballast make-model`, see tests/data/golden/README.md), loads the checkpoint
with Hugging Face transformers in float32 (TF32 off), and writes
golden.json beside it:
  tokens  - the prompt: BOS then the UTF-8 bytes of PROMPT
  logits  - logits of every prompt position, [len(tokens)][vocab]; above
            MAX_LOGITS numbers, of every k-th position and the last only,
            listed in logit_positions (keeps large vocabularies small)
  greedy  - 64 greedy tokens continuing the prompt (EOS does not stop it)
Run on the GPU host: python3 tests/gpu/make_golden.py tests/data/golden [MODEL...]
(only the named model directories when any are given).

With --fp8 first, the linear layers (q/k/v/o, gate/up/down) compute as
Ballast's `quantization: fp8` does: their weights are replaced by their FP8
values (per output row: scale = max|row| / 448, or 1 for a zero row;
w = e4m3(w / scale) * scale, torch's float8_e4m3fn rounding) and a forward
pre-hook rounds each input the same way, one scale per token. The result
goes to golden-fp8.json.
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
MAX_LOGITS = 40000


def positions_to_keep(n: int, vocab: int) -> list:
    stride = max(1, -(-n * vocab // MAX_LOGITS))
    keep = list(range(0, n, stride))
    if keep[-1] != n - 1:
        keep.append(n - 1)
    return keep


LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def round_rows_to_fp8(w: torch.Tensor) -> torch.Tensor:
    """Each row (last dimension) as scale * e4m3(row / scale), scale = max|row| / 448."""
    w = w.float()
    scale = w.abs().amax(dim=-1, keepdim=True) / 448.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return (w / scale).to(torch.float8_e4m3fn).float() * scale


def round_linear_to_fp8(model) -> int:
    n = 0
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name.split(".")[-1] in LINEAR:
            module.weight.data.copy_(round_rows_to_fp8(module.weight.data))
            module.register_forward_pre_hook(lambda _m, args: (round_rows_to_fp8(args[0]),))
            n += 1
    return n


def main(root: str, only: list, fp8: bool = False) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dirs = sorted(p for p in pathlib.Path(root).iterdir() if (p / "config.json").exists())
    for model_dir in (d for d in dirs if not only or d.name in only):
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation="eager").to(device).eval()
        if fp8:
            assert round_linear_to_fp8(model) > 0
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
        keep = positions_to_keep(logits.shape[0], logits.shape[1])
        golden = {
            "model": model_dir.name,
            "architecture": type(model).__name__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "tokens": tokens,
            "logits": [[round(float(x), 6) for x in logits[i]] for i in keep],
            "greedy": greedy,
        }
        if len(keep) < logits.shape[0]:
            golden["logit_positions"] = keep
        if fp8:
            golden["quantization"] = "fp8"
        out = "golden-fp8.json" if fp8 else "golden.json"
        (model_dir / out).write_text(json.dumps(golden) + "\n")
        print(f"{model_dir.name}: {type(model).__name__}, {len(tokens)} tokens, "
              f"vocab {logits.shape[1]}, greedy[:8]={greedy[:8]}")


if __name__ == "__main__":
    args = sys.argv[1:]
    fp8 = bool(args) and args[0] == "--fp8"
    if fp8:
        args = args[1:]
    main(args[0] if args else "tests/data/golden", args[1:], fp8)

#!/usr/bin/env python3
"""Builds configs/sim/calibration-<card>.json from the output of
deploy/gpu-host/sim-calibrate.sh (calib-<shape>.jsonl: one `ballast
bench-engine` JSON per line, in the script's run order: contexts 256, 1024,
4096 with prefills 512, 2048, 8192, then for 8b one FP8-KV run at 1024),
calib-<shape>-large.jsonl where present (decode steps of 512 and 1,024
sequences, decode only: RUNS_LARGE), calib-<shape>-prompts.jsonl where
present (prefill steps of many short prompts), calib-<shape>-mixed.jsonl
where present (chunked prefill: a chunk over a prefix, alone and beside
decodes), calib-<shape>-buckets.jsonl where present (decode steps at the
CUDA graphs' row buckets between powers of two, spread contexts), and calib-<shape>-concurrent.jsonl
where present (decode steps of 2 or 4 copies at once, context 1024: the
"concurrent" points), and with --with-small calib-<shape>-small.jsonl
(short chunks of 48-504 tokens, alone and beside 8 or 16 decodes, read as
the mixed ones).

Usage: scripts/sim-calibration.py --dir DIR --date YYYY-MM-DD --memory-gib G
           --h2d-gbps R --activation-ratio X --out configs/sim/calibration-h200.json
           [--kv-tiers-from FILE] [--with-small [--small-date YYYY-MM-DD]]

The session KV tiers' load rates ("kv_tiers": DRAM, SSD and peer, with their
source) are not measured by sim-calibrate.sh: they are kept from the file
being replaced (--out), or taken from --kv-tiers-from.
"""
import argparse
import itertools
import json
import os

SHAPES = {  # as sim-calibrate.sh makes them (sim::NamedShape's values)
    "llama-1b": dict(layers=16, hidden=2048, heads=32, kv_heads=8, head_dim=64,
                     intermediate=8192, vocab=128256, tied_embeddings=True),
    "llama-3b": dict(layers=28, hidden=3072, heads=24, kv_heads=8, head_dim=128,
                     intermediate=8192, vocab=128256, tied_embeddings=True),
    "llama-8b": dict(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128,
                     intermediate=14336, vocab=128256, tied_embeddings=False),
}
RUNS = [(256, 512, 2), (1024, 2048, 2), (4096, 8192, 2), (1024, 2048, 1)]  # ctx, prefill, kv bytes
RUNS_LARGE = [(256, 0, 2), (1024, 0, 2)]  # calib-<shape>-large.jsonl
WARMUP, STEPS = 3, 16  # sim-calibrate.sh's --warmup / --steps


def read_points(path, order, name, points):
    """Appends the steps of one calib-*.jsonl (its runs in `order`) to
    `points`; returns the device's name."""
    device = None
    with open(path) as f:
        runs = [json.loads(line) for line in f if line.strip()]
    for i, run in enumerate(runs):
        ctx, prefill, kv_bytes = order[i]
        device = device or run["device"]
        mean_ctx = ctx + WARMUP + STEPS / 2
        for d in run["decode"]:
            b = d["batch"]
            points.append(dict(shape=name, kv_dtype_bytes=kv_bytes, decode_tokens=b,
                               decode_context=b * mean_ctx, ms=round(d["ms_per_step"], 4)))
        p = run.get("prefill")
        if p:
            t = p["tokens"]
            assert t == prefill, (path, i, t)
            points.append(dict(shape=name, kv_dtype_bytes=kv_bytes, prefill_tokens=t,
                               prefill_attention=t * (t + 1) / 2, ms=round(p["ms"], 4)))
    return device


MIXED_CONTEXT = 256  # sim-calibrate.sh's --context of the --mixed runs


def chunk_point(name, c):
    """A prefill chunk [c, 2c) of one prompt: attention over its c-token
    prefix (sim::PrefillAttentionPairs(c, c)), its last token sampled."""
    return dict(shape=name, kv_dtype_bytes=2, prefill_tokens=c,
                prefill_attention=c * (c + (c + 1) / 2))


def optional_runs(directory, kind):
    """(shape name, bench-engine JSON) for each line of every
    calib-<shape>-<kind>.jsonl in `directory` (shapes without one skipped)."""
    for short, name in (("1b", "llama-1b"), ("3b", "llama-3b"), ("8b", "llama-8b")):
        path = os.path.join(directory, f"calib-{short}-{kind}.jsonl")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            for line in f:
                if line.strip():
                    yield name, json.loads(line)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--date", required=True)
    ap.add_argument("--memory-gib", type=float, required=True)
    ap.add_argument("--h2d-gbps", type=float, required=True)
    ap.add_argument("--activation-ratio", type=float, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--with-small", action="store_true",
                    help="fit the short chunks of calib-<shape>-small.jsonl too (the committed "
                    "H200 file is made with them: docs/benchmarks.md, session 55)")
    ap.add_argument("--small-date", help="when the short chunks (calib-<shape>-small.jsonl) "
                    "were measured, where that differs from --date")
    ap.add_argument("--kv-tiers-from", help="a calibration JSON whose kv_tiers to keep "
                    "(default: --out, if it exists)")
    a = ap.parse_args()
    kv_tiers = None
    src = a.kv_tiers_from or (a.out if os.path.exists(a.out) else None)
    if src:
        with open(src) as f:
            kv_tiers = json.load(f).get("kv_tiers")
        if a.kv_tiers_from and kv_tiers is None:
            raise SystemExit(f"{src}: no kv_tiers block")
    points, device, large = [], None, False
    for short, name in (("1b", "llama-1b"), ("3b", "llama-3b"), ("8b", "llama-8b")):
        for suffix, order in (("", RUNS), ("-large", RUNS_LARGE)):
            path = os.path.join(a.dir, f"calib-{short}{suffix}.jsonl")
            if suffix and not os.path.exists(path):
                continue
            device = read_points(path, order, name, points) or device
            large |= bool(suffix)
    # Prefill steps of many short prompts (calib-<shape>-prompts.jsonl):
    # their prefill only, attention as the sum of the prompts' pairs.
    for name, run in optional_runs(a.dir, "prompts"):
        p = run["prefill"]
        points.append(dict(shape=name, kv_dtype_bytes=2, prefill_tokens=p["tokens"],
                           prefill_attention=p["attention_pairs"],
                           prompts=p["prompts"], ms=round(p["ms"], 4)))
    # Chunked prefill (calib-<shape>-mixed.jsonl, bench-engine --mixed at
    # context 256): each row's chunk [C, 2C) of a prompt alone (attention
    # over its C-token prefix) and beside its decodes in one step.
    # A chunk alone is timed once per row: its mean is one point. Mixed
    # steps are kept where their rows (B + C) are a multiple of 128, as a
    # node's steps filled to max_batch_tokens are: a step just past a
    # multiple runs its GEMMs on one more row tile (or wave) than its
    # tokens need (measured: 8B 32 + 2,048 as slow as 256 + 2,048; 1B 32
    # + 2,048 slower than its parts apart), which the model, linear in
    # FLOPs, does not represent (docs/benchmarks.md, session 40).
    # Short chunks (calib-<shape>-small.jsonl, SMALL_ONLY=1), with
    # --with-small, are read the same way.
    small_runs = list(optional_runs(a.dir, "small")) if a.with_small else []
    for name, run in itertools.chain(optional_runs(a.dir, "mixed"), small_runs):
        alone = {}
        for r in run["mixed"]:
            b, c = r["batch"], r["chunk"]
            alone.setdefault(c, []).append(r["chunk_ms"])
            if (b + c) % 128 == 0:
                points.append(dict(chunk_point(name, c), decode_tokens=b,
                                   decode_context=b * (MIXED_CONTEXT + 1.0),
                                   ms=round(r["mixed_ms"], 4)))
        for c, ms in sorted(alone.items()):
            points.append(dict(chunk_point(name, c), ms=round(sum(ms) / len(ms), 4)))
    # Decode steps at the graph buckets between powers of two
    # (calib-<shape>-buckets.jsonl, spread contexts): each entry's own mean
    # context.
    buckets = False
    for name, run in optional_runs(a.dir, "buckets"):
        buckets = True
        for d in run["decode"]:
            b = d["batch"]
            points.append(dict(shape=name, kv_dtype_bytes=2, decode_tokens=b,
                               decode_context=round(b * d["mean_context"], 1),
                               ms=round(d["ms_per_step"], 4)))
    # Several copies stepping at once (calib-<shape>-concurrent.jsonl, one
    # run per copy count, context 1024): each copy's step time against one
    # copy's alone in the same run (the engine model's concurrent overlap).
    concurrent = []
    for name, run in optional_runs(a.dir, "concurrent"):
        alone = {d["batch"]: d["ms_per_step"] for d in run["decode"]}
        mean_ctx = 1024 + WARMUP + STEPS / 2
        for d in run["concurrent"]["decode"]:
            b = d["batch"]
            concurrent.append(dict(shape=name, copies=run["concurrent"]["models"],
                                   decode_tokens=b, decode_context=b * mean_ctx,
                                   ms=round(d["ms_per_step"], 4),
                                   ms_alone=round(alone[b], 4)))
    out = dict(
        device=device, date=a.date,
        command=("deploy/gpu-host/sim-calibrate.sh OUT (ballast bench-engine, CUDA graphs, "
                 "static KV pool, 16-token blocks, random BF16 weights); "
                 + ("the 512- and 1,024-sequence steps from calib-<shape>-large.jsonl; "
                    if large else "")
                 + ("decode steps at the graph buckets from calib-<shape>-buckets.jsonl; "
                    if buckets else "")
                 + ("short chunks from calib-<shape>-small.jsonl (SMALL_ONLY=1%s); "
                    % (", " + a.small_date if a.small_date else "") if small_runs else "")
                 + "scripts/sim-calibration.py"),
        memory_bytes=int(a.memory_gib * (1 << 30)), h2d_bytes_per_s=a.h2d_gbps * 1e9,
        activation_ratio=a.activation_ratio)
    if kv_tiers is not None:
        out["kv_tiers"] = kv_tiers
    out.update(shapes=SHAPES, points=points)
    if concurrent:
        out["concurrent"] = concurrent
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"{a.out}: {len(points)} points and {len(concurrent)} concurrent from {device}")


if __name__ == "__main__":
    main()

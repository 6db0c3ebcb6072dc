#!/usr/bin/env python3
"""scripts/sim-calibration.py against the committed calibrations: the raw
bench-engine runs in configs/sim/raw-<card> rebuild
configs/sim/calibration-<card>.json exactly for the H200 and the H100
(with --with-small, as they were made), and without --with-small the short chunks of
calib-<shape>-small.jsonl (alone and beside their decodes) are left out
and the command does not name them, every other point as it was.

Usage (ctest runs it): sim_calibration_test.py SOURCE_DIR
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SOURCE = None


class SimCalibration(unittest.TestCase):
    def build(self, *extra, card="h200"):
        committed = os.path.join(SOURCE, f"configs/sim/calibration-{card}.json")
        with open(committed) as f:
            c = json.load(f)
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "calibration.json")
            subprocess.run([sys.executable, os.path.join(SOURCE, "scripts/sim-calibration.py"),
                            "--dir", os.path.join(SOURCE, f"configs/sim/raw-{card}"), "--date",
                            c["date"], "--memory-gib", repr(c["memory_bytes"] / (1 << 30)),
                            "--h2d-gbps", repr(c["h2d_bytes_per_s"] / 1e9),
                            "--activation-ratio", repr(c["activation_ratio"]),
                            "--kv-tiers-from", committed, "--out", out] + list(extra),
                           check=True, capture_output=True)
            with open(out) as f:
                text = f.read()
        with open(committed) as f:
            return text, f.read()

    def test_the_raw_runs_rebuild_the_committed_file(self):
        built, committed = self.build("--with-small", "--small-date", "2026-12-04")
        self.assertEqual(built, committed)

    def test_the_h100_raw_runs_rebuild_its_committed_file(self):
        # Made in one session (2026-12-05): the short chunks share its date.
        built, committed = self.build("--with-small", card="h100")
        self.assertEqual(built, committed)
        self.assertIn("NVIDIA H100", json.loads(built)["device"])

    def test_short_chunks_are_left_out_without_their_flag(self):
        built, committed = self.build()
        built, committed = json.loads(built), json.loads(committed)
        self.assertIn("short chunks from calib-<shape>-small.jsonl (SMALL_ONLY=1, 2026-12-04)",
                      committed["command"])
        self.assertNotIn("short chunks", built["command"])
        key = lambda p: json.dumps(p, sort_keys=True)  # noqa: E731
        left = [key(p) for p in committed["points"]]
        for p in built["points"]:  # every point built without them, as committed
            left.remove(key(p))
        added = [json.loads(k) for k in left]
        # Per shape (1b, 8b) and decode batch (8, 16): 5 chunks alone, and
        # 4 beside the decodes (the smallest step, 64 rows, is not a
        # multiple of 128 and is left out).
        self.assertEqual(len(added), 2 * 2 * 9)
        self.assertTrue(all(48 <= p["prefill_tokens"] <= 504 for p in added))
        mixed = [p for p in added if p.get("decode_tokens")]
        self.assertEqual(len(mixed), 16)
        self.assertTrue(all((p["decode_tokens"] + p["prefill_tokens"]) % 128 == 0 for p in mixed))
        self.assertEqual(sorted({p["shape"] for p in added}), ["llama-1b", "llama-8b"])


if __name__ == "__main__":
    SOURCE = sys.argv.pop(1)
    unittest.main()

#!/usr/bin/env python3
"""scripts/offline-bound.py on a two-request trace and a tiny model, its
bounds worked out by hand.

Usage (ctest runs it): offline_bound_test.py SCRIPTS_DIR
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPTS = None

# One layer, hidden 4, two query heads and one KV head of size 2,
# intermediate 8, vocabulary 10. Parameters: the layer 4 x (4 + 2 x 2) +
# 4 x 4 + 3 x 4 x 8 = 144, the LM head 10 x 4 = 40; in BF16 the weights are
# 368 bytes. A token's KV: 1 layer x 2 (K, V) x 2 x 2 bytes = 8 bytes. The
# attention: 4 x 1 x 2 x 2 = 16 FLOPs a query x key pair.
CONFIG = dict(hidden_size=4, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2,
              num_key_value_heads=1, vocab_size=10)
# 368 bytes/s reads the weights in 1 s; 1,000 FLOP/s.
RATES = ["--bandwidth", "368e-12", "--gemm-tflops", "1000e-12"]


class OfflineBound(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.config = os.path.join(self.dir.name, "config.json")
        with open(self.config, "w") as f:
            json.dump(CONFIG, f)
        self.trace = os.path.join(self.dir.name, "t.jsonl")
        with open(self.trace, "w") as f:
            f.write('{"type":"request","id":"r0","arrival_s":0,"prompt_tokens":2,'
                    '"output_tokens":3}\n')
            f.write('{"type":"request","id":"r1","arrival_s":0,"prompt_tokens":1,'
                    '"output_tokens":2}\n')

    def tearDown(self):
        self.dir.cleanup()

    def bound(self, *extra):
        out = subprocess.run([sys.executable, os.path.join(SCRIPTS, "offline-bound.py"),
                              self.trace, "--config", self.config, "--json"] + RATES +
                             list(extra), check=True, capture_output=True, text=True)
        return json.loads(out.stdout)

    def test_ideal_schedule(self):
        got = self.bound()
        self.assertEqual(got["output_tokens"], 5)
        # Prefill: 3 tokens, 3 + 1 pairs, 2 prompts done. Products 2 x 144
        # x 3 + 2 x 40 x 2 = 1,024 FLOPs, attention 64, KV written 24 bytes.
        # Roofline max(392 / 368, 1,088 / 1,000) = 1.088 s; serial
        # max(1, 1.024) + 24 / 368 + 0.064.
        pre = got["bands"]["prefill"]
        self.assertEqual(pre["steps"], 1)
        self.assertAlmostEqual(pre["roofline_s"], 1.088, places=9)
        self.assertAlmostEqual(pre["serial_s"], 1.024 + 24 / 368 + 0.064, places=9)
        # Decode 1: both requests, contexts 3 and 2 (5 keys): products 736
        # FLOPs, attention 80, KV 40 read and 16 written. Decode 2: r0
        # alone, context 4: products 368, attention 64, KV 32 + 8.
        dec = got["bands"]["decode only, 1-16 sequences"]
        self.assertEqual(dec["steps"], 2)
        self.assertAlmostEqual(dec["roofline_s"], 424 / 368 + 408 / 368, places=9)
        self.assertAlmostEqual(dec["serial_s"], (1 + 56 / 368 + 0.080) + (1 + 40 / 368 + 0.064),
                               places=9)
        self.assertAlmostEqual(got["total"]["roofline_s"], 1.088 + 832 / 368, places=9)
        self.assertEqual(got["total"]["measured_steps"], 0)

    def test_measured_steps(self):
        # A node's steps (step-log.py's columns): the prefill (500 ms), a
        # decode of 20 sequences (not measured: -1) and one of 2 (250 ms).
        steps = os.path.join(self.dir.name, "steps.csv")
        with open(steps, "w") as f:
            f.write("decode_tokens,decode_context,prefill_tokens,prefill_attention,"
                    "prefill_logits,ms,collected_us\n")
            f.write("0,0,3,4,2,500.000,1\n")
            f.write("20,100,0,0,0,-1,2\n")
            f.write("2,5,0,0,0,250.000,3\n")
        got = self.bound("--steps", steps)
        self.assertEqual(got["total"]["steps"], 3)
        self.assertEqual(got["total"]["measured_steps"], 2)
        self.assertAlmostEqual(got["total"]["measured_s"], 0.75, places=9)
        self.assertEqual(got["bands"]["decode only, 17-64 sequences"]["steps"], 1)
        self.assertEqual(got["bands"]["decode only, 17-64 sequences"]["measured_steps"], 0)
        dec = got["bands"]["decode only, 1-16 sequences"]
        self.assertAlmostEqual(dec["measured_serial_s"], 1 + 56 / 368 + 0.080, places=9)

    def test_simulated_rows_expand(self):
        # A simulated row of 2 steps: the second attends one more key a
        # decode (contexts 5, then 7), and each takes half the row's time.
        steps = os.path.join(self.dir.name, "steps-1.csv")
        with open(steps, "w") as f:
            f.write("gpu,model,start_s,end_s,steps,decode_tokens,decode_context,prefill_tokens,"
                    "prefill_attention,prefill_logits,running,waiting,kv_bytes,lent_layers,"
                    "device_lent\n")
            f.write("0,m,1.0,3.0,2,2,5,0,0,0,2,0,0,0,0\n")
        got = self.bound("--steps", steps)
        dec = got["bands"]["decode only, 1-16 sequences"]
        self.assertEqual(dec["steps"], 2)
        self.assertAlmostEqual(dec["measured_s"], 2.0, places=9)
        # Serial: products 736 FLOPs under the weights' 1 s each; KV 56 then
        # 72 bytes; attention 80 then 112 FLOPs.
        self.assertAlmostEqual(dec["serial_s"], 2 + 128 / 368 + 0.192, places=9)


if __name__ == "__main__":
    SCRIPTS = sys.argv.pop(1)
    unittest.main()

#!/usr/bin/env python3
"""Writes the tokenizer goldens from Hugging Face `tokenizers` (and `transformers`).

Usage: make_golden.py TOKENIZER_DIR OUT_DIR
  TOKENIZER_DIR/<name>/tokenizer.json[.gz] and tokenizer_config.json for every
  name in corpus.json's "tokenizers" (scripts/fetch-test-tokenizers.sh fetches them).
Writes OUT_DIR/golden.tar.gz (golden/<name>.json for every tokenizer and variant),
OUT_DIR/debug.tar.gz (tokens, normalized text, pre-tokens: for debugging, not committed)
and OUT_DIR/timing.json (single-thread encode speed). Runs offline.

Per entry: "ids" (encode, add_special_tokens=False), "ids_special" (tokenizers'
post-processor), "ids_split_special" (encode_special_tokens=True), "decode"/
"decode_skip" (tokenizers decode of "ids" without/with skip_special_tokens)
and, for the three real tokenizers, transformers' "tf_ids_special",
"tf_decode", "tf_decode_skip". The files are compacted (compact() below):
a field left out equals its default, which the C++ test reconstructs:
  ids_special, tf_ids_special: special_prefix + ids + special_suffix (top level)
  ids_split_special: ids;  decode: the entry's text;  decode_skip: decode
  tf_decode: decode;  tf_decode_skip: decode_skip
`make_golden.py --compact FILE...` compacts files written before this rule.
"""
import copy
import gzip
import io
import json
import os
import platform
import sys
import tarfile
import tempfile
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

tokenizers = None  # imported in main(): --compact runs without the library
Tokenizer = None

HERE = os.path.dirname(os.path.abspath(__file__))


def entry_text(e):
    if "hex" in e:
        return bytes.fromhex(e["hex"]).decode("utf-8", "replace")
    return e["text"]


def read_json_maybe_gz(path):
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    with gzip.open(path + ".gz", "rt", encoding="utf-8") as f:
        return json.load(f)


def apply_variant(base, spec):
    """Same rules as the C++ test: dotted "set" paths, added-token flag patches."""
    t = copy.deepcopy(base)
    for path, value in spec.get("set", {}).items():
        keys = path.split(".")
        node = t
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
    for content, flags in spec.get("added_tokens", {}).items():
        for a in t["added_tokens"]:
            if a["content"] == content:
                a.update(flags)
    return t


def byte_token(tok, b, byte_level):
    if byte_level:
        return tok.token_to_id(BYTES_TO_UNICODE[b])
    return tok.token_to_id("<0x%02X>" % b)


def _bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTES_TO_UNICODE = _bytes_to_unicode()


def decode_case_ids(tok, case, byte_level):
    ids = []
    for part in case["parts"]:
        if "bytes" in part:
            for b in bytes.fromhex(part["bytes"]):
                i = byte_token(tok, b, byte_level)
                if i is None:
                    raise ValueError("no byte token for %02x" % b)
                ids.append(i)
        elif "text" in part:
            ids += tok.encode(part["text"], add_special_tokens=False).ids
        else:
            found = [tok.token_to_id(c) for c in part["token"] if tok.token_to_id(c) is not None]
            if not found:
                raise ValueError("none of %s" % part["token"])
            ids.append(found[0])
    return ids


def stream_decode(tok, ids, skip):
    try:
        from tokenizers.decoders import DecodeStream
    except ImportError:
        return None
    ds = DecodeStream(skip_special_tokens=skip)
    out = []
    for i in ids:
        piece = ds.step(tok, i)
        if piece is not None:
            out.append(piece)
    return "".join(out)


def load_transformers(tj, cfg_dir):
    try:
        import transformers
        from transformers import AutoTokenizer
    except Exception as e:  # noqa: BLE001
        return None, "import: %r" % e
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    with open(os.path.join(cfg_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = f.read()
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        f.write(cfg)
    try:
        return AutoTokenizer.from_pretrained(d), transformers.__version__
    except Exception as e:  # noqa: BLE001
        return None, "load: %r" % e


def golden_for(name, tj, corpus, cfg_dir, with_tf):
    tok = Tokenizer.from_str(json.dumps(tj))
    byte_level = "ByteLevel" in json.dumps(tj.get("decoder"))
    tf, tf_info = load_transformers(tj, cfg_dir) if with_tf else (None, None)
    out = {"tokenizer": name, "tokenizers_version": tokenizers.__version__,
           "transformers": tf_info, "entries": {}, "decode_cases": {}}
    debug = {"entries": {}}
    if tf is not None:
        out["tf_bos_token_id"] = tf.bos_token_id
        out["tf_eos_token_id"] = tf.eos_token_id
        out["tf_all_special_ids"] = sorted(set(tf.all_special_ids))
        out["tf_ids_special_empty"] = tf.encode("", add_special_tokens=True)
    for e in corpus["entries"]:
        text = entry_text(e)
        r = {}
        enc = tok.encode(text, add_special_tokens=False)
        r["ids"] = enc.ids
        r["ids_special"] = tok.encode(text, add_special_tokens=True).ids
        try:
            tok.encode_special_tokens = True
            split = tok.encode(text, add_special_tokens=False).ids
            tok.encode_special_tokens = False
            if split != enc.ids:
                r["ids_split_special"] = split
        except Exception as ex:  # noqa: BLE001
            r["ids_split_special_error"] = repr(ex)
        r["decode"] = tok.decode(enc.ids, skip_special_tokens=False)
        r["decode_skip"] = tok.decode(enc.ids, skip_special_tokens=True)
        for skip, key in ((False, "stream"), (True, "stream_skip")):
            s = stream_decode(tok, enc.ids, skip)
            if s is not None and s != r["decode_skip" if skip else "decode"]:
                r[key] = s
        if tf is not None:
            try:
                r["tf_ids_special"] = tf.encode(text, add_special_tokens=True)
                r["tf_decode"] = tf.decode(enc.ids, skip_special_tokens=False)
                r["tf_decode_skip"] = tf.decode(enc.ids, skip_special_tokens=True)
            except Exception as ex:  # noqa: BLE001
                r["tf_error"] = repr(ex)
        out["entries"][e["name"]] = r
        dbg = {"tokens": enc.tokens}
        if tok.normalizer is not None:
            dbg["normalized"] = tok.normalizer.normalize_str(text)
        if tok.pre_tokenizer is not None:
            dbg["pre_tokens"] = [p for p, _ in tok.pre_tokenizer.pre_tokenize_str(
                dbg.get("normalized", text))]
        debug["entries"][e["name"]] = dbg
    for c in corpus["decode_cases"]:
        try:
            ids = decode_case_ids(tok, c, byte_level)
        except Exception as ex:  # noqa: BLE001
            out["decode_cases"][c["name"]] = {"error": repr(ex)}
            continue
        r = {"ids": ids, "decode": tok.decode(ids, skip_special_tokens=False),
             "decode_skip": tok.decode(ids, skip_special_tokens=True)}
        if tf is not None:
            r["tf_decode"] = tf.decode(ids, skip_special_tokens=False)
            r["tf_decode_skip"] = tf.decode(ids, skip_special_tokens=True)
        out["decode_cases"][c["name"]] = r
    return tok, out, debug


def time_encode(tok, corpus, seconds=3.0):
    texts = [entry_text(e) for e in corpus["entries"]]
    doc = "\n".join(texts)
    res = {}
    n_tok = sum(len(tok.encode(t, add_special_tokens=False).ids) for t in texts)
    t0 = time.perf_counter()
    reps = 0
    while time.perf_counter() - t0 < seconds:
        for t in texts:
            tok.encode(t, add_special_tokens=False)
        reps += 1
    dt = time.perf_counter() - t0
    res["entries"] = {"tokens_per_rep": n_tok, "reps": reps, "seconds": dt,
                      "tokens_per_s": n_tok * reps / dt,
                      "bytes_per_s": sum(len(t.encode()) for t in texts) * reps / dt}
    big = doc * 20
    n_big = len(tok.encode(big, add_special_tokens=False).ids)
    best = 1e9
    for _ in range(5):
        t0 = time.perf_counter()
        tok.encode(big, add_special_tokens=False)
        best = min(best, time.perf_counter() - t0)
    res["document"] = {"bytes": len(big.encode()), "tokens": n_big, "best_seconds": best,
                       "tokens_per_s": n_big / best}
    return res


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def add_file(tar, name, obj):
    data = json.dumps(obj, ensure_ascii=True, indent=None, separators=(",", ":")).encode()
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def compact(g, corpus):
    """Drops every field that equals its default (see the module comment)."""
    texts = {e["name"]: entry_text(e) for e in corpus["entries"]}
    ref = g["entries"].get("english", {})
    ids, special = ref.get("ids", []), ref.get("ids_special", ref.get("ids", []))
    k = next((i for i in range(len(special) - len(ids) + 1) if special[i:i + len(ids)] == ids), 0)
    g.setdefault("special_prefix", special[:k])
    g.setdefault("special_suffix", special[k + len(ids):])
    for name, r in g["entries"].items():
        wrapped = g["special_prefix"] + r["ids"] + g["special_suffix"]
        for key in ("ids_special", "tf_ids_special"):
            if r.get(key) == wrapped:
                del r[key]
        if r.get("ids_split_special") == r["ids"]:
            del r["ids_split_special"]
        decode = r.get("decode", texts[name])
        skip = r.get("decode_skip", decode)
        if r.get("tf_decode") == decode:
            del r["tf_decode"]
        if r.get("tf_decode_skip") == skip:
            del r["tf_decode_skip"]
        if r.get("decode_skip") == decode:
            del r["decode_skip"]
        if r.get("decode") == texts[name]:
            del r["decode"]
    for r in g["decode_cases"].values():
        if r.get("tf_decode") == r.get("decode"):
            r.pop("tf_decode", None)
        if r.get("tf_decode_skip") == r.get("decode_skip"):
            r.pop("tf_decode_skip", None)
    return g


def main():
    if sys.argv[1] == "--compact":
        with open(os.path.join(HERE, "corpus.json"), encoding="utf-8") as f:
            corpus = json.load(f)
        for path in sys.argv[2:]:
            with open(path, encoding="utf-8") as f:
                g = compact(json.load(f), corpus)
            with open(path, "w", encoding="utf-8") as f:
                json.dump(g, f, ensure_ascii=True, indent=None, separators=(",", ":"))
                f.write("\n")
        return
    global tokenizers, Tokenizer
    import tokenizers as tokenizers_module
    tokenizers, Tokenizer = tokenizers_module, tokenizers_module.Tokenizer
    src, out_dir = sys.argv[1], sys.argv[2]
    with open(os.path.join(HERE, "corpus.json"), encoding="utf-8") as f:
        corpus = json.load(f)
    bases = {}
    timing = {"cpu": cpu_model(), "python": platform.python_version(),
              "tokenizers": tokenizers.__version__, "threads": "RAYON_NUM_THREADS=1", "load": {},
              "encode": {}}
    gold = tarfile.open(os.path.join(out_dir, "golden.tar.gz"), "w:gz")
    dbg = tarfile.open(os.path.join(out_dir, "debug.tar.gz"), "w:gz")
    for name in corpus["tokenizers"]:
        d = os.path.join(src, name)
        bases[name] = read_json_maybe_gz(os.path.join(d, "tokenizer.json"))
        t0 = time.perf_counter()
        Tokenizer.from_str(json.dumps(bases[name]))
        timing["load"][name] = time.perf_counter() - t0
        tok, g, db = golden_for(name, bases[name], corpus, d, True)
        add_file(gold, "golden/%s.json" % name, compact(g, corpus))
        add_file(dbg, "debug/%s.json" % name, db)
        timing["encode"][name] = time_encode(tok, corpus)
        print(name, json.dumps(timing["encode"][name]), flush=True)
    for vname, spec in corpus["variants"].items():
        try:
            tj = apply_variant(bases[spec["base"]], spec)
            _, g, db = golden_for(vname, tj, corpus, os.path.join(src, spec["base"]), False)
            add_file(gold, "golden/%s.json" % vname, compact(g, corpus))
            add_file(dbg, "debug/%s.json" % vname, db)
            print("variant", vname, "ok", flush=True)
        except Exception as ex:  # noqa: BLE001
            add_file(gold, "golden/%s.error.json" % vname, {"error": repr(ex)})
            print("variant", vname, "FAILED", repr(ex), flush=True)
    gold.close()
    dbg.close()
    with open(os.path.join(out_dir, "timing.json"), "w") as f:
        json.dump(timing, f, indent=1)
    print(json.dumps(timing, indent=1))


if __name__ == "__main__":
    main()

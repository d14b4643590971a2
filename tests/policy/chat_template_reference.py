#!/usr/bin/env python3
"""transformers' own chat-template renderings, for tests/policy/chat_template_test.cpp.

  chat_template_reference.py make --data tests/policy/data/chat_templates --out DIR

For each model family folder under --data: copies it to DIR/<family>, adds a small
byte-level BPE tokenizer.json that knows the family's special tokens (so that
AutoTokenizer.from_pretrained loads the folder exactly as it loads the real model's
tokenizer files), and writes DIR/<family>/expected.json: a list of
{"messages": [...], "text": apply_chat_template(messages, tokenize=False,
add_generation_prompt=True), "ids": the text's ids by tokenizers from tokenizer.json, no special tokens added} or {"messages": [...], "error": "..."} where the template
raises. Exit 0 ok, 3 transformers is not installed (the test then skips), 1 other errors.
"""
import argparse
import json
import os
import shutil
import sys

SYSTEM = "You are a CUDA kernel engineer. Answer with one ```cuda block."
USER1 = ("Write a kernel for:\n\n```python\nclass Model(nn.Module):\n    def forward(self, x):\n"
         "        return torch.relu(x)\n```\n")
ASSISTANT1 = "  Here is a first attempt:\n```cuda\n__global__ void k(float* x) { x[0] = 0.f; }\n```\n\n"
USER2 = "\nIt failed: max error 1.0e+00 at out[0][3]. Fix it and keep it fast.\t \n"

CONVERSATIONS = [
    [{"role": "user", "content": USER1}],
    [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER1}],
    # A system turn and a two-turn history.
    [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER1},
     {"role": "assistant", "content": ASSISTANT1}, {"role": "user", "content": USER2}],
    [{"role": "user", "content": "  ünïcödé \u4e2d\u6587 {{ not jinja }} <|im_end|>  "},
     {"role": "assistant", "content": "\u3000ok\u3000"}, {"role": "user", "content": "again"}],
    # An earlier turn that reasoned first (Qwen3 drops the <think> block of an earlier turn).
    [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER1},
     {"role": "assistant", "content": "<think>\nThe input is fp32; one thread per element.\n</think>\n\n" + ASSISTANT1},
     {"role": "user", "content": USER2}],
    # Three user turns, two answers, text that looks like template syntax and a </think> alone.
    [{"role": "user", "content": "{% if x %}y{% endif %} first"}, {"role": "assistant", "content": "a1</think>tail"},
     {"role": "user", "content": "second"}, {"role": "assistant", "content": "\n\na2"},
     {"role": "user", "content": "third \U0001f680"}],
]


def generated_conversations(n=24, seed=20261207):
    """Seeded random conversations: an optional system turn, then 1-4 user turns with the
    answers between them, contents drawn from long, Unicode, whitespace-padded, marker and
    template-looking texts (some reasoning first in <think> blocks)."""
    import random
    rnd = random.Random(seed)
    pool = [USER1, USER2, ASSISTANT1, SYSTEM, "x", " ", "\t\n", "{{ messages }} {% for %}", "{# c #}",
            "<|im_start|>assistant\n", "<|eot_id|>[INST]", "</think>", "<think>\nmaybe\n</think>\n\nok",
            "\u00e9\u4e2d\U0001f680\u3000\u00a0", "line\r\nbreaks\r\n", "'quotes' \"double\" \\backslash",
            "word " * 300]
    convs = []
    for _ in range(n):
        conv = []
        if rnd.random() < 0.5:
            conv.append({"role": "system", "content": rnd.choice(pool)})
        turns = rnd.randint(1, 4)
        for t in range(turns):
            conv.append({"role": "user", "content": "".join(rnd.choice(pool) for _ in range(rnd.randint(1, 3)))})
            if t + 1 < turns:
                reply = "".join(rnd.choice(pool) for _ in range(rnd.randint(1, 2)))
                if rnd.random() < 0.3:
                    reply = "<think>\n" + rnd.choice(pool) + "\n</think>\n\n" + reply
                conv.append({"role": "assistant", "content": reply})
        convs.append(conv)
    return convs


CONVERSATIONS += generated_conversations()


def special_tokens(folder):
    with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    out = []
    for k in ("bos_token", "eos_token", "unk_token", "pad_token"):
        v = cfg.get(k)
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str) and v not in out:
            out.append(v)
    # Turn markers the templates print, added as special tokens as the real tokenizers have them.
    for t in ("<|im_start|>", "<|im_end|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
              "[INST]", "[/INST]"):
        if t not in out:
            out.append(t)
    return out


def make_tokenizer(path, specials):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    corpus = [USER1, USER2, ASSISTANT1, SYSTEM] * 4
    tok.train_from_iterator(corpus, trainer)
    tok.save(path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["make"])
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    try:
        import transformers
        from tokenizers import Tokenizer
        from transformers import AutoTokenizer
    except ImportError as e:
        print(f"transformers is not installed ({e})", file=sys.stderr)
        return 3
    transformers.logging.set_verbosity_error()
    os.makedirs(a.out, exist_ok=True)
    for fam in sorted(os.listdir(a.data)):
        src = os.path.join(a.data, fam)
        if not os.path.isdir(src):
            continue
        dst = os.path.join(a.out, fam)
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)
        make_tokenizer(os.path.join(dst, "tokenizer.json"), special_tokens(dst))
        tok = AutoTokenizer.from_pretrained(dst)
        # Token ids from the tokenizer.json itself (transformers' per-class tokenizers may
        # swap the pre-tokenizer of this small test vocabulary).
        raw = Tokenizer.from_file(os.path.join(dst, "tokenizer.json"))
        expected = []
        for conv in CONVERSATIONS:
            try:
                text = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
                ids = raw.encode(text, add_special_tokens=False).ids
                expected.append({"messages": conv, "text": text, "ids": ids})
            except Exception as e:  # the template's raise_exception
                expected.append({"messages": conv, "error": str(e)})
        with open(os.path.join(dst, "expected.json"), "w", encoding="utf-8") as f:
            json.dump(expected, f, ensure_ascii=False, indent=1)
        print(f"{fam}: {sum('text' in e for e in expected)} renderings, "
              f"{sum('error' in e for e in expected)} template errors "
              f"(transformers {transformers.__version__}, {type(tok).__name__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

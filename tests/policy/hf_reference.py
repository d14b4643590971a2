#!/usr/bin/env python3
"""Independent references for the policy tests, from HF transformers and tokenizers.

  hf_reference.py make --out DIR     tiny random Qwen2/Llama checkpoints + reference logits,
                                     BPE tokenizers trained on sample text + expected ids
  hf_reference.py verify --dir D --ref F
                                     loads a checkpoint written by our C++ code in HF
                                     transformers; exits 1 unless its logits match ours
Everything is seeded, so a second run writes the same files.
"""
import argparse
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file

TOL = 1e-4


def randomise(model, seed):
    # Non-trivial values everywhere (norm weights, biases) so a wrong wiring shows up.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.08 * torch.randn(p.shape, generator=g))


def make_models(out):
    from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                              Qwen3ForCausalLM)

    specs = {
        # Qwen2: q/k/v bias, GQA 4:2, untied lm_head.
        "qwen2": (Qwen2ForCausalLM, Qwen2Config(
            vocab_size=384, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False,
            bos_token_id=1, eos_token_id=2)),
        # Llama: tied embeddings, MQA 4:1, explicit head_dim, llama3 rope scaling.
        "llama": (LlamaForCausalLM, LlamaConfig(
            vocab_size=300, hidden_size=48, intermediate_size=112, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=1, head_dim=16, max_position_embeddings=512,
            rms_norm_eps=1e-5, tie_word_embeddings=True, attention_bias=False,
            rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 64},
            bos_token_id=1, eos_token_id=2)),
        # Qwen3: per-head q/k RMSNorm, no q/k/v bias, GQA 4:2, a head_dim that is not
        # hidden/heads (as Qwen3-0.6B's 128 against 1024/16), untied lm_head.
        "qwen3": (Qwen3ForCausalLM, Qwen3Config(
            vocab_size=352, hidden_size=64, intermediate_size=144, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=24, max_position_embeddings=256,
            rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False, attention_bias=False,
            bos_token_id=1, eos_token_id=2)),
        # Qwen3 with tied embeddings and attention_bias (q/k/v and o_proj biased), MQA 4:1.
        "qwen3_tied": (Qwen3ForCausalLM, Qwen3Config(
            vocab_size=320, hidden_size=48, intermediate_size=96, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=1, head_dim=16, max_position_embeddings=256,
            rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True, attention_bias=True,
            bos_token_id=1, eos_token_id=2)),
    }
    for i, (name, (cls, cfg)) in enumerate(specs.items()):
        torch.manual_seed(100 + i)
        model = cls(cfg).to(torch.float32).eval()
        randomise(model, 200 + i)
        d = os.path.join(out, name)
        model.save_pretrained(d, safe_serialization=True)
        if name == "qwen2":  # the same weights again, sharded (model.safetensors.index.json)
            model.save_pretrained(os.path.join(out, "qwen2_sharded"), safe_serialization=True, max_shard_size="40KB")
        g = torch.Generator().manual_seed(300 + i)
        ids = torch.randint(0, cfg.vocab_size, (2, 12), generator=g)
        # Row 1 left-padded by 4: positions count real tokens only, padding is masked.
        mask = torch.ones_like(ids)
        mask[1, :4] = 0
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            logits = model(ids).logits
            logits_pad = model(ids, attention_mask=mask, position_ids=pos).logits
        save_file({"ids": ids.contiguous(), "logits": logits.contiguous(), "mask": mask.contiguous(),
                   "logits_pad": logits_pad.contiguous()}, os.path.join(d, "refs.safetensors"))
        print(f"model {name}: logits {tuple(logits.shape)} |max| {logits.abs().max():.3f}")


CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "__global__ void relu(const float* x, float* y, int n) {\n  int i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;\n}\n",
    "#include <cuda_runtime.h>\n#include <kf/kernel.h>\nextern \"C\" int kf_forward(kf::Context* ctx, const kf::Tensor* in, int n_in, kf::Tensor* out, int n_out);\n",
    "class Model(nn.Module):\n\tdef forward(self, x):\n\t\treturn torch.relu(x) @ self.w.T  # matmul\n",
    "I'm sure they'll say it's fine, but WE'RE not; you've DONE it. 'S 'T 'Re",
    "Ein Straße, ein Café, naïve façade — déjà vu. ſt ſ's",
    "e\u0301 vs \u00e9; A\u030a vs \u00c5; \u1100\u1161\u11a8 vs \uac01; q\u0307\u0323 \u1e0b\u0323",
    "日本語のテキストと中文文本，한국어 텍스트도 있습니다。",
    "Emoji 🚀🔥👩‍💻 and math ∑ x² ≤ ∞, arrows → ⇒, box ┌─┐",
    "مرحبا بالعالم שלום עולם Привет, мир Γειά σου",
    "numbers 1234567890 3.14159 1e-9 0xFF 1,000,000 ١٢٣ ½ Ⅻ",
    "    indented\n\n\n\t\ttabs   and   spaces   \r\n\r\nwindows\rline   ",
    "trailing spaces   ",
    "   leading",
    "\u00a0nbsp\u00a0\u00a0 ideographic\u3000space\u2003em\u2009thin\u200bzero-width\u2028ls\u0085nel",
    "<|im_start|>system\nYou write CUDA kernels.<|im_end|>\n<|im_start|>user\nFuse x+y<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more<|endoftext|><|endoftext|> spaced <|im_end|>end",
    "a <think>reason</think> b<think>",
    "x  [MASK] y [MASK]z",
    "!!!???...,,,;;;::: ((( ))) {{{ }}} <<< >>> ### @@@ $$$ %%% ^^^ &&& *** ~~~ `code`",
    "for (int i = 0; i < 1024; ++i) { acc += a[i] * b[i]; }  // 1024 iterations",
    "\n\n\n",
    "   ",
    "",
    "x",
    "a\n b\n  c\n   d",
    "'''docstring''' \"\"\"quotes\"\"\" 'single' \"double\"",
    "tab\tafter\ttabs\t\t\tend\t",
    "mixed123abc456DEF_ghi-jkl.mno/pqr\\stu",
    "\U0001d400\U0001d401 bold math, \U00010348 gothic, \U0001f600 grin",
]


def make_tokenizers(out):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    qwen = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
    llama3 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
    flavours = {
        "qwen2": (normalizers.NFC(), pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(qwen), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), False),
        "llama3": (None, pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(llama3), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), True),
        "gpt2": (None, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), False),
        "gpt2_prefix": (None, pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True), False),
    }
    with open(__file__, encoding="utf-8") as f:
        own_source = f.read()
    train_text = CORPUS * 20 + [own_source] * 3
    cases = list(CORPUS)
    # Longer generated cases: whitespace runs and repeated code.
    cases += [" " * n + "x" for n in (1, 2, 3, 7, 16)] + ["\n" * 5 + " " * 3 + "y", "a" * 300, own_source[:4000]]
    expected = {}
    for name, (norm, pre, ignore_merges) in flavours.items():
        tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
        if norm is not None:
            tok.normalizer = norm
        tok.pre_tokenizer = pre
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=600, min_frequency=2, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
        tok.train_from_iterator(train_text, trainer=trainer)
        tok.add_tokens([AddedToken("<think>", normalized=True, special=False),
                        AddedToken("</think>", normalized=False, special=False)])
        tok.add_special_tokens([AddedToken("[MASK]", lstrip=True, special=True)])
        path = os.path.join(out, f"tokenizer_{name}.json")
        tok.save(path)
        result = []
        for text in cases:
            enc = tok.encode(text, add_special_tokens=False)
            result.append({"text": text, "ids": enc.ids,
                           "decoded": tok.decode(enc.ids, skip_special_tokens=False)})
        expected[name] = {"file": path, "cases": result}
        if name == "qwen2":  # the legacy "a b" merges form must give the same ids
            with open(path, encoding="utf-8") as f:
                j = json.load(f)
            j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
            legacy = os.path.join(out, "tokenizer_qwen2_legacy.json")
            with open(legacy, "w", encoding="utf-8") as f:
                json.dump(j, f, ensure_ascii=False)
            old = Tokenizer.from_file(legacy)
            assert all(old.encode(c["text"], add_special_tokens=False).ids == c["ids"] for c in result)
            expected["qwen2_legacy"] = {"file": legacy, "cases": result}
        print(f"tokenizer {name}: vocab {tok.get_vocab_size()}, {len(result)} cases")
    with open(os.path.join(out, "tokenizer_expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False)


def verify(directory, ref):
    from transformers import AutoModelForCausalLM

    refs = load_file(ref)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(refs["ids"]).logits
    diff = (logits - refs["logits"]).abs().max().item()
    print(f"verify {directory}: {type(model).__name__} max |HF - ours| = {diff:.3g}")
    if os.path.exists(os.path.join(directory, "tokenizer.json")):
        from tokenizers import Tokenizer
        Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
    return 0 if diff <= TOL else 1


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--out", required=True)
    v = sub.add_parser("verify")
    v.add_argument("--dir", required=True)
    v.add_argument("--ref", required=True)
    a = ap.parse_args()
    torch.set_num_threads(2)
    if a.cmd == "make":
        os.makedirs(a.out, exist_ok=True)
        make_models(a.out)
        make_tokenizers(a.out)
        return 0
    return verify(a.dir, a.ref)


if __name__ == "__main__":
    sys.exit(main())

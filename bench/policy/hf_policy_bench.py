#!/usr/bin/env python3
"""HF transformers side of the policy benchmark: generate() tokens/s with a randomly
initialised Qwen2.5-0.5B-shaped model in bf16, same prompts/lengths as bench_policy.

  hf_policy_bench.py --batches 1,16,64 --prompt 128 --new 256
Prints BENCH|policy_hf|decode_..._b<B>...|tok_per_s|<value>|tok/s rows.
"""
import argparse
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--iters", type=int, default=2)
    a = ap.parse_args()
    from transformers import Qwen2Config, Qwen2ForCausalLM
    import transformers

    cfg = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                      num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                      rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16).eval()
    print(f"# transformers {transformers.__version__}, torch {torch.__version__}, attn {model.config._attn_implementation}",
          flush=True)
    for b in [int(x) for x in a.batches.split(",")]:
        ids = torch.randint(0, cfg.vocab_size - 1000, (b, a.prompt), device="cuda")
        mask = torch.ones_like(ids)
        kw = dict(attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, pad_token_id=0,
                  eos_token_id=None)
        with torch.no_grad():
            model.generate(ids, max_new_tokens=8, min_new_tokens=8, **kw)
            torch.cuda.synchronize()
            best = 1e30
            for _ in range(a.iters):
                t0 = time.perf_counter()
                out = model.generate(ids, max_new_tokens=a.new, min_new_tokens=a.new, **kw)
                torch.cuda.synchronize()
                best = min(best, time.perf_counter() - t0)
        assert out.shape[1] == a.prompt + a.new, out.shape
        print(f"BENCH|policy_hf|decode_hf_generate_bf16_b{b}_p{a.prompt}_n{a.new}|tok_per_s|{b * a.new / best:.1f}|tok/s",
              flush=True)


if __name__ == "__main__":
    main()

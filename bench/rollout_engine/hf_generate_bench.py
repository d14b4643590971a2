#!/usr/bin/env python3
"""HF transformers generate() at N concurrent sequences, the baseline of bench_rollout_engine.

A random-init model built from an HF config.json (configs/shapes/, no download), bf16 on
CUDA (fp32 on CPU), N prompts of P random tokens, sampled (temperature 1, no top-k) to
exactly M new tokens each (min_new_tokens = M). Prints a table line and
"BENCH|rollout_engine|<name>_c<N>_hf|<metric>|<value>|<unit>" rows: tokens/s (new tokens
over generate()'s wall time, prefill included), the time the batch took (every group of the
batch finishes with it), and the KV cache size (N x (P + M) tokens).
"""
import argparse
import json
import os
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", required=True, help="HF config.json")
    ap.add_argument("--prompt", type=int, default=2048)
    ap.add_argument("--completion", type=int, default=4096)
    ap.add_argument("--concurrency", default="64,128,256")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--name", default="")
    a = ap.parse_args()
    name = a.name or os.path.basename(a.shape).removesuffix(".json")
    with open(a.shape) as f:
        cfg = AutoConfig.for_model(**json.load(f))
    dtype = torch.bfloat16 if a.device.startswith("cuda") else torch.float32
    torch.manual_seed(1)
    with torch.device(a.device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.eval()
    kv_per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * (2 if dtype == torch.bfloat16 else 4)
    g = torch.Generator().manual_seed(5)
    print(f"HF generate(): {name} on {a.device}, prompt {a.prompt}, completion {a.completion}")
    for n in [int(x) for x in a.concurrency.split(",")]:
        ids = torch.randint(0, cfg.vocab_size, (n, a.prompt), generator=g).to(a.device)
        mask = torch.ones_like(ids)
        kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=0)
        with torch.no_grad():
            model.generate(ids[:, :16], attention_mask=mask[:, :16], max_new_tokens=4, min_new_tokens=4, **kw)  # warm-up
            if a.device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model.generate(ids, attention_mask=mask, max_new_tokens=a.completion, min_new_tokens=a.completion, **kw)
            if a.device.startswith("cuda"):
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
        new = (out.shape[1] - a.prompt) * n
        tps = new / dt
        kv_mb = n * (a.prompt + a.completion) * kv_per_token / 2**20
        print(f"{'hf generate()':<22} {n:6d} {tps:12.1f} {dt:14.3f} {kv_mb:14.1f}")
        c = f"{name}_c{n}_hf"
        print(f"BENCH|rollout_engine|{c}|tokens_per_s|{tps:.6g}|tok/s")
        print(f"BENCH|rollout_engine|{c}|group_done_s|{dt:.6g}|s")
        print(f"BENCH|rollout_engine|{c}|kv_mb|{kv_mb:.6g}|MB")
        print(f"BENCH|rollout_engine|{c}|completion_tokens|{a.completion}|tokens")
        del out
        if a.device.startswith("cuda"):
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

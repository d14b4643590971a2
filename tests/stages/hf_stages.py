"""Independent references for the stages tests (HF tokenizers and transformers).

  hf_stages.py tokens --tokenizer FILE --texts FILE --out FILE
      texts: JSON list of strings; out: JSON list of {"ids": [...], "decoded": str}
  hf_stages.py logits --dir DIR --ref FILE
      ref: safetensors with "ids" (int64 [B, T]) and "logits" (fp32 [B, T, V]) from our
      model; loads DIR with AutoModelForCausalLM and exits 1 if max |HF - ours| > 1e-4.
"""
import argparse
import json
import sys


def tokens(a):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(a.tokenizer)
    with open(a.texts, encoding="utf-8") as f:
        texts = json.load(f)
    out = []
    for t in texts:
        enc = tok.encode(t, add_special_tokens=False)
        out.append({"ids": enc.ids, "decoded": tok.decode(enc.ids, skip_special_tokens=False)})
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)
    return 0


def logits(a):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(2)
    refs = load_file(a.ref)
    model = AutoModelForCausalLM.from_pretrained(a.dir, dtype=torch.float32).eval()
    AutoTokenizer.from_pretrained(a.dir)  # the folder's tokenizer loads too
    with torch.no_grad():
        got = model(refs["ids"]).logits
    diff = (got - refs["logits"]).abs().max().item()
    print(f"logits {a.dir}: {type(model).__name__} max |HF - ours| = {diff:.3g}")
    return 0 if diff <= 1e-4 else 1


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tokens")
    t.add_argument("--tokenizer", required=True)
    t.add_argument("--texts", required=True)
    t.add_argument("--out", required=True)
    g = sub.add_parser("logits")
    g.add_argument("--dir", required=True)
    g.add_argument("--ref", required=True)
    a = ap.parse_args()
    return tokens(a) if a.cmd == "tokens" else logits(a)


if __name__ == "__main__":
    sys.exit(main())

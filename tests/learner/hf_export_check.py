"""Loads an exported folder with HF transformers and compares its logits with ours.

    hf_export_check.py OUT_DIR REF.safetensors
REF holds "ids" (int64 [B, T]) and "logits" (fp32 [B, T, V]) computed by the C++ model.
Exit 0: match; 1: mismatch; 3: transformers is not importable (the test skips).
"""
import json
import sys

try:
    import torch
    import transformers
    from safetensors.torch import load_file
except ImportError as e:  # the C++ test turns this into GTEST_SKIP
    print(f"hf_export_check: cannot import transformers/safetensors: {e}")
    sys.exit(3)


def main() -> int:
    out, ref_path = sys.argv[1], sys.argv[2]
    ref = load_file(ref_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        got = model(input_ids=ref["ids"]).logits.float()
    err = (got - ref["logits"]).abs().max().item()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    text = "int main() { return 0; }"
    roundtrip = tok.decode(tok(text)["input_ids"])
    gen = transformers.GenerationConfig.from_pretrained(out)
    report = {"max_abs_logit_err": err, "tokenizer_roundtrip": roundtrip == text,
              "eos_token_id": gen.eos_token_id, "transformers": transformers.__version__}
    print(json.dumps(report))
    return 0 if err < 1e-4 and roundtrip == text else 1


if __name__ == "__main__":
    sys.exit(main())

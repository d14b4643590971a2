"""Loads an exported PEFT adapter onto its base with peft and compares logits with ours.

    peft_adapter_check.py BASE_DIR ADAPTER_DIR REF.safetensors
BASE_DIR: the HF folder of the frozen base; ADAPTER_DIR: tools/export's PEFT folder
(adapter_config.json + adapter_model.safetensors). REF holds "ids" (int64 [B, T]) and
"logits" (fp32 [B, T, V]) from the C++ learner's unmerged LoRA forward.
Exit 0: match; 1: mismatch; 3: peft or transformers is not importable (the test skips).
"""
import json
import sys

try:
    import peft
    import torch
    import transformers
    from safetensors.torch import load_file
except ImportError as e:  # the C++ test turns this into GTEST_SKIP
    print(f"peft_adapter_check: cannot import peft/transformers/safetensors: {e}")
    sys.exit(3)


def main() -> int:
    base_dir, adapter_dir, ref_path = sys.argv[1], sys.argv[2], sys.argv[3]
    ref = load_file(ref_path)
    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    with torch.no_grad():
        base_logits = base(input_ids=ref["ids"]).logits.float()
    model = peft.PeftModel.from_pretrained(base, adapter_dir)
    model.eval()
    # Every adapter tensor of the folder must have been taken up by a LoRA layer.
    loaded = sum(1 for n, _ in model.named_parameters() if "lora_" in n)
    with torch.no_grad():
        got = model(input_ids=ref["ids"]).logits.float()
    err = (got - ref["logits"]).abs().max().item()
    moved = (base_logits - ref["logits"]).abs().max().item()
    report = {"max_abs_logit_err": err, "adapter_effect": moved, "lora_tensors": loaded,
              "peft": peft.__version__, "transformers": transformers.__version__}
    print(json.dumps(report))
    return 0 if err < 1e-4 and moved > 1e-4 and loaded > 0 else 1


if __name__ == "__main__":
    sys.exit(main())

"""tools/verify-kernelbench on a CUDA-L1-style JSONL of three records (CPU backend): an honest
load_inline ReLU, an fp16-output cheat, a record without code. Checks the per-problem rows,
both protocols' metrics and the exit status; two at once (--jobs 2), and a second run with the
same OUT takes the kept rows instead of verifying again. Run by ctest (ModelNewTest.VerifyKernelbenchTool)."""
import json
import os
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(os.path.dirname(here)))
build = os.environ.get("KF_BUILD_DIR", os.path.join(root, "build"))


def read(rel):
    with open(os.path.join(here, rel)) as f:
        return f.read()


def main():
    tmp = tempfile.mkdtemp(prefix="kf-vk-test-")
    src = os.path.join(tmp, "candidates.jsonl")
    with open(src, "w") as f:
        f.write(json.dumps({"level_id": 1, "task_id": 1, "custom_code": read("cpu/good_relu_inline.py"),
                            "score_default": 1.5}) + "\n")
        f.write(json.dumps({"problem": "004_sigmoid", "code": read("cpu/fp16_output_relu.py")}) + "\n")
        f.write(json.dumps({"level_id": 1, "task_id": 5, "custom_code": None}) + "\n")
    out = os.path.join(tmp, "out")
    cmd = [os.path.join(root, "tools", "verify-kernelbench"), src, "--backend", "cpu", "--tasks",
           os.path.join(build, "tasks"), "--out", out, "--kb-trials", "3", "--trials", "3", "--jobs", "2",
           "--cache", os.path.join(build, "evaluator-test-cache")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    sys.stdout.write(p.stdout)
    sys.stderr.write(p.stderr)
    assert p.returncode == 0, "exit %d" % p.returncode
    rows = {r["problem"]: r for r in map(json.loads, open(os.path.join(out, "results.jsonl")))}
    assert rows["level1/1"]["task"] == "001_relu", rows["level1/1"]
    assert rows["level1/1"]["verdict"] == "ok" and rows["level1/1"]["torch_only"] is False, rows["level1/1"]
    assert rows["level1/1"]["kb_correct"] is True, rows["level1/1"]
    assert rows["004_sigmoid"]["verdict"] == "rejected_cheat", rows["004_sigmoid"]
    assert "precision downgrade" in rows["004_sigmoid"]["reason"], rows["004_sigmoid"]
    assert rows["level1/5"]["verdict"] == "no_candidate", rows["level1/5"]
    m = json.load(open(os.path.join(out, "metrics.json")))
    assert m["ours"]["problems"] == 3 and m["ours"]["correct"] == 1, m
    assert abs(m["ours"]["correct_pct"] - 100.0 / 3) < 1e-6, m
    assert m["ours"]["fast_0"] == m["ours"]["correct_pct"], m
    assert m["kernelbench"]["correct"] >= 1, m
    assert m["ours"]["geomean_speedup"] > 0, m
    assert m["reported_n"] == 1 and abs(m["reported_geomean"] - 1.5) < 1e-9, m
    table = open(os.path.join(out, "table.md")).read()
    for words in ("| fast_1.5 % |", "| geomean speedup (correct) |", "001_relu", "torch only", "KernelBench protocol"):
        assert words in table, words

    # Again with the same OUT: the verified rows are kept (their timings unchanged), not redone.
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, "second run: exit %d\n%s" % (again.returncode, again.stderr)
    rows2 = {r["problem"]: r for r in map(json.loads, open(os.path.join(out, "results.jsonl")))}
    for k in ("level1/1", "004_sigmoid"):
        assert rows2[k]["seconds"] == rows[k]["seconds"] and rows2[k]["verdict"] == rows[k]["verdict"], (rows[k], rows2[k])
    print("verify-kernelbench test: ok")


if __name__ == "__main__":
    main()

"""tools/import-tasks on bad and foreign problem files: clear errors, no broken artifacts."""
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
from pathlib import Path

SRC = Path(os.environ.get("KF_SOURCE_DIR", Path(__file__).resolve().parents[2]))
IMPORTER = SRC / "tasks" / "importer" / "kf_import.py"

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"

BAD = {
    "syntax_error": ("def broken(:\n", "SyntaxError"),
    "no_get_inputs": ("class Model(nn.Module):\n    def forward(self, x): return x\ndef get_init_inputs(): return []\n",
                      "missing 'get_inputs'"),
    "not_a_module": ("class Model:\n    pass\ndef get_inputs(): return [torch.randn(3)]\ndef get_init_inputs(): return []\n",
                     "subclass of torch.nn.Module"),
    "data_dependent": ("""
class Model(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x - 1
def get_inputs(): return [torch.randn(16)]
def get_init_inputs(): return []
""", "data-dependent"),
    "random_forward": ("""
class Model(nn.Module):
    def forward(self, x):
        return x + torch.randn_like(x)
def get_inputs(): return [torch.randn(16)]
def get_init_inputs(): return []
""", "random op"),
    "dropout_train": ("""
class Model(nn.Module):
    def __init__(self):
        super().__init__(); self.d = nn.Dropout(0.3)
    def forward(self, x):
        return self.d(x)
def get_inputs(): return [torch.randn(16)]
def get_init_inputs(): return []
KF_MODE = "train"
""", "dropout"),
    "mutates_input": ("""
class Model(nn.Module):
    def forward(self, x):
        x.mul_(2)
        return x + 1
def get_inputs(): return [torch.randn(16)]
def get_init_inputs(): return []
""", "modif"),
    "non_tensor_output": ("""
class Model(nn.Module):
    def forward(self, x):
        return x.shape[0]
def get_inputs(): return [torch.randn(16)]
def get_init_inputs(): return []
""", "not a tensor"),
    "bad_mode": ("""
class Model(nn.Module):
    def forward(self, x):
        return x * 2
def get_inputs(): return [torch.randn(16)]
def get_init_inputs(): return []
KF_MODE = "inference"
""", "KF_MODE"),
    "bad_sizes": ("""
class Model(nn.Module):
    def forward(self, x):
        return x * 2
n = 4
def get_inputs(): return [torch.randn(n)]
def get_init_inputs(): return []
KF_SIZES = {"cpu": {"m": 3}}
""", "size constant 'm'"),
    "nonfinite": ("""
class Model(nn.Module):
    def forward(self, x):
        return torch.log(x)
def get_inputs(): return [torch.randn(64)]
def get_init_inputs(): return []
""", "not finite"),
}

# A KernelBench-style file (no KF_* extras, sizes as module constants, level from the folder).
FOREIGN = """
class Model(nn.Module):
    \"\"\"Simple model that performs a matmul followed by a scaled softmax.\"\"\"
    def __init__(self, in_features, out_features, scale):
        super(Model, self).__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = scale
    def forward(self, x):
        return torch.softmax(self.linear(x) * self.scale, dim=1)

batch_size = 32
in_features = 64
out_features = 48
scale = 2.0

def get_inputs():
    return [torch.randn(batch_size, in_features)]

def get_init_inputs():
    return [in_features, out_features, scale]
"""


def run_import(paths, out, *extra):
    return subprocess.run([sys.executable, str(IMPORTER), *map(str, paths), "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=600)


class ImporterTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.root = Path(cls.tmp.name)
        (cls.root / "bad").mkdir()
        for name, (body, _) in BAD.items():
            (cls.root / "bad" / f"{name}.py").write_text(HEADER + textwrap.dedent(body))
        (cls.root / "level2").mkdir()
        (cls.root / "level2" / "42_Matmul_Scale_Softmax.py").write_text(HEADER + FOREIGN)
        cls.bad_out = cls.root / "bad_out"
        cls.bad_result = run_import([cls.root / "bad"], cls.bad_out)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_every_bad_file_is_rejected_with_its_reason(self):
        r = self.bad_result
        self.assertEqual(r.returncode, len(BAD), r.stdout + r.stderr)  # the exit status counts failures
        self.assertNotIn("Traceback", r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), len(BAD), r.stderr)  # one line each
        lines = r.stderr.splitlines()
        for name, (_, reason) in BAD.items():
            with self.subTest(name=name):
                path = str(self.root / "bad" / f"{name}.py")
                mine = [l for l in lines if l.startswith(path)]
                self.assertTrue(mine, f"no error line naming {path}:\n{r.stderr[-3000:]}")
                self.assertIn(reason, " ".join(mine))

    def test_no_artifact_is_left_for_a_bad_file(self):
        leftovers = sorted(p.name for p in self.bad_out.iterdir()) if self.bad_out.exists() else []
        self.assertEqual(leftovers, [])

    def test_foreign_kernelbench_file_imports_with_level_from_folder(self):
        out = self.root / "foreign_out"
        r = run_import([self.root / "level2"], out)
        self.assertEqual(r.returncode, 0, r.stderr)
        meta = json.loads((out / "42_Matmul_Scale_Softmax" / "task.json").read_text())
        self.assertEqual(meta["level"], 2)
        self.assertEqual(meta["mode"], "train")  # nn.Module's own default
        self.assertEqual(meta["mode_source"], "default")
        cpu = meta["backends"]["cpu"]
        self.assertEqual(cpu["inputs"][0]["shape"], [32, 64])
        self.assertEqual([p["name"] for p in cpu["params"]], ["linear.weight", "linear.bias"])
        self.assertEqual(cpu["outputs"][0]["shape"], [32, 48])
        self.assertEqual(meta["degenerate"], [])
        # Default-init parameters are stored as the init recipe, not as tensors.
        self.assertEqual(cpu["params_storage"], {"recipe": 2, "file": 0, "init": "cpu.init.json"})
        self.assertFalse((out / "42_Matmul_Scale_Softmax" / "cpu.params.safetensors").exists())
        for f in ("cpu.graph.json", "cpu.inputs.json", "cpu.init.json", "cpu.golden.safetensors"):
            self.assertTrue((out / "42_Matmul_Scale_Softmax" / f).exists(), f)

    def test_skip_fresh_reimports_after_the_importer_changed(self):
        # A copy of the importer, so that its files' times can be moved without touching the tree.
        imp = self.root / "importer_copy"
        imp.mkdir()
        for f in IMPORTER.parent.glob("*.py"):
            (imp / f.name).write_bytes(f.read_bytes())
        out = self.root / "fresh_out"
        art = out / "42_Matmul_Scale_Softmax" / "task.json"

        def imp_run():
            return subprocess.run([sys.executable, str(imp / IMPORTER.name), str(self.root / "level2"), "--out", str(out),
                                   "--skip-fresh"], capture_output=True, text=True, timeout=600)
        past = time.time() - 3600
        for f in imp.glob("*.py"):
            os.utime(f, (past, past))
        os.utime(self.root / "level2" / "42_Matmul_Scale_Softmax.py", (past, past))
        r = imp_run()
        self.assertEqual(r.returncode, 0, r.stderr)
        first = art.stat().st_mtime_ns
        r = imp_run()
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(art.stat().st_mtime_ns, first, "a fresh artifact was imported again")
        future = art.stat().st_mtime + 60
        os.utime(imp / IMPORTER.name, (future, future))  # the importer changed after the import
        r = imp_run()
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotEqual(art.stat().st_mtime_ns, first, "an artifact older than the importer was kept")

    def test_size_override_and_cuda_size_import_without_gpu(self):
        out = self.root / "size_out"
        r = run_import([self.root / "level2"], out, "--backends", "cpu,cuda", "--size", "cuda:batch_size=4096")
        self.assertEqual(r.returncode, 0, r.stderr)
        meta = json.loads((out / "42_Matmul_Scale_Softmax" / "task.json").read_text())
        self.assertEqual(meta["backends"]["cuda"]["inputs"][0]["shape"], [4096, 64])
        self.assertEqual(meta["backends"]["cpu"]["inputs"][0]["shape"], [32, 64])

    def test_task_whose_inputs_exceed_memory_is_refused_without_traceback(self):
        d = self.root / "huge"
        d.mkdir()
        # 80 GiB of float32 input: never allocated (the estimate runs on meta tensors).
        (d / "huge_input.py").write_text(HEADER + textwrap.dedent("""
            class Model(nn.Module):
                def forward(self, x):
                    return x * 2
            def get_inputs(): return [torch.randn(80 * 2**30 // 4)]
            def get_init_inputs(): return []
            """))
        r = run_import([d], self.root / "huge_out")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        self.assertIn("huge_input.py [cpu]: the cpu golden run needs an estimated", r.stderr)
        # 3 copies of the input, the output kept, the forward's own peak (its output)
        self.assertIn(str(5 * 80 * 2**30) + " bytes", r.stderr)
        self.assertIn("inputs " + str(80 * 2**30), r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertFalse((self.root / "huge_out" / "huge_input").exists())
        # A small limit refuses a small task too; the limit itself is validated.
        r = run_import([self.root / "level2"], self.root / "small_out", "--max-memory-gb", "0.0000001")
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("42_Matmul_Scale_Softmax.py [cpu]: the cpu golden run needs an estimated", r.stderr)
        r = run_import([self.root / "level2"], self.root / "small_out", "--max-memory-gb", "-1")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--max-memory-gb", r.stderr)

    def test_degenerate_reference_is_flagged(self):
        d = self.root / "degen"
        d.mkdir()
        (d / "const.py").write_text(HEADER + textwrap.dedent("""
            class Model(nn.Module):
                def forward(self, x):
                    return x * 0 + 1
            def get_inputs(): return [torch.randn(8, 8)]
            def get_init_inputs(): return []
        """))
        out = self.root / "degen_out"
        r = run_import([d], out)
        self.assertEqual(r.returncode, 0, r.stderr)
        meta = json.loads((out / "const" / "task.json").read_text())
        self.assertTrue(meta["degenerate"], "a constant output must be flagged degenerate")

    def test_unknown_backend_is_a_usage_error(self):
        r = run_import([self.root / "level2"], self.root / "x", "--backends", "tpu")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("unknown backend", r.stderr)


if __name__ == "__main__":
    unittest.main()

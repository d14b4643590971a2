"""tools/import-tasks on the failure classes a KernelBench import meets (tests/tasks/problems/).

Each problem file reproduces one class; the test says what the importer must say or do:
one line naming the file and the reason for a refusal, never a traceback, and for the
problems it can import, what task.json records about how.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

SRC = Path(os.environ.get("KF_SOURCE_DIR", Path(__file__).resolve().parents[2]))
IMPORTER = SRC / "tasks" / "importer" / "kf_import.py"
PROBLEMS = SRC / "tests" / "tasks" / "problems"


def run_import(paths, out, *extra):
    return subprocess.run([sys.executable, str(IMPORTER), *map(str, paths), "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=900)


def task_json(out, name):
    return json.loads((Path(out) / name / "task.json").read_text())


class KernelBenchClassesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.root = Path(cls.tmp.name)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def lines_for(self, r, name):
        path = str(PROBLEMS / f"{name}.py")
        return [l for l in r.stderr.splitlines() if l.startswith(path)]

    def assert_refused(self, name, *reasons, extra=()):
        out = self.root / f"out_{name}"
        r = run_import([PROBLEMS / f"{name}.py"], out, "--backends", "cuda", *extra)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        mine = self.lines_for(r, name)
        self.assertEqual(len(mine), 1, r.stderr)
        for reason in reasons:
            self.assertIn(reason, mine[0])
        self.assertFalse((out / name).exists(), "a refused problem leaves no artifact")
        return mine[0]

    def test_meta_init_failure_builds_the_model_on_the_cpu(self):
        out = self.root / "meta_init"
        r = run_import([PROBLEMS / "meta_init_item.py"], out, "--backends", "cpu,cuda", "--size", "cuda:batch_size=512")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        meta = task_json(out, "meta_init_item")
        for b in ("cpu", "cuda"):
            self.assertTrue(meta["backends"][b]["built_on"].startswith("cpu (on meta:"), meta["backends"][b]["built_on"])
            self.assertIn("item()", meta["backends"][b]["built_on"])
            self.assertEqual(len(meta["backends"][b]["params"]), 6)
        self.assertEqual(meta["backends"]["cuda"]["inputs"][0]["shape"], [512, 32])
        self.assertTrue((out / "meta_init_item" / "cpu.golden.safetensors").exists())

    def test_forward_tensor_constant_is_stored_with_its_value(self):
        out = self.root / "const"
        r = run_import([PROBLEMS / "forward_tensor_constant.py"], out, "--backends", "cpu,cuda")
        self.assertEqual(r.returncode, 0, r.stderr)
        meta = task_json(out, "forward_tensor_constant")
        for b in ("cpu", "cuda"):
            be = meta["backends"][b]
            self.assertTrue(be["built_on"].startswith("cpu (on meta:"), be["built_on"])
            names = [p["name"] for p in be["params"]]
            self.assertEqual(names[:2], ["linear.weight", "linear.bias"])
            self.assertEqual(len(names), 4, names)  # + self.offset and torch.tensor(0.25), lifted
            # The linear's init and self.offset (an attribute of the built model) come from the
            # recipe; torch.tensor(0.25), made inside forward, has its value in the file.
            self.assertEqual(be["params_storage"]["recipe"], 3, be["params_storage"])
            self.assertEqual(be["params_storage"]["file"], 1, be["params_storage"])

    def test_dropout_in_train_mode_needs_an_explicit_mode(self):
        line = self.assert_refused("dropout_train", "dropout with p=0.2 in train mode", "--mode eval")
        self.assertIn("[cuda]", line)
        out = self.root / "dropout_eval"
        r = run_import([PROBLEMS / "dropout_train.py"], out, "--backends", "cpu,cuda", "--mode", "eval")
        self.assertEqual(r.returncode, 0, r.stderr)
        meta = task_json(out, "dropout_train")
        self.assertEqual(meta["mode"], "eval")
        self.assertEqual(meta["mode_source"], "--mode")
        self.assertEqual(meta["degenerate"], [])

    def test_randomness_in_forward_is_refused(self):
        self.assert_refused("randn_forward", "randomness inside forward", "randn")
        # --mode eval does not make a random draw deterministic
        self.assert_refused("randn_forward", "randomness inside forward", extra=("--mode", "eval"))

    def test_missing_python_module_is_named(self):
        self.assert_refused("missing_module", "kf_package_that_is_not_installed", "not installed")

    def test_oversize_cpu_problem_is_scaled_down_and_recorded(self):
        out = self.root / "oversize"
        budget_gb = 0.02
        r = run_import([PROBLEMS / "oversize_cpu.py"], out, "--backends", "cpu,cuda", "--max-memory-gb", str(budget_gb))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        note = self.lines_for(r, "oversize_cpu")
        self.assertEqual(len(note), 1, r.stderr)
        self.assertIn("sizes scaled down", note[0])
        self.assertIn("batch_size 4096 ->", note[0])
        meta = task_json(out, "oversize_cpu")
        cpu, cuda = meta["backends"]["cpu"], meta["backends"]["cuda"]
        new_batch = cpu["scaled_sizes"]["batch_size"][1]
        self.assertEqual(cpu["scaled_sizes"]["batch_size"][0], 4096)
        self.assertLess(new_batch, 4096)
        self.assertEqual(list(cpu["scaled_sizes"]), ["batch_size"], "features stays: batch goes first")
        self.assertEqual(cpu["inputs"][0]["shape"], [new_batch, 1024])
        self.assertEqual(cuda["inputs"][0]["shape"], [4096, 1024], "the cuda backend keeps the file's sizes")
        self.assertLessEqual(cpu["memory"]["estimate_bytes"], budget_gb * 2**30)
        self.assertGreater(cpu["memory"]["estimate_bytes_at_file_sizes"], budget_gb * 2**30)
        self.assertTrue((out / "oversize_cpu" / "cpu.golden.safetensors").exists())

    def test_oversize_cpu_problem_that_cannot_scale_skips_the_cpu_backend(self):
        out = self.root / "oversize_fixed"
        r = run_import([PROBLEMS / "oversize_cpu_fixed.py"], out, "--backends", "cpu,cuda", "--max-memory-gb", "0.02")
        self.assertEqual(r.returncode, 0, r.stderr)
        note = self.lines_for(r, "oversize_cpu_fixed")
        self.assertEqual(len(note), 1, r.stderr)
        self.assertIn("the cpu golden run needs an estimated", note[0])
        self.assertIn("cpu backend skipped", note[0])
        meta = task_json(out, "oversize_cpu_fixed")
        self.assertEqual(list(meta["backends"]), ["cuda"])
        self.assertIn("cpu", meta["skipped_backends"])
        self.assertFalse((out / "oversize_cpu_fixed" / "cpu.golden.safetensors").exists())

    def test_compact_parameters_are_megabytes_where_full_ones_are_not(self):
        # A 4096 x 4096 linear at the cuda size: 64 MiB of weights in full, a few KB as a recipe.
        d = self.root / "big"
        d.mkdir()
        (d / "big_linear.py").write_text(
            "import torch\nimport torch.nn as nn\n"
            "class Model(nn.Module):\n"
            "    def __init__(self, n):\n        super().__init__(); self.l = nn.Linear(n, n)\n"
            "    def forward(self, x):\n        return torch.relu(self.l(x))\n"
            "batch_size = 16\nn = 4096\n"
            "def get_inputs(): return [torch.randn(batch_size, n)]\n"
            "def get_init_inputs(): return [n]\n")
        sizes = {}
        for mode in ("compact", "full"):
            out = self.root / f"big_{mode}"
            r = run_import([d], out, "--backends", "cuda", "--params", mode)
            self.assertEqual(r.returncode, 0, r.stderr)
            sizes[mode] = sum(f.stat().st_size for f in (out / "big_linear").iterdir())
        self.assertGreater(sizes["full"], 64 * 2**20)
        self.assertLess(sizes["compact"], 64 * 2**10, sizes)


if __name__ == "__main__":
    unittest.main()

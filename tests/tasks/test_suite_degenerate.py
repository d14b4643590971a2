#!/usr/bin/env python3
"""Degenerate tasks: tasks/check_suite.py's input-dependence check (it passes every changed
loss-like task of the suite at the CPU size, and fails a task whose loss of many iid terms
sits at its population value), and tools/score-policy leaving a degenerate task out of its
figures (read_report, make_rows and the table, on a report.json as tools/optimize writes it).
"""
import json
import os
import sys
import tempfile
import unittest

import torch

SRC = os.environ.get("KF_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(SRC, "tasks"))
sys.path.insert(0, os.path.join(SRC, "tools"))
import check_suite  # noqa: E402
import score_policy  # noqa: E402

LOSS_TASKS = ["level1/015_mean_dims02.py", "level1/041_mse_loss.py", "level1/042_cross_entropy.py",
              "level1/043_smooth_l1_loss.py", "level1/044_kl_div.py", "level1/045_cosine_loss.py",
              "level2/113_mse_of_linear.py", "level2/114_conv1d_relu_mean.py", "level2/118_cross_entropy_of_linear.py",
              "level2/122_triplet_margin.py", "level3/207_autoencoder.py", "level3/208_attention_pooling_classifier.py"]

# 041 as it was: iid terms only; at 2^24 terms its loss sits within ~2 tolerances of 1.29.
IID_MSE = '''"""MSE of iid inputs: the loss barely moves between input sets."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, pred, target):
        return F.mse_loss(pred, target)


batch = 16384
dim = 1024


def get_inputs():
    return [torch.randn(batch, dim), torch.randn(batch, dim) * 0.5 + 0.2]


def get_init_inputs():
    return []


KF_SIZES = {"cpu": {"batch": 16384, "dim": 1024}, "cuda": {"batch": 65536, "dim": 8192}}
KF_MODE = "eval"
'''


class CheckSuiteDependenceTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.set_num_threads(2)

    def dependence(self, path):
        mod, _, _ = check_suite.load(path, "cpu")
        model, _ = check_suite.build(mod)
        return check_suite.check_dependence(mod, model, "cpu size")

    def test_loss_like_suite_tasks_depend_on_their_inputs(self):
        for rel in LOSS_TASKS:
            with self.subTest(task=rel):
                problems, ratio = self.dependence(os.path.join(check_suite.SUITE, rel))
                self.assertEqual(problems, [])
                self.assertGreaterEqual(ratio, 1.0)

    def test_iid_loss_is_reported_degenerate(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "iid_mse.py")
            with open(path, "w") as f:
                f.write(IID_MSE)
            problems, ratio = self.dependence(path)
        self.assertLess(ratio, 1.0)
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("output 0 barely depends on the inputs", problems[0])

    def test_large_output_needs_many_elements_that_move(self):
        # 100 elements that move by 1000x the tolerance pass, 99 do not.
        base = torch.zeros(10000, dtype=torch.float64)
        sets = []
        for k in range(4):
            v = base.clone()
            v[:100] = float(k)
            sets.append([v])
        mod = type("M", (), {})()
        self.assertGreater(check_suite.dependence(mod, sets, [torch.float32], [10000])[0], 1.0)
        for s in sets:
            s[0][99] = 0.0
        self.assertEqual(check_suite.dependence(mod, sets, [torch.float32], [10000])[0], 0.0)


def optimize_report(degenerate):
    """A report.json as tools/optimize writes it: two candidates, one ok."""
    res = {"verdict": "ok", "task_degenerate": degenerate,
           "degenerate_reason": "reference output is (nearly) the same for different inputs" if degenerate else ""}
    return {"task": "041_mse_loss", "candidates": [
        {"index": 0, "verdict": "ok", "speedup": 10.1, "speedup_lo": 9.8, "speedup_hi": 10.3,
         "timing_unstable": False, "task_degenerate": degenerate, "result": res},
        {"index": 1, "verdict": "incorrect", "speedup": 0, "task_degenerate": False}]}


class ScorePolicyDegenerateTest(unittest.TestCase):
    def test_read_report_names_a_degenerate_task(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "report.json")
            for degenerate in (True, False):
                with open(path, "w") as f:
                    json.dump(optimize_report(degenerate), f)
                samples, ok, verdicts, speedups, why, unmeasured = score_policy.read_report(path)
                self.assertEqual((samples, ok, speedups, unmeasured), (2, 1, [10.1], []))
                if degenerate:
                    self.assertEqual(why, "reference output is (nearly) the same for different inputs")
                else:
                    self.assertIsNone(why)

    def test_degenerate_task_is_left_out_of_the_figures_and_noted(self):
        def rec(task, status, best, degenerate=None):
            return {"task": task, "split": "train", "level": 1, "status": status, "reason": "", "rc": 0,
                    "samples": 2, "ok": 1, "verdicts": {"ok": 1, "incorrect": 1}, "best_speedup": best,
                    "counted_speedup": best, "ok_speedups": [best], "degenerate": degenerate,
                    "seconds": 1.0, "out": "tasks/" + task, "log": "tasks/" + task + ".log"}
        records = [rec("001_relu", "scored", 1.5),
                   rec("041_mse_loss", "degenerate", 10.1, "reference output is (nearly) the same")]
        records[1]["reason"] = "task degenerate: reference output is (nearly) the same"
        rows = score_policy.make_rows(records)
        total = [r for r in rows if r["level"] == "all"][0]
        self.assertEqual(total["tasks"], 1)
        self.assertEqual(total["degenerate"], 1)
        self.assertEqual(total["not_scored"], 0)
        self.assertAlmostEqual(total["mean_speedup"], 1.5)
        meta = {"model": "m", "label": "", "n": 2, "backend": "cpu", "date": "d", "machine": "CPU"}
        summary, full = score_policy.table_md(meta, rows, records)
        self.assertIn("1 task(s) are degenerate", summary)
        self.assertIn("041_mse_loss (reference output is (nearly) the same)", summary)
        self.assertIn("degenerate: left out", full)
        # Counted (--include-degenerate): status scored, in the figures, and named.
        records[1]["status"] = "scored"
        rows = score_policy.make_rows(records)
        total = [r for r in rows if r["level"] == "all"][0]
        self.assertEqual(total["tasks"], 2)
        self.assertAlmostEqual(total["mean_speedup"], (1.5 + 10.1) / 2)
        self.assertIn("1 degenerate task(s) are counted (--include-degenerate): 041_mse_loss",
                      score_policy.table_md(meta, rows, records)[0])


class ScorePolicyUnmeasuredTest(unittest.TestCase):
    def test_a_verification_the_machine_failed_is_not_a_sample(self):
        # Three candidates: ok; runtime_error caused by the machine (a reference slowed by a
        # loaded host); its duplicate, whose result is the original's; and a kernel's own
        # runtime_error. Only the first and the last are samples.
        env = {"verdict": "runtime_error", "cause": "environment",
               "reason": "environment: the reference ran 2.4x slower in the timed trials"}
        rep = {"task": "001_relu", "candidates": [
            {"index": 0, "verdict": "ok", "cause": "kernel", "speedup": 1.2, "result": {"verdict": "ok"}},
            {"index": 1, "verdict": "runtime_error", "speedup": 0, "result": env},
            {"index": 2, "verdict": "runtime_error", "speedup": 0, "duplicate_of": 1},
            {"index": 3, "verdict": "runtime_error", "cause": "kernel", "reason": "kf_forward returned 3",
             "speedup": 0, "result": {"verdict": "runtime_error", "cause": "kernel"}}]}
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "report.json")
            with open(path, "w") as f:
                json.dump(rep, f)
            samples, ok, verdicts, speedups, _, unmeasured = score_policy.read_report(path)
            self.assertEqual((samples, ok, speedups), (2, 1, [1.2]))
            self.assertEqual(verdicts, {"ok": 1, "runtime_error": 1})
            self.assertEqual(len(unmeasured), 2)
            self.assertIn("2.4x slower", unmeasured[0])
            self.assertEqual(score_policy.unmeasured_in(path), unmeasured)
            self.assertEqual(score_policy.unmeasured_in(os.path.join(d, "none.json")), [])
        rec = {"task": "001_relu", "split": "train", "level": 1, "status": "scored", "reason": "", "rc": 0,
               "samples": 2, "not_measured": 2, "ok": 1, "verdicts": verdicts, "best_speedup": 1.2,
               "counted_speedup": 1.2, "ok_speedups": [1.2], "degenerate": None, "seconds": 1.0,
               "out": "tasks/001_relu", "log": "tasks/001_relu.log"}
        rows = score_policy.make_rows([rec])
        total = [r for r in rows if r["level"] == "all"][0]
        self.assertEqual((total["samples"], total["not_measured"]), (2, 2))
        self.assertAlmostEqual(total["correct_pct"], 50.0)
        meta = {"model": "m", "label": "", "n": 4, "backend": "cpu", "date": "d", "machine": "CPU"}
        summary, full = score_policy.table_md(meta, rows, [rec])
        self.assertIn("2 sample(s) were not measured", summary)
        self.assertIn("001_relu 2", summary)
        self.assertIn("not measured 2", full)


if __name__ == "__main__":
    unittest.main()

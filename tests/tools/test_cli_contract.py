"""Every tool in tools/ keeps one command-line contract: --help and --version print and
exit 0, an unknown option is a usage error with exit 2 and a message on stderr."""
import os
import subprocess
import sys
import unittest

TREE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = os.path.join(TREE, "tools")
VERSION = open(os.path.join(TREE, "VERSION")).read().strip()


def tool_names():
    return sorted(n for n in os.listdir(TOOLS)
                  if os.path.isfile(os.path.join(TOOLS, n)) and os.access(os.path.join(TOOLS, n), os.X_OK)
                  and not n.endswith(".py"))


def run(name, *args):
    return subprocess.run([os.path.join(TOOLS, name), *args], capture_output=True, text=True, timeout=120)


class CliContractTest(unittest.TestCase):
    def test_the_tool_list_is_complete(self):
        # A renamed or lost wrapper would silently drop out of the checks below.
        self.assertTrue({"eval", "launch", "optimize", "sft", "selfsup", "export", "report", "test"} <= set(tool_names()),
                        tool_names())

    def test_version(self):
        for name in tool_names():
            with self.subTest(tool=name):
                r = run(name, "--version")
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn("KernelForge " + VERSION, r.stdout + r.stderr)

    def test_help(self):
        for name in tool_names():
            with self.subTest(tool=name):
                r = run(name, "--help")
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertGreater(len(r.stdout.strip()), 40, f"{name} --help printed almost nothing")

    def test_unknown_option_is_a_usage_error(self):
        for name in tool_names():
            with self.subTest(tool=name):
                r = run(name, "--no-such-option")
                self.assertEqual(r.returncode, 2, f"stdout={r.stdout!r} stderr={r.stderr!r}")
                self.assertTrue(r.stderr.strip(), f"{name}: no message on stderr")
                self.assertNotIn("Traceback", r.stderr)


if __name__ == "__main__":
    unittest.main()

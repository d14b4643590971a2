#!/usr/bin/env python3
"""The layout rule of docs/layout.md: each component publishes one header, its facade.

  1. <comp>/include/kf/<comp>/ holds the facade and nothing else.
  2. No file outside <comp>/, tests/<comp>/ and bench/<comp>[_*]/ includes a kf/<comp>/
     header other than the facade, or reaches into <comp>/src/ (by a relative #include or
     a CMake include folder).
common/ is exempt from 1 and from the kf/common/ part of 2: it is a support library of
independent one-concern headers (error.h, log.h, config.h, ...), each included for what it
defines. Exit 0 when the tree follows the rule; else 1 with one line per violation
("file:line: what"). --self-test checks that a tree with each kind of violation fails.

usage: check_layout.py [--root DIR] [--self-test]
"""
import os
import re
import sys
import tempfile

# Facades whose name is not <comp>.h; None: no single facade (see above).
FACADE_NAME = {"launch": "launcher.h", "bench": "util.h", "common": None}
SOURCE_EXT = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh", ".inc")
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')
SKIP_DIRS = {"build", "third_party", "node_modules", "__pycache__"}


def components(root):
    """{comp: facade file name or None} for every <comp>/include/kf/<comp>/ folder."""
    out = {}
    for comp in sorted(os.listdir(root)):
        if os.path.isdir(os.path.join(root, comp, "include", "kf", comp)):
            out[comp] = FACADE_NAME.get(comp, comp + ".h")
    return out


def walk(root):
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        dirnames[:] = sorted(d for d in dirnames
                             if not d.startswith(".") and d not in SKIP_DIRS and not (rel == "." and d.startswith("build")))
        for f in sorted(filenames):
            yield os.path.normpath(os.path.join(rel, f))


def owner(path, comps=()):
    """The component a file belongs to: its top folder; X for tests/X/...; X for a
    benchmark of X (bench/X/... or bench/X_<what>/...), which, like a test, may measure
    the component's private pieces."""
    parts = path.split(os.sep)
    if parts[0] == "tests" and len(parts) > 2:
        return parts[1]
    if parts[0] == "bench" and len(parts) > 2:
        for comp in comps:
            if parts[1] == comp or parts[1].startswith(comp + "_"):
                return comp
    return parts[0]


def check(root):
    comps = components(root)
    problems = []
    for comp, facade in comps.items():
        if facade is None:
            continue
        folder = os.path.join(root, comp, "include", "kf", comp)
        for name in sorted(os.listdir(folder)):
            if name != facade:
                problems.append(f"{comp}/include/kf/{comp}/{name}: only the facade kf/{comp}/{facade} may be "
                                f"public; move it to {comp}/src/ (or fold what others need into the facade)")
        if not os.path.isfile(os.path.join(folder, facade)):
            problems.append(f"{comp}/include/kf/{comp}/: the facade {facade} is missing")
    for path in walk(root):
        mine = owner(path, comps)
        full = os.path.join(root, path)
        if path.endswith(SOURCE_EXT):
            try:
                lines = open(full, encoding="utf-8", errors="replace").read().split("\n")
            except OSError:
                continue
            for n, line in enumerate(lines, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                inc = m.group(1)
                parts = inc.split("/")
                if len(parts) >= 3 and parts[0] == "kf" and parts[1] in comps and parts[1] != mine:
                    facade = comps[parts[1]]
                    if facade is not None and "/".join(parts[2:]) != facade:
                        problems.append(f"{path}:{n}: includes {inc}; outside {parts[1]}/ only "
                                        f"kf/{parts[1]}/{facade} may be included")
                if ".." in parts:
                    target = os.path.normpath(os.path.join(os.path.dirname(path), inc)).split(os.sep)
                    if len(target) > 2 and target[0] in comps and target[1] == "src" and target[0] != mine:
                        problems.append(f"{path}:{n}: includes {inc}, a private file of {target[0]}/")
        elif os.path.basename(path) == "CMakeLists.txt" or path.endswith(".cmake"):
            try:
                text = open(full, encoding="utf-8", errors="replace").read()
            except OSError:
                continue
            for n, line in enumerate(text.split("\n"), 1):
                if "include_directories" not in line and "INCLUDE_DIRECTORIES" not in line:
                    continue
                for comp in re.findall(r"\$\{CMAKE_SOURCE_DIR\}/([A-Za-z_]+)/src\b", line):
                    if comp in comps and comp != mine:
                        problems.append(f"{path}:{n}: adds {comp}/src to an include path; outside {comp}/ "
                                        f"only its facade may be used")
    return problems


def self_test():
    """Each kind of violation in a small tree must be reported; the clean tree must pass."""
    def tree(files):
        d = tempfile.mkdtemp(prefix="kf-layout-")
        for rel, text in files.items():
            p = os.path.join(d, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            open(p, "w").write(text)
        return d
    clean = {
        "alpha/include/kf/alpha/alpha.h": "#pragma once\n",
        "alpha/src/piece.h": "#pragma once\n",
        "alpha/src/a.cpp": '#include "kf/alpha/alpha.h"\n#include "piece.h"\n',
        "beta/include/kf/beta/beta.h": '#pragma once\n#include "kf/alpha/alpha.h"\n',
        "tests/alpha/a_test.cpp": '#include "piece.h"\n',
        "tests/alpha/CMakeLists.txt": "target_include_directories(t PRIVATE ${CMAKE_SOURCE_DIR}/alpha/src)\n",
        "bench/alpha_scale/CMakeLists.txt": "target_include_directories(b PRIVATE ${CMAKE_SOURCE_DIR}/alpha/src)\n",
        "common/include/kf/common/log.h": "#pragma once\n",
        "common/include/kf/common/error.h": "#pragma once\n",
        "beta/src/b.cpp": '#include "kf/common/log.h"\n#include "kf/common/error.h"\n',
    }
    bad = {
        "second public header": {"alpha/include/kf/alpha/piece.h": "#pragma once\n"},
        "outside include of a non-facade header": {"beta/src/c.cpp": '#include "kf/alpha/piece.h"\n'},
        "relative include of another component's src": {"beta/src/d.cpp": '#include "../../alpha/src/piece.h"\n'},
        "CMake include folder of another component's src":
            {"beta/CMakeLists.txt": "target_include_directories(b PRIVATE ${CMAKE_SOURCE_DIR}/alpha/src)\n"},
        "missing facade": {"gamma/include/kf/gamma/other.h": "#pragma once\n"},
    }
    ok = True
    found = check(tree(clean))
    if found:
        print("self-test: the clean tree was reported:", *found, sep="\n  ")
        ok = False
    for what, extra in bad.items():
        found = check(tree({**clean, **extra}))
        if not found:
            print(f"self-test: not reported: {what}")
            ok = False
    print("self-test:", "ok" if ok else "FAILED")
    return ok


def main():
    args = sys.argv[1:]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if "--root" in args:
        i = args.index("--root")
        if i + 1 >= len(args):
            print("usage: check_layout.py [--root DIR] [--self-test]", file=sys.stderr)
            return 2
        root = args[i + 1]
        del args[i:i + 2]
    if "--self-test" in args:
        args.remove("--self-test")
        if not self_test():
            return 1
    if args:
        print(f"check_layout.py: unknown argument {args[0]}\nusage: check_layout.py [--root DIR] [--self-test]",
              file=sys.stderr)
        return 2
    problems = check(root)
    for p in problems:
        print(p)
    print(f"check_layout: {len(problems)} violation(s) of the one-facade rule (docs/layout.md)"
          if problems else "check_layout: every component publishes only its facade")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

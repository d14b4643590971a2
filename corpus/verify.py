#!/usr/bin/env python3
"""Verify the seed corpus with the project's evaluator (tools/eval --json).

  corpus/verify.py [--backend cpu|cuda] [--tasks T ...] [--not-ok] [--jobs N] [--compile-only]

Runs every manifest entry of the backend (optionally only the named tasks) through
tools/eval and writes corpus/verified_<backend>.json:

  {"header": {...how and where it was measured...},
   "<file relative to corpus/>": {"verdict": ..., "speedup": ..., "reason": ...}, ...}

and prints a table. Exit 1 if any kernel is not ok. Entries already in the file for
kernels still in the manifest are kept, and the file is rewritten after every result, so a
run over some tasks updates the file and an interrupted run loses nothing.

--compile-only (for CUDA on a machine without a GPU): compiles each kernel with nvcc and
the CompileService's CUDA flags (evaluator/include/kf/evaluator/evaluator.h), recording
verdict "compiled, not run" (or "compile_error" with the diagnostics).

Environment: KF_BUILD_DIR (where evaluator/kf-eval is built), KF_TASKS_DIR (imported tasks).
Python standard library only.
"""
import argparse
import concurrent.futures as cf
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# The CompileService's defaults (kf/evaluator/evaluator.h: CompileOptions::cuda_flags, cuda_arch).
NVCC = "/usr/local/cuda/bin/nvcc"
CUDA_FLAGS = ["-std=c++17", "-O3", "-shared", "-Xcompiler", "-fPIC"]
CUDA_LIBS = ["-lcublas"]
# Verification settings for a loaded 2-core machine: every check of the protocol runs
# (correctness sets, repeat, re-drawn parameters, stress, post-timing check); fewer
# timed trials than production, and no give-up on timing spread (a shared machine
# gives spreads of 2-16x; the speedups are then coarse, the verdicts are not affected).
QUICK_EVAL = ["--trials", "5", "--warmup", "1", "--correctness-sets", "2", "--max-spread", "1000", "--max-trials", "8"]


def eval_one(entry, backend, eval_args):
    path = os.path.join(HERE, entry["file"])
    cmd = [os.path.join(ROOT, "tools", "eval"), entry["task"], path, "--json", "--backend", backend] + eval_args
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode in (0, 1):
        try:
            j = json.loads(p.stdout)
            return {"verdict": j.get("verdict", "?"), "speedup": j.get("speedup"), "reason": j.get("reason", "") or j.get("diagnostics", "")[:400]}
        except json.JSONDecodeError:
            pass
    return {"verdict": "eval_error", "speedup": None, "reason": f"tools/eval exit {p.returncode}: {(p.stderr or p.stdout).strip()[:400]}"}


def compile_one(entry, arch):
    path = os.path.join(HERE, entry["file"])
    with tempfile.TemporaryDirectory(prefix="kf-corpus-nvcc-") as d:
        so = os.path.join(d, "kernel.so")
        cmd = [NVCC] + CUDA_FLAGS + [f"-arch={arch}", "-I", os.path.join(ROOT, "evaluator", "include"), path, "-o", so] + CUDA_LIBS
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=d)
        if p.returncode == 0 and os.path.isfile(so):
            return {"verdict": "compiled, not run", "speedup": None, "reason": ""}
        return {"verdict": "compile_error", "speedup": None, "reason": (p.stderr or p.stdout).strip()[:600]}


def summary(backend, path):
    """Per family: for each task, fastest / naive speedup; the median and range over tasks."""
    manifest = json.load(open(os.path.join(HERE, "manifest.json")))
    v = json.load(open(path))
    fam = {}
    for e in manifest:
        if e["backend"] != backend:
            continue
        r = v.get(e["file"])
        if not r or not isinstance(r.get("speedup"), (int, float)):
            continue
        fam.setdefault(e["family"], {}).setdefault(e["task"], {})[e["variant"]] = r["speedup"]
    print(f"{'family':<12} {'tasks':>5} {'kernels':>7} {'naive speedup (median)':>23} {'best speedup (median)':>22} {'best/naive: median [min, max]':>30}")
    for f in sorted(fam):
        ratios, naive, best, n = [], [], [], 0
        for t, vs in fam[f].items():
            n += len(vs)
            b = max(vs.values())
            best.append(b)
            if "naive" in vs and vs["naive"] > 0:
                naive.append(vs["naive"])
                ratios.append(b / vs["naive"])
        med = lambda xs: sorted(xs)[len(xs) // 2] if xs else float("nan")
        rng = f"{med(ratios):.1f}x [{min(ratios):.1f}, {max(ratios):.1f}]" if ratios else "-"
        print(f"{f:<12} {len(fam[f]):>5} {n:>7} {med(naive):>23.2f} {med(best):>22.2f} {rng:>30}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--tasks", nargs="*", help="only these tasks (default: all in the manifest)")
    ap.add_argument("--not-ok", action="store_true",
                    help="only the kernels whose recorded verdict is not ok (e.g. the 're-verify' entries)")
    ap.add_argument("--jobs", type=int, default=1, help="parallel evaluations (timings get noisier above 1)")
    ap.add_argument("--compile-only", action="store_true", help="CUDA: nvcc only, record 'compiled, not run'")
    ap.add_argument("--arch", default="sm_90", help="nvcc -arch for --compile-only")
    ap.add_argument("--full", action="store_true", help="production evaluator settings instead of the quick ones")
    ap.add_argument("--out", help="output JSON (default corpus/verified_<backend>.json)")
    ap.add_argument("--note", default="", help="text for the header (where and how it was measured)")
    ap.add_argument("--summary", action="store_true", help="only print the per-family speed spread of the recorded file")
    a = ap.parse_args()
    if a.summary:
        return summary(a.backend, a.out or os.path.join(HERE, f"verified_{a.backend}.json"))

    manifest = json.load(open(os.path.join(HERE, "manifest.json")))
    entries = [e for e in manifest if e["backend"] == a.backend and (not a.tasks or e["task"] in a.tasks)]
    if a.tasks:
        unknown = sorted(set(a.tasks) - {e["task"] for e in manifest})
        if unknown:
            print(f"verify.py: tasks not in the manifest: {', '.join(unknown)}", file=sys.stderr)
            return 2
    out_path = a.out or os.path.join(HERE, f"verified_{a.backend}.json")
    # The recorded verdicts, read once: earlier entries are kept (only those still in the
    # manifest; the file is rewritten after every result, so an interrupted run keeps what
    # it measured), and --not-ok picks the kernels to run from them.
    old = {}
    if os.path.isfile(out_path):
        try:
            old = json.load(open(out_path))
            why = "not a JSON object of kernel entries"
        except (json.JSONDecodeError, OSError) as err:
            old, why = None, f"unreadable ({err})"
        if not isinstance(old, dict):
            if a.not_ok:
                print(f"verify.py: --not-ok needs the recorded verdicts, but {out_path} is {why}", file=sys.stderr)
                return 2
            print(f"verify.py: {out_path} is {why}; rewriting it", file=sys.stderr)
            old = {}
    if a.not_ok:
        entries = [e for e in entries if not isinstance(old.get(e["file"]), dict) or old[e["file"]].get("verdict") != "ok"]
    if not entries:
        print("verify.py: nothing to verify", file=sys.stderr)
        return 2
    eval_args = [] if a.full else QUICK_EVAL
    valid = {e["file"] for e in manifest if e["backend"] == a.backend}
    # A kernel being re-run keeps its old entry until its new result arrives.
    kept = {k: v for k, v in old.items() if k != "header" and k in valid}
    header = old.get("header", {}) if isinstance(old.get("header"), dict) else {}
    header.update({
        "backend": a.backend,
        "updated": datetime.date.today().isoformat(),
        "host": f"{platform.node()} ({os.cpu_count()} cores)",
        "mode": "nvcc compile only (no GPU): kernels compiled with the CompileService's flags, not run" if a.compile_only
        else ("tools/eval, production settings" if a.full else "tools/eval " + " ".join(QUICK_EVAL)),
    })
    if a.note:
        header["note"] = a.note

    def write_out(results):
        merged = dict(kept)
        merged.update(results)
        doc = {"header": header}
        for k in sorted(merged):
            doc[k] = merged[k]
        tmp = out_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        os.replace(tmp, out_path)

    results = {}
    with cf.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as ex:
        futs = {}
        for e in entries:
            f = ex.submit(compile_one, e, a.arch) if a.compile_only else ex.submit(eval_one, e, a.backend, eval_args)
            futs[f] = e
        for f in cf.as_completed(futs):
            e = futs[f]
            r = f.result()
            results[e["file"]] = r
            write_out(results)
            sp = f"{r['speedup']:.3f}" if isinstance(r["speedup"], (int, float)) else "-"
            print(f"  {r['verdict']:<18} {sp:>7}  {e['file']}" + (f"  ({r['reason'][:120]})" if r["reason"] and r["verdict"] != "ok" else ""), flush=True)

    # Table: per task, variants with speedups.
    by_task = {}
    for e in entries:
        by_task.setdefault(e["task"], []).append(e)
    print(f"\n{'task':<28} {'variant':<34} {'verdict':<18} speedup")
    for t in sorted(by_task):
        for e in sorted(by_task[t], key=lambda e: e["variant"]):
            r = results[e["file"]]
            sp = f"{r['speedup']:.3f}" if isinstance(r["speedup"], (int, float)) else "-"
            print(f"{t:<28} {e['variant']:<34} {r['verdict']:<18} {sp}")
    good = {"ok", "compiled, not run"}
    bad = [k for k, r in results.items() if r["verdict"] not in good]
    print(f"\n{len(results) - len(bad)}/{len(results)} passed; wrote {os.path.relpath(out_path, ROOT)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""The compile step of a ModelNew candidate: python build_ext.py JOB

Runs confined like a kernel compile (evaluator/src/modelnew.cpp: a private filesystem view
with the toolchain, the Python install and JOB only, no network, user nobody). It imports
JOB/candidate.py with torch.utils.cpp_extension.load_inline building into JOB/ext/<key>/,
then builds ModelNew(*get_init_inputs()) on the meta device so that extensions loaded in
__init__ are built too, and writes JOB/manifest.json: {key: {"name", "so"}} for the worker.
Exit 0: built (the manifest may be empty: a torch-only candidate); 1: the candidate failed
(the error is the last line of stderr).
"""
import importlib.util
import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mn_common  # noqa: E402  defines: inline_key, normalise_inline_args, exec_task_source

import torch  # noqa: E402
import torch.utils.cpp_extension as cpp  # noqa: E402


def main():
    job = sys.argv[1]
    spec = mn_common.read_json(os.path.join(job, "spec.json"))
    manifest = {}
    real_load_inline = cpp.load_inline

    def load_inline(*args, **kwargs):
        kw = mn_common.normalise_inline_args(args, kwargs)
        key = mn_common.inline_key(kw)
        d = mn_common.ext_dir(job, key)
        os.makedirs(d, exist_ok=True)
        kw["build_directory"] = d
        kw["verbose"] = False
        mod = real_load_inline(**kw)
        so = getattr(mod, "__file__", None) if kw.get("is_python_module", True) else mod
        if not so:
            raise RuntimeError("load_inline built no loadable module for %r" % kw.get("name"))
        manifest[key] = {"name": kw["name"], "so": os.path.relpath(so, job)}
        return mod

    def load(*a, **k):
        raise RuntimeError("torch.utils.cpp_extension.load (source files) is not supported: a candidate is one "
                           "file; use load_inline")

    cpp.load_inline = load_inline
    cpp.load = load
    src_path = os.path.join(job, "candidate.py")
    try:
        spec_m = importlib.util.spec_from_file_location("kf_candidate", src_path)
        mod = importlib.util.module_from_spec(spec_m)
        sys.modules["kf_candidate"] = mod
        spec_m.loader.exec_module(mod)
        if not hasattr(mod, "ModelNew"):
            raise RuntimeError("the candidate defines no class ModelNew")
    except BaseException as e:  # the candidate's error: say it in one line, the traceback before it
        traceback.print_exc()
        lines = str(e).strip().splitlines()
        sys.stderr.write("modelnew build: %s: %s\n" % (type(e).__name__, lines[-1] if lines else ""))
        write(job, manifest)
        return 1
    # Extensions built in __init__: ModelNew on the meta device (no memory, no kernels run).
    try:
        ns = mn_common.exec_task_source(spec["source"], spec.get("sizes"))
        init = list(ns["get_init_inputs"]()) if "get_init_inputs" in ns else []
        with torch.device("meta"):
            model = mod.ModelNew(*init)
    except BaseException as e:
        sys.stderr.write("modelnew build: note: ModelNew(*get_init_inputs()) on the meta device failed (%s: %s); "
                         "only module-level load_inline calls were built\n" % (type(e).__name__, e))
        model = None
    # Extensions loaded lazily by forward (a helper that calls load_inline on first use):
    # forward on meta inputs reaches the call; the kernels themselves fail on meta, which is fine.
    if model is not None and "get_inputs" in ns:
        try:
            with torch.device("meta"):
                inputs = list(ns["get_inputs"]())
            with torch.no_grad():
                model(*inputs)
        except BaseException:
            pass
    write(job, manifest)
    return 0


def write(job, manifest):
    with open(os.path.join(job, mn_common.MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())

"""Shared by the ModelNew compile step (build_ext.py) and worker (worker.py).

A KernelBench-style candidate is a Python module defining `ModelNew`; it may build C++/CUDA
code with torch.utils.cpp_extension.load_inline. The compile step runs the module in a
confined process with the real load_inline, each extension built into
<job>/ext/<key>/; the worker, which may not run a compiler (seccomp: no exec), gets the
same call answered from there. `key` is a hash of everything that decides the build, so
the worker loads exactly what the compile step built for that call.
"""
import hashlib
import json
import os

MANIFEST = "manifest.json"


def inline_key(kwargs):
    """The content address of one load_inline call (its arguments, canonical JSON)."""
    canon = {}
    for k, v in sorted(kwargs.items()):
        if k in ("verbose", "build_directory", "keep_intermediates"):
            continue
        if isinstance(v, (list, tuple)):
            v = [str(x) for x in v]
        elif isinstance(v, dict):
            v = {str(a): str(b) for a, b in sorted(v.items())}
        elif not isinstance(v, (str, int, float, bool, type(None))):
            v = repr(v)
        canon[k] = v
    blob = json.dumps(canon, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


def normalise_inline_args(args, kwargs):
    """load_inline(name, cpp_sources, cuda_sources=None, functions=None, ...) as keywords."""
    names = ["name", "cpp_sources", "cuda_sources", "functions", "extra_cflags", "extra_cuda_cflags",
             "extra_ldflags", "extra_include_paths", "build_directory", "verbose", "with_cuda",
             "is_python_module", "with_pytorch_error_handling", "keep_intermediates", "use_pch"]
    out = dict(kwargs)
    for i, a in enumerate(args):
        if i >= len(names):
            raise TypeError("load_inline: too many positional arguments")
        if names[i] in out:
            raise TypeError("load_inline: argument %s given twice" % names[i])
        out[names[i]] = a
    for k in ("cpp_sources", "cuda_sources"):
        if isinstance(out.get(k), str):
            out[k] = [out[k]]
    if isinstance(out.get("functions"), str):
        out["functions"] = [out["functions"]]
    return out


def exec_task_source(source, sizes, filename="<task>"):
    """Runs the task's reference program with its size constants set to this backend's
    sizes (task.json backends.<b>.sizes); returns its namespace (Model, get_init_inputs)."""
    ns = {"__name__": "kf_task_reference", "__file__": filename}
    exec(compile(source, filename, "exec"), ns)
    for k, v in (sizes or {}).items():
        ns[k] = v
    return ns


def read_json(path):
    with open(path) as f:
        return json.load(f)


def ext_dir(job, key):
    return os.path.join(job, "ext", key)

"""Turns KernelBench-format problem files into task artifacts that C++ loads without Python.

For each problem file and backend ("cpu", "cuda") it writes, into <out>/<name>/:
  task.json                      meta, specs, tolerance, the source text
  <backend>.graph.json           Model.forward as an ATen graph (torch.export, eager ops kept)
  <backend>.inputs.json          get_inputs() as an ATen graph (make_fx; random factories kept)
  <backend>.params.safetensors   parameters, buffers and lifted constants (ABI order)
  cpu.golden.safetensors         eager inputs and outputs for seed 0 (tests compare C++ to it)

An artifact is written to a temporary folder and renamed into place only when every
check passed, so a problem the importer cannot handle never leaves a broken artifact.
Run through tools/import-tasks.
"""
from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import math
import operator
import os
import shutil
import struct
import sys
import time
import traceback
from pathlib import Path

import torch
from torch.fx.experimental.proxy_tensor import make_fx

FORMAT_VERSION = 1
INIT_SEED = 0      # torch.manual_seed before Model(*get_init_inputs())
GOLDEN_SEED = 0    # torch.manual_seed before get_inputs() for the golden file

# Default tolerance by output dtype (a task may set KF_TOLERANCE).
DEFAULT_TOL = {
    "float64": (1e-8, 1e-8),
    "float32": (1e-4, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (2e-2, 2e-2),
}

ST_DTYPE = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}

# Ops whose result depends on the RNG: not allowed in forward (the reference must be a function).
RANDOM_OPS = {"bernoulli", "rand", "randn", "randint", "rand_like", "randn_like", "randint_like",
              "normal", "uniform", "multinomial", "randperm", "exponential", "geometric",
              "cauchy", "log_normal", "native_dropout", "rrelu_with_noise", "poisson"}
DROPOUT_OPS = {"dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout"}


class ImportProblem(Exception):
    """A problem file the importer cannot turn into an artifact; the message says why."""


def physical_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def default_memory_limit() -> int:
    """Bytes a task's CPU working set may need: half of this machine's memory."""
    return physical_memory_bytes() // 2


def nbytes(t) -> int:
    return t.numel() * t.element_size()


def check_memory(name: str, bwhere: str, backend: str, meta_inputs, model_meta, out_vals, limit: int):
    """Refuses a task whose working set (from meta tensors, nothing allocated) exceeds `limit`.

    cpu: the importer runs the task here for its golden checks, which hold about 3 copies of
    the inputs and outputs and 4 of the parameters at once. cuda: the parameters are made
    here (on the CPU); the inputs are checked when C++ loads the task on the GPU."""
    inp = sum(nbytes(t) for t in meta_inputs if isinstance(t, torch.Tensor))
    par = sum(nbytes(t) for t in list(model_meta.parameters()) + list(model_meta.buffers()))
    out = sum(nbytes(t) for t in out_vals)
    need = 3 * inp + 4 * par + 3 * out if backend == "cpu" else par
    if limit > 0 and need > limit:
        gib = 1 << 30
        raise ImportProblem(
            f"{bwhere}: task {name} needs an estimated {need} bytes ({need / gib:.1f} GiB) to import "
            f"(inputs {inp} bytes, parameters {par}, outputs {out}), more than the limit of {limit} bytes "
            f"({limit / gib:.1f} GiB; --max-memory-gb, default half of this machine's memory); "
            f"lower its sizes (KF_SIZES or --size {backend}:NAME=VALUE)")


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


def load_module(path: Path):
    name = "kf_task_" + "".join(c if c.isalnum() else "_" for c in str(path))
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportProblem("cannot load as a Python module")
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except Exception as e:  # the file's own error, e.g. a SyntaxError
        raise ImportProblem(f"executing the file failed: {type(e).__name__}: {e}") from e
    for attr in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(mod, attr):
            raise ImportProblem(f"missing '{attr}' (KernelBench format needs class Model, get_inputs, get_init_inputs)")
    if not (isinstance(mod.Model, type) and issubclass(mod.Model, torch.nn.Module)):
        raise ImportProblem("'Model' must be a subclass of torch.nn.Module")
    return mod


def apply_sizes(mod, backend: str, defaults: dict, extra: dict):
    """Assigns the backend's size constants to module globals (get_inputs reads them at call time)."""
    sizes = dict(defaults)
    kf_sizes = getattr(mod, "KF_SIZES", None)
    if kf_sizes is not None:
        if not isinstance(kf_sizes, dict):
            raise ImportProblem("KF_SIZES must be a dict {backend: {constant: value}}")
        per = kf_sizes.get(backend, {})
        if not isinstance(per, dict):
            raise ImportProblem(f"KF_SIZES['{backend}'] must be a dict of constants")
        sizes.update(per)
    sizes.update(extra)
    for k, v in sizes.items():
        if k not in defaults and not hasattr(mod, k):
            raise ImportProblem(f"size constant '{k}' is not a module-level name of the file")
        setattr(mod, k, v)
    return {k: v for k, v in sizes.items()}


def module_mode(mod) -> str:
    mode = getattr(mod, "KF_MODE", "train")
    if mode not in ("train", "eval"):
        raise ImportProblem(f"KF_MODE must be 'train' or 'eval', got {mode!r}")
    return mode


def build_model(mod, device, mode):
    torch.manual_seed(INIT_SEED)
    init = mod.get_init_inputs()
    if not isinstance(init, (list, tuple)):
        raise ImportProblem("get_init_inputs() must return a list")
    with torch.device(device):
        model = mod.Model(*init)
    model.train(mode == "train")
    return model


# ---------------------------------------------------------------- graph serialisation

def encode_arg(a, where: str):
    if isinstance(a, torch.fx.Node):
        return {"n": a.name}
    if a is None or isinstance(a, bool):
        return a
    if isinstance(a, int):
        return a
    if isinstance(a, float):
        if math.isnan(a):
            return {"f": "nan"}
        if math.isinf(a):
            return {"f": "inf" if a > 0 else "-inf"}
        return {"f": a}
    if isinstance(a, str):
        return a
    if isinstance(a, (list, tuple)):
        return [encode_arg(x, where) for x in a]
    if isinstance(a, torch.dtype):
        return {"dtype": dtype_name(a)}
    if isinstance(a, torch.device):
        return {"device": a.type}
    if isinstance(a, torch.layout):
        return {"layout": str(a).replace("torch.", "")}
    if isinstance(a, torch.memory_format):
        return {"memory_format": str(a).replace("torch.", "")}
    raise ImportProblem(f"{where}: argument of unsupported type {type(a).__name__} ({a!r})")


def encode_const_tensor(t: torch.Tensor, where: str):
    if t.numel() > 65536:
        raise ImportProblem(f"{where}: tensor constant with {t.numel()} elements is too large to embed")
    t = t.detach().cpu().contiguous()
    return {"tensor": {"dtype": dtype_name(t.dtype), "shape": list(t.shape),
                       "data": t.reshape(-1).to(torch.float64 if t.is_floating_point() else torch.int64).tolist()}}


def check_random_op(op, node, where):
    base = op._schema.name.split("::")[-1].rstrip("_")
    if base in RANDOM_OPS:
        raise ImportProblem(f"{where}: forward calls random op {op} (node {node.name}); the reference must be deterministic")
    if base in DROPOUT_OPS:
        p = node.args[1] if len(node.args) > 1 else node.kwargs.get("p", 0.5)
        train = node.args[2] if len(node.args) > 2 else node.kwargs.get("train", True)
        if train and p and p > 0:
            raise ImportProblem(f"{where}: forward uses dropout with p={p} in train mode (random); use eval mode or p=0")


def serialize_nodes(graph: torch.fx.Graph, gm, where: str, forbid_random: bool):
    """Returns (placeholders, nodes, outputs) in JSON form."""
    placeholders, nodes, outputs = [], [], None
    for node in graph.nodes:
        if node.op == "placeholder":
            placeholders.append(node.name)
        elif node.op == "get_attr":
            value = getattr(gm, node.target)
            if not isinstance(value, torch.Tensor):
                raise ImportProblem(f"{where}: attribute {node.target} is not a tensor")
            nodes.append({"name": node.name, "const": encode_const_tensor(value, where)["tensor"]})
        elif node.op == "call_function":
            target = node.target
            if target is operator.getitem:
                src, idx = node.args
                if not isinstance(src, torch.fx.Node) or not isinstance(idx, int):
                    raise ImportProblem(f"{where}: unsupported getitem in node {node.name}")
                nodes.append({"name": node.name, "getitem": [src.name, idx]})
                continue
            if not isinstance(target, torch._ops.OpOverload):
                raise ImportProblem(
                    f"{where}: node {node.name} calls {target}, which is not an ATen operator "
                    "(higher-order ops such as torch.cond, no_grad regions or Python calls are not supported)")
            ns = target.namespace
            if ns not in ("aten", "prims"):
                raise ImportProblem(f"{where}: node {node.name} calls operator {target} outside the aten namespace")
            if forbid_random:
                check_random_op(target, node, where)
            schema = target._schema
            nodes.append({
                "name": node.name,
                "op": schema.name,
                "overload": schema.overload_name,
                "args": [encode_arg(a, f"{where}: node {node.name}") for a in node.args],
                "kwargs": {k: encode_arg(v, f"{where}: node {node.name}") for k, v in node.kwargs.items()},
            })
        elif node.op == "output":
            outs = node.args[0]
            if not isinstance(outs, (list, tuple)):
                outs = [outs]
            outputs = list(outs)
        else:
            raise ImportProblem(f"{where}: unsupported graph node kind {node.op} ({node.name})")
    return placeholders, nodes, outputs


def spec_of(t, name, role=None):
    d = {"name": name, "shape": list(t.shape), "dtype": dtype_name(t.dtype)}
    if role:
        d["role"] = role
    return d


def export_forward(mod, model_meta, meta_inputs, where):
    """torch.export of forward on meta tensors: the graph at any size without allocating it."""
    try:
        ep = torch.export.export(model_meta, tuple(meta_inputs), strict=False)
    except Exception as e:
        msg = str(e).strip().splitlines()
        head = msg[0] if msg else type(e).__name__
        hint = ""
        if "data-dependent" in str(e).lower() or "guardondatadependent" in type(e).__name__.lower():
            hint = " (data-dependent control flow or shapes are not supported)"
        raise ImportProblem(f"{where}: torch.export failed: {type(e).__name__}: {head}{hint}") from e
    return ep


def tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().cpu().contiguous()
    if t.numel() == 0:
        return b""
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def write_safetensors(path: Path, tensors: list[tuple[str, torch.Tensor]], metadata: dict | None = None):
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    for name, t in tensors:
        if t.dtype not in ST_DTYPE:
            raise ImportProblem(f"tensor {name} has dtype {t.dtype}, which safetensors cannot store")
        b = tensor_bytes(t)
        header[name] = {"dtype": ST_DTYPE[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - (len(h) + 8) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def import_backend(mod, backend: str, defaults: dict, extra_sizes: dict, mode: str, where: str, out: Path,
                   memory_limit: int = 0):
    sizes = apply_sizes(mod, backend, defaults, extra_sizes)
    bwhere = f"{where} [{backend}]"

    # Input generator: get_inputs() traced with fake tensors (no allocation at any size).
    try:
        gi = make_fx(lambda: list(mod.get_inputs()), tracing_mode="fake")()
    except Exception as e:
        raise ImportProblem(f"{bwhere}: tracing get_inputs() failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    _, in_nodes, in_outs = serialize_nodes(gi.graph, gi, bwhere + " get_inputs", forbid_random=False)
    in_out_json, baked = [], []
    for i, o in enumerate(in_outs):
        if isinstance(o, torch.fx.Node):
            in_out_json.append(o.name)
        else:
            baked.append({"index": i, "value": encode_arg(o, bwhere)})
    if not in_out_json:
        raise ImportProblem(f"{bwhere}: get_inputs() returned no tensors")

    # Shapes of get_inputs() without allocating: run it under meta as the default device.
    torch.manual_seed(GOLDEN_SEED)
    with torch.device("meta"):
        meta_inputs = list(mod.get_inputs())
    tensor_pos = [i for i, x in enumerate(meta_inputs) if isinstance(x, torch.Tensor)]
    if len(tensor_pos) != len(in_out_json):
        raise ImportProblem(f"{bwhere}: get_inputs() tensor outputs differ between tracing and meta run")

    model_meta = build_model(mod, "meta", mode)
    ep = export_forward(mod, model_meta, meta_inputs, bwhere)
    sig = ep.graph_signature
    placeholders, nodes, outs = serialize_nodes(ep.graph_module.graph, ep.graph_module, bwhere + " forward", True)
    out_vals = [o.meta["val"] for o in outs
                if isinstance(o, torch.fx.Node) and isinstance(o.meta.get("val"), torch.Tensor)]
    check_memory(Path(where).stem, bwhere, backend, meta_inputs, model_meta, out_vals, memory_limit)

    # Map graph placeholders to ABI slots.
    from torch.export.graph_signature import InputKind, OutputKind
    real_model = build_model(mod, "cpu", mode)
    state = dict(real_model.state_dict(keep_vars=True))
    named_params = dict(real_model.named_parameters())
    named_buffers = dict(real_model.named_buffers())
    consts = dict(ep.constants)
    graph_inputs, param_specs, param_tensors, input_specs = [], [], [], []
    user_i = 0
    plist = {"parameter": [], "buffer": [], "constant": []}
    for spec in sig.input_specs:
        ph = spec.arg.name if hasattr(spec.arg, "name") else None
        if spec.kind == InputKind.USER_INPUT:
            if isinstance(spec.arg, torch.export.graph_signature.TensorArgument):
                t = meta_inputs[tensor_pos[user_i]]
                input_specs.append(spec_of(t, f"x{user_i}"))
                graph_inputs.append({"placeholder": ph, "kind": "input", "index": user_i})
                user_i += 1
            # constant user inputs were specialised into the graph by export
        elif spec.kind == InputKind.PARAMETER:
            plist["parameter"].append((ph, spec.target, named_params[spec.target]))
        elif spec.kind == InputKind.BUFFER:
            plist["buffer"].append((ph, spec.target, named_buffers[spec.target]))
        elif spec.kind == InputKind.CONSTANT_TENSOR:
            plist["constant"].append((ph, spec.target, consts[spec.target]))
        else:
            raise ImportProblem(f"{bwhere}: unsupported export input kind {spec.kind}")
    if user_i != len(tensor_pos):
        raise ImportProblem(f"{bwhere}: export saw {user_i} tensor inputs, get_inputs() returned {len(tensor_pos)}")
    for role in ("parameter", "buffer", "constant"):
        for ph, target, t in plist[role]:
            idx = len(param_specs)
            abi_role = "buffer" if role == "constant" else role
            name = target if role != "constant" else "constant." + target
            t = t.detach()
            param_specs.append(spec_of(t, name, abi_role))
            param_tensors.append((name, t.contiguous()))
            graph_inputs.append({"placeholder": ph, "kind": "param", "index": idx})

    out_json, out_specs = [], []
    for spec, o in zip(sig.output_specs, outs):
        if spec.kind == OutputKind.USER_OUTPUT:
            if not isinstance(o, torch.fx.Node) or not isinstance(o.meta.get("val"), torch.Tensor):
                raise ImportProblem(f"{bwhere}: forward output {len(out_json)} is not a tensor")
            val = o.meta["val"]
            out_json.append({"node": o.name})
            out_specs.append(spec_of(val, f"y{len(out_specs)}"))
        elif spec.kind == OutputKind.BUFFER_MUTATION:
            idx = next(i for i, p in enumerate(param_specs) if p["name"] == spec.target)
            out_json.append({"node": o.name, "copy_to_param": idx})
        elif spec.kind == OutputKind.USER_INPUT_MUTATION:
            raise ImportProblem(f"{bwhere}: forward modifies its input in place; references must not mutate inputs")
        else:
            raise ImportProblem(f"{bwhere}: unsupported export output kind {spec.kind}")
    if not out_specs:
        raise ImportProblem(f"{bwhere}: forward returns no tensor")

    graph = {"format": FORMAT_VERSION, "graph_inputs": graph_inputs, "nodes": nodes, "outputs": out_json}
    inputs_graph = {"format": FORMAT_VERSION, "nodes": in_nodes, "outputs": in_out_json, "baked": baked}
    (out / f"{backend}.graph.json").write_text(json.dumps(graph))
    (out / f"{backend}.inputs.json").write_text(json.dumps(inputs_graph))
    write_safetensors(out / f"{backend}.params.safetensors", param_tensors, {"init_seed": INIT_SEED})
    info = {"sizes": {k: v for k, v in sizes.items() if isinstance(v, (int, float, bool, str))},
            "inputs": input_specs, "params": param_specs, "outputs": out_specs}
    return info, real_model


def golden_and_checks(mod, model, info, where: str, out: Path):
    """CPU only: eager outputs for the golden seed, plus determinism and degeneracy checks."""
    model_a = copy.deepcopy(model)
    torch.manual_seed(GOLDEN_SEED)
    inputs = [x for x in mod.get_inputs() if isinstance(x, torch.Tensor)]
    before = [x.clone() for x in inputs]
    with torch.no_grad():
        outs = model_a(*inputs)
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    for a, b in zip(inputs, before):
        if not torch.equal(a, b):
            raise ImportProblem(f"{where} [cpu]: forward modified an input tensor in place")
    for i, o in enumerate(outs):
        if not torch.isfinite(o).all() if o.is_floating_point() else False:
            raise ImportProblem(f"{where} [cpu]: output {i} is not finite for the task's own inputs")
    # Same inputs, fresh model copy: must give identical outputs (deterministic reference).
    with torch.no_grad():
        outs2 = copy.deepcopy(model)(*inputs)
    outs2 = list(outs2) if isinstance(outs2, (list, tuple)) else [outs2]
    for i, (a, b) in enumerate(zip(outs, outs2)):
        if not torch.equal(a, b):
            raise ImportProblem(f"{where} [cpu]: forward is not deterministic (output {i} differs between identical calls)")
    # Degenerate: output (nearly) constant or independent of the inputs.
    torch.manual_seed(GOLDEN_SEED + 1)
    other = [x for x in mod.get_inputs() if isinstance(x, torch.Tensor)]
    with torch.no_grad():
        outs3 = copy.deepcopy(model)(*other)
    outs3 = list(outs3) if isinstance(outs3, (list, tuple)) else [outs3]
    degenerate = []
    for i, (a, c) in enumerate(zip(outs, outs3)):
        af, cf = a.double(), c.double()
        scale = af.abs().max().item() if af.numel() else 0.0
        if torch.equal(a, c) or (scale > 0 and (af - cf).abs().max().item() <= 1e-6 * scale):
            degenerate.append(f"output {i} does not depend on the inputs")
        elif af.numel() > 1 and af.std().item() <= 1e-7 * max(scale, 1e-30):
            degenerate.append(f"output {i} is (nearly) constant")
    tensors = [(f"in{i}", x) for i, x in enumerate(inputs)] + [(f"out{i}", o) for i, o in enumerate(outs)]
    write_safetensors(out / "cpu.golden.safetensors", tensors, {"seed": GOLDEN_SEED})
    return degenerate


def task_tolerance(mod):
    tol = getattr(mod, "KF_TOLERANCE", None)
    if tol is None:
        return None
    if not (isinstance(tol, dict) and set(tol) <= {"atol", "rtol"} and all(isinstance(v, (int, float)) for v in tol.values())):
        raise ImportProblem("KF_TOLERANCE must be a dict with numeric 'atol' and/or 'rtol'")
    return {"atol": float(tol.get("atol", 0.0)), "rtol": float(tol.get("rtol", 0.0))}


def import_file(path: Path, out_root: Path, backends: list[str], extra_sizes: dict, memory_limit: int = 0) -> Path:
    where = str(path)
    mod = load_module(path)
    name = path.stem
    mode = module_mode(mod)
    level = getattr(mod, "KF_LEVEL", None)
    if level is None:  # KernelBench keeps levels as folder names: level1/, level2/ ...
        parent = path.parent.name.lower()
        level = int(parent[5:]) if parent.startswith("level") and parent[5:].isdigit() else 1
    tags = list(getattr(mod, "KF_TAGS", []))
    kf_sizes = getattr(mod, "KF_SIZES", None) or {}
    size_keys = {k for per in kf_sizes.values() if isinstance(per, dict) for k in per}
    size_keys |= {k for per in extra_sizes.values() for k in per}
    defaults = {k: getattr(mod, k) for k in size_keys if hasattr(mod, k)}
    tmp = out_root / f".tmp-{name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        meta_backends, degenerate = {}, []
        for b in backends:
            info, model = import_backend(mod, b, defaults, extra_sizes.get(b, {}), mode, where, tmp, memory_limit)
            meta_backends[b] = info
            if b == "cpu":
                degenerate = golden_and_checks(mod, model, info, where, tmp)
        meta = {
            "format": FORMAT_VERSION,
            "name": name,
            "source_file": str(path),
            "source": path.read_text(),
            "level": int(level),
            "tags": tags,
            "mode": mode,
            "tolerance": task_tolerance(mod),
            "default_tolerance": {k: {"atol": v[0], "rtol": v[1]} for k, v in DEFAULT_TOL.items()},
            "init_seed": INIT_SEED,
            "golden_seed": GOLDEN_SEED,
            "degenerate": degenerate,
            "torch_version": torch.__version__,
            "backends": meta_backends,
        }
        (tmp / "task.json").write_text(json.dumps(meta, indent=1))
        final = out_root / name
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        return final
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def parse_size_overrides(items):
    out = {}
    for it in items or []:
        try:
            backend, rest = it.split(":", 1)
            key, value = rest.split("=", 1)
            out.setdefault(backend, {})[key] = int(value) if value.lstrip("-").isdigit() else float(value)
        except ValueError:
            raise SystemExit(f"import-tasks: --size expects backend:NAME=VALUE, got {it!r}")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="import-tasks", description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", help="problem files or folders (searched recursively for *.py)")
    ap.add_argument("--out", required=True, help="artifact folder (one subfolder per task)")
    ap.add_argument("--backends", default="cpu", help="comma list of cpu,cuda (default: cpu)")
    ap.add_argument("--size", action="append", help="override a size constant: backend:NAME=VALUE")
    ap.add_argument("--skip-fresh", action="store_true", help="skip tasks whose artifact is newer than the file")
    ap.add_argument("--max-memory-gb", type=float, default=None,
                    help="refuse a task whose estimated import working set exceeds this (default: half of RAM)")
    args = ap.parse_args(argv)
    if args.max_memory_gb is not None and not args.max_memory_gb > 0:
        raise SystemExit(f"import-tasks: --max-memory-gb must be > 0, got {args.max_memory_gb}")
    memory_limit = int(args.max_memory_gb * (1 << 30)) if args.max_memory_gb else default_memory_limit()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    for b in backends:
        if b not in ("cpu", "cuda"):
            raise SystemExit(f"import-tasks: unknown backend {b!r} (cpu or cuda)")
    extra = parse_size_overrides(args.size)
    files = []
    for p in map(Path, args.paths):
        if p.is_dir():
            files += sorted(x for x in p.rglob("*.py") if not x.name.startswith("_"))
        elif p.is_file():
            files.append(p)
        else:
            print(f"{p}: no such file or folder", file=sys.stderr)
            return 2
    out_root = Path(args.out)
    out_root.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    failed, done, skipped = 0, 0, 0
    t0 = time.time()
    for f in files:
        art = out_root / f.stem / "task.json"
        if args.skip_fresh and art.exists() and art.stat().st_mtime >= f.stat().st_mtime:
            try:
                have = json.loads(art.read_text()).get("backends", {})
                if all(b in have for b in backends):
                    skipped += 1
                    continue
            except (OSError, ValueError):
                pass
        t = time.time()
        try:
            import_file(f, out_root, backends, extra, memory_limit)
            done += 1
            print(f"imported {f.stem:40s} {time.time() - t:6.2f}s", flush=True)
        except ImportProblem as e:
            failed += 1
            msg = str(e)
            print(msg if msg.startswith(str(f)) else f"{f}: {msg}", file=sys.stderr, flush=True)
        except MemoryError as e:  # an allocation the estimate did not foresee: still no traceback
            failed += 1
            print(f"{f}: out of memory while importing ({e}); lower its sizes or raise --max-memory-gb",
                  file=sys.stderr, flush=True)
        except Exception as e:  # a bug of ours or torch's: still name the file, keep going
            failed += 1
            print(f"{f}: internal importer error: {type(e).__name__}: {e}", file=sys.stderr)
            traceback.print_exc(limit=3)
    print(f"import-tasks: {done} imported, {skipped} up to date, {failed} failed ({time.time() - t0:.1f}s) -> {out_root}",
          flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

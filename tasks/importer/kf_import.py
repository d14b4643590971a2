"""Turns KernelBench-format problem files into task artifacts that C++ loads without Python.

For each problem file and backend ("cpu", "cuda") it writes, into <out>/<name>/:
  task.json                      meta, specs, tolerance, the source text
  <backend>.graph.json           Model.forward as an ATen graph (torch.export, eager ops kept)
  <backend>.inputs.json          get_inputs() as an ATen graph (make_fx; random factories kept)
  <backend>.init.json            Model(*get_init_inputs()) as an ATen graph: the parameters'
                                 init recipe, replayed from the init seed (kf_params.py)
  <backend>.params.safetensors   the tensors the recipe does not give (lifted constants, or all
                                 of them when the init cannot be traced), ABI order
  cpu.golden.safetensors         eager inputs and outputs for seed 0 (tests compare C++ to it)

An artifact is written to a temporary folder and renamed into place only when every
check passed, so a problem the importer cannot handle never leaves a broken artifact.
Every problem the importer cannot import gets one line on stderr naming the file and why.
Run through tools/import-tasks.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import importlib.util
import json
import logging
import math
import operator
import os
import shutil
import sys
import time
import warnings
from pathlib import Path

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import kf_memory
import kf_params

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

# Ops whose result depends on the RNG: not allowed in forward (the reference must be a function).
RANDOM_OPS = {"bernoulli", "rand", "randn", "randint", "rand_like", "randn_like", "randint_like",
              "normal", "uniform", "multinomial", "randperm", "exponential", "geometric",
              "cauchy", "log_normal", "native_dropout", "rrelu_with_noise", "poisson"}
DROPOUT_OPS = {"dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout"}

# How many size settings the cpu backend tries when a foreign problem is over the memory budget.
MAX_SCALING_TRIES = 40
MAX_SCALING_SECONDS = 300  # each try re-exports the graph (an LSTM's export alone takes minutes)
MAX_SHRINK = 8     # a size constant other than a batch is scaled to no less than 1/8 of its value


class ImportProblem(Exception):
    """A problem file the importer cannot turn into an artifact; the message says why."""


class Options:
    """What the command line chose, for every problem of one run."""
    def __init__(self, backends, extra_sizes, budget, mode=None, params="compact"):
        self.backends = backends        # ["cpu", "cuda"]
        self.extra_sizes = extra_sizes  # {backend: {NAME: value}} from --size
        self.budget = budget            # bytes the cpu golden run of one task may need
        self.mode = mode                # --mode: None, "train" or "eval" (files without KF_MODE)
        self.params = params            # "compact" (init recipe where possible) or "full"


def one_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


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
    except ModuleNotFoundError as e:
        raise ImportProblem(f"the file imports Python module '{e.name}', which is not installed "
                            f"(pip install {e.name}; KernelForge's requirements.txt lists the ones KernelBench uses)") from e
    except Exception as e:  # the file's own error, e.g. a SyntaxError
        raise ImportProblem(f"executing the file failed: {type(e).__name__}: {one_line(e)}") from e
    for attr in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(mod, attr):
            raise ImportProblem(f"missing '{attr}' (KernelBench format needs class Model, get_inputs, get_init_inputs)")
    if not (isinstance(mod.Model, type) and issubclass(mod.Model, torch.nn.Module)):
        raise ImportProblem("'Model' must be a subclass of torch.nn.Module")
    return mod


def numeric_constants(mod) -> dict:
    """The file's module-level numbers (KernelBench's size constants live there)."""
    return {k: v for k, v in vars(mod).items()
            if not k.startswith("_") and not k.startswith("KF_") and type(v) in (int, float)}


def apply_sizes(mod, backend: str, defaults: dict, extra: dict):
    """Resets the file's constants, then assigns the backend's sizes (get_inputs reads them at call time)."""
    for k, v in defaults.items():
        setattr(mod, k, v)
    sizes = {}
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
    return sizes


def task_mode(mod, flag):
    """(mode, source): the file's KF_MODE wins, then --mode, then nn.Module's own default (train)."""
    mode = getattr(mod, "KF_MODE", None)
    if mode is not None:
        if mode not in ("train", "eval"):
            raise ImportProblem(f"KF_MODE must be 'train' or 'eval', got {mode!r}")
        return mode, "KF_MODE"
    if flag is not None:
        return flag, "--mode"
    return "train", "default"


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
        raise ImportProblem(f"{where}: randomness inside forward: it calls random op {op} (node {node.name}); "
                            "the reference must be a deterministic function of its inputs and parameters")
    if base in DROPOUT_OPS:
        p = node.args[1] if len(node.args) > 1 else node.kwargs.get("p", 0.5)
        train = node.args[2] if len(node.args) > 2 else node.kwargs.get("train", True)
        if train and p and p > 0:
            raise ImportProblem(f"{where}: forward uses dropout with p={p} in train mode (random): import with "
                                "--mode eval to verify it in eval mode (dropout off; recorded in task.json), "
                                "or set KF_MODE = 'eval' in the file")


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


def export_error(e: Exception, where: str) -> ImportProblem:
    hint = ""
    if "data-dependent" in str(e).lower() or "guardondatadependent" in type(e).__name__.lower():
        hint = " (data-dependent control flow or shapes are not supported)"
    return ImportProblem(f"{where}: torch.export failed: {type(e).__name__}: {one_line(e)}{hint}")


def export_quietly(model, inputs):
    """torch.export, whose failures also print a partial graph to stderr: that goes nowhere
    (the refusal is one line), the exception carries the reason."""
    with contextlib.redirect_stderr(io.StringIO()):
        return torch.export.export(model, tuple(inputs), strict=False)


def fake_cpu_inputs(meta_inputs):
    """CPU fake tensors with the inputs' shapes: export of a real CPU model allocates no input."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    fm = FakeTensorMode()
    out = []
    with fm:
        for x in meta_inputs:
            out.append(torch.empty(x.shape, dtype=x.dtype, device="cpu") if isinstance(x, torch.Tensor) else x)
    return out


class Analysis:
    """One backend of one problem at one setting of its sizes: graphs and shapes, nothing allocated
    (unless the model had to be built on the CPU)."""


def analyse(mod, backend, defaults, sizes_extra, mode, bwhere) -> Analysis:
    a = Analysis()
    a.sizes = apply_sizes(mod, backend, defaults, sizes_extra)
    # Input generator: get_inputs() traced with fake tensors (no allocation at any size).
    try:
        gi = make_fx(lambda: list(mod.get_inputs()), tracing_mode="fake")()
    except Exception as e:
        raise ImportProblem(f"{bwhere}: tracing get_inputs() failed: {type(e).__name__}: {one_line(e)}") from e
    _, a.in_nodes, in_outs = serialize_nodes(gi.graph, gi, bwhere + " get_inputs", forbid_random=False)
    a.in_out_json, a.baked = [], []
    for i, o in enumerate(in_outs):
        if isinstance(o, torch.fx.Node):
            a.in_out_json.append(o.name)
        else:
            a.baked.append({"index": i, "value": encode_arg(o, bwhere)})
    if not a.in_out_json:
        raise ImportProblem(f"{bwhere}: get_inputs() returned no tensors")

    # Shapes of get_inputs() without allocating: run it under meta as the default device.
    torch.manual_seed(GOLDEN_SEED)
    with torch.device("meta"):
        a.meta_inputs = list(mod.get_inputs())
    a.tensor_pos = [i for i, x in enumerate(a.meta_inputs) if isinstance(x, torch.Tensor)]
    if len(a.tensor_pos) != len(a.in_out_json):
        raise ImportProblem(f"{bwhere}: get_inputs() tensor outputs differ between tracing and meta run")

    # forward: exported on meta (any size, nothing allocated). A module whose __init__ or
    # forward needs real tensors (.item() in __init__, a tensor made in forward and copied)
    # is built on the CPU at its init sizes instead, and exported against fake CPU inputs.
    a.built_on, a.model = "meta", None
    try:
        model = build_model(mod, "meta", mode)
        try:
            a.ep = export_quietly(model, a.meta_inputs)
        except Exception as e:
            if "meta" not in str(e).lower():
                raise export_error(e, bwhere) from e
            raise
        if any(isinstance(t, torch.Tensor) and t.is_meta for t in a.ep.constants.values()):
            raise RuntimeError("forward's tensor constants are meta tensors (their values are needed)")
        a.model = model
    except ImportProblem:
        raise
    except Exception as meta_error:
        a.built_on = f"cpu (on meta: {type(meta_error).__name__}: {one_line(meta_error)[:160]})"
        try:
            model = build_model(mod, "cpu", mode)
        except ImportProblem:
            raise
        except Exception as e:
            raise ImportProblem(f"{bwhere}: Model(*get_init_inputs()) failed: {type(e).__name__}: {one_line(e)}") from e
        try:
            a.ep = export_quietly(model, fake_cpu_inputs(a.meta_inputs))
        except Exception as e:
            raise export_error(e, bwhere) from e
        a.model = model
    a.placeholders, a.nodes, a.outs = serialize_nodes(a.ep.graph_module.graph, a.ep.graph_module, bwhere + " forward", True)
    a.out_vals = [o.meta["val"] for o in a.outs
                  if isinstance(o, torch.fx.Node) and isinstance(o.meta.get("val"), torch.Tensor)]
    nb = kf_memory.nbytes
    a.in_bytes = sum(nb(t) for t in a.meta_inputs)
    a.par_bytes = sum(nb(t) for t in list(a.model.parameters()) + list(a.model.buffers()))
    a.par_bytes += sum(nb(t) for t in a.ep.constants.values())
    a.out_bytes = sum(nb(t) for t in a.out_vals)
    a.peak_bytes = kf_memory.forward_peak_bytes(a.ep.graph_module.graph)
    a.need = kf_memory.golden_need(a.in_bytes, a.par_bytes, a.out_bytes, a.peak_bytes)
    return a


def need_text(a) -> str:
    g = kf_memory.gib
    return (f"{a.need} bytes ({g(a.need)}: parameters {a.par_bytes}, inputs {a.in_bytes}, outputs {a.out_bytes}, "
            f"forward peak {a.peak_bytes})")


def fit_cpu(mod, defaults, extra, mode, bwhere, budget, own_sizes: bool):
    """The cpu backend's analysis within `budget`: the file's sizes, or (foreign problems without
    KF_SIZES) its size constants halved, batch-like names first, until the estimate fits.
    Returns (analysis, scaled {name: [from, to]}); raises ImportProblem when nothing fits."""
    a = analyse(mod, "cpu", defaults, extra, mode, bwhere)
    if budget <= 0 or a.need <= budget:
        return a, {}
    first = a
    why = (f"{bwhere}: the cpu golden run needs an estimated {need_text(a)}, over the budget of {budget} bytes "
           f"({kf_memory.gib(budget)}; --max-memory-gb)")
    if own_sizes:
        raise ImportProblem(f"{why}; lower KF_SIZES['cpu'] or --size cpu:NAME=VALUE")
    cands = [k for k, v in defaults.items() if type(v) is int and v >= 2 and k not in extra]
    cands.sort(key=lambda k: (0 if "batch" in k.lower() else 1, -defaults[k]))
    cur = dict(extra)
    frozen, tries = set(), 0

    def floor(k):  # a batch may go down to 1; other sizes to an eighth, keeping the problem's character
        return 1 if "batch" in k.lower() else max(1, defaults[k] // MAX_SHRINK)
    t0 = time.time()
    while a.need > budget and tries < MAX_SCALING_TRIES and time.time() - t0 < MAX_SCALING_SECONDS:
        pick = next((k for k in cands if k not in frozen and cur.get(k, defaults[k]) // 2 >= floor(k)), None)
        if pick is None:
            break
        trial = dict(cur)
        trial[pick] = cur.get(pick, defaults[pick]) // 2
        tries += 1
        try:
            b = analyse(mod, "cpu", defaults, trial, mode, bwhere)
        except ImportProblem:
            frozen.add(pick)  # this constant cannot shrink (shapes stop matching): leave it
            continue
        if b.need >= a.need:
            frozen.add(pick)
            continue
        cur, a = trial, b
    if a.need > budget:
        raise ImportProblem(f"{why}; halving its size constants ({', '.join(cands) or 'none found'}; a batch down to 1, others to 1/{MAX_SHRINK}) "
                            f"did not bring it under the budget ({tries} tries, {time.time() - t0:.0f} s)")
    scaled = {k: [defaults[k], v] for k, v in cur.items() if k not in extra}
    a.scaled_from_need = first.need
    return a, scaled


def abi_slots(a, bwhere):
    """Graph placeholders mapped to ABI slots: (graph_inputs, input_specs, slots) where each
    slot is (spec, target or None for lifted constants, tensor of the analysed model)."""
    from torch.export.graph_signature import InputKind, TensorArgument
    sig = a.ep.graph_signature
    named_params = dict(a.model.named_parameters())
    named_buffers = dict(a.model.named_buffers())
    consts = dict(a.ep.constants)
    graph_inputs, input_specs = [], []
    plist = {"parameter": [], "buffer": [], "constant": []}
    user_i = 0
    for spec in sig.input_specs:
        ph = spec.arg.name if hasattr(spec.arg, "name") else None
        if spec.kind == InputKind.USER_INPUT:
            if isinstance(spec.arg, TensorArgument):
                t = a.meta_inputs[a.tensor_pos[user_i]]
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
    if user_i != len(a.tensor_pos):
        raise ImportProblem(f"{bwhere}: export saw {user_i} tensor inputs, get_inputs() returned {len(a.tensor_pos)}")
    slots = []
    for role in ("parameter", "buffer", "constant"):
        for ph, target, t in plist[role]:
            abi_role = "buffer" if role == "constant" else role
            name = target if role != "constant" else "constant." + target
            graph_inputs.append({"placeholder": ph, "kind": "param", "index": len(slots)})
            # A constant that is a plain tensor attribute of the model (self.h = torch.randn(...))
            # comes from the init recipe too; one made inside forward has no path (None).
            path = target if role != "constant" or kf_params.resolve(a.model, target) is not None else None
            slots.append((spec_of(t, name, abi_role), path, t.detach()))
    return graph_inputs, input_specs, slots


def make_recipe(mod, slots, bwhere):
    """The init recipe (GraphModule, JSON) for the parameter and buffer slots; RecipeUnavailable if none."""
    targets = [target for _, target, _ in slots]
    if not any(t is not None for t in targets):
        raise kf_params.RecipeUnavailable("no parameters or buffers")

    def build():
        init = mod.get_init_inputs()
        return mod.Model(*init)
    gm = kf_params.trace_init(build, targets)
    got = gm.graph.output_node().args[0]
    want = [spec for spec, target, _ in slots if target is not None]
    for node, spec in zip(got, want):
        v = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if not isinstance(v, torch.Tensor) or list(v.shape) != spec["shape"] or dtype_name(v.dtype) != spec["dtype"]:
            raise kf_params.RecipeUnavailable(f"the traced init gives '{spec['name']}' another shape or dtype")
    try:
        _, nodes, outs = serialize_nodes(gm.graph, gm, bwhere + " init", forbid_random=False)
    except ImportProblem as e:
        raise kf_params.RecipeUnavailable(str(e)) from e
    if not all(isinstance(o, torch.fx.Node) for o in outs):
        raise kf_params.RecipeUnavailable("an init output is not a graph value")
    it = iter(o.name for o in outs)
    out_names = [next(it) if target is not None else None for _, target, _ in slots]
    return gm, {"format": FORMAT_VERSION, "seed": INIT_SEED, "nodes": nodes, "outputs": out_names}


def import_backend(mod, a, backend: str, opts: Options, bwhere: str, out: Path):
    """Writes the backend's files from its analysis; returns (task.json entry, real CPU model or None)."""
    from torch.export.graph_signature import OutputKind
    graph_inputs, input_specs, slots = abi_slots(a, bwhere)
    param_specs = [s for s, _, _ in slots]

    out_json, out_specs = [], []
    for spec, o in zip(a.ep.graph_signature.output_specs, a.outs):
        if spec.kind == OutputKind.USER_OUTPUT:
            if not isinstance(o, torch.fx.Node) or not isinstance(o.meta.get("val"), torch.Tensor):
                raise ImportProblem(f"{bwhere}: forward output {len(out_json)} is not a tensor")
            out_json.append({"node": o.name})
            out_specs.append(spec_of(o.meta["val"], f"y{len(out_specs)}"))
        elif spec.kind == OutputKind.BUFFER_MUTATION:
            idx = next(i for i, p in enumerate(param_specs) if p["name"] == spec.target)
            out_json.append({"node": o.name, "copy_to_param": idx})
        elif spec.kind == OutputKind.USER_INPUT_MUTATION:
            raise ImportProblem(f"{bwhere}: forward modifies its input in place; references must not mutate inputs")
        else:
            raise ImportProblem(f"{bwhere}: unsupported export output kind {spec.kind}")
    if not out_specs:
        raise ImportProblem(f"{bwhere}: forward returns no tensor")

    # Parameters: the init recipe where it reproduces the model, full tensors otherwise.
    recipe, recipe_note = None, None
    if opts.params == "compact" and slots:
        try:
            recipe = make_recipe(mod, slots, bwhere)
        except kf_params.RecipeUnavailable as e:
            recipe_note = f"stored in full: {e}"
    real = a.model if a.built_on != "meta" else None
    need_real = backend == "cpu" or (slots and recipe is None) or any(t is None for _, t, _ in slots)
    if need_real and real is None:
        if backend != "cpu" and opts.budget > 0 and a.par_bytes > opts.budget:
            raise ImportProblem(f"{bwhere}: its parameters ({a.par_bytes} bytes, {kf_memory.gib(a.par_bytes)}) must be "
                                f"stored in full ({recipe_note}) and exceed the budget of {opts.budget} bytes (--max-memory-gb)")
        real = build_model(mod, "cpu", a.mode)
    values = []
    for spec, target, t in slots:
        if target is None:
            values.append(t)  # a constant lifted from forward: the analysed model's export holds its value
        else:
            values.append(kf_params.resolve(real, target) if real is not None else None)
    if recipe is not None and real is not None:
        # Whenever the importer holds the real model (always for cpu, whose golden run uses
        # it), the recipe must give its tensors bit for bit, or the tensors are stored in full.
        replayed = kf_params.replay(recipe[0], INIT_SEED)
        want = [v for v, (_, target, _) in zip(values, slots) if target is not None]
        if len(replayed) != len(want) or not all(torch.equal(x, y.detach()) for x, y in zip(replayed, want)):
            recipe, recipe_note = None, "stored in full: replaying the traced init differs from Model(*get_init_inputs())"
        del replayed
    file_tensors = []
    for (spec, target, _), v in zip(slots, values):
        if recipe is None or target is None:
            if v is None or v.is_meta:
                raise ImportProblem(f"{bwhere}: no value for '{spec['name']}'")
            file_tensors.append((spec["name"], v.detach().contiguous()))
    storage = {"recipe": 0 if recipe is None else sum(1 for _, t, _ in slots if t is not None),
               "file": len(file_tensors)}
    if recipe is not None:
        (out / f"{backend}.init.json").write_text(json.dumps(recipe[1]))
        storage["init"] = f"{backend}.init.json"
    if recipe_note:
        storage["note"] = recipe_note
    if file_tensors:
        kf_params.write_safetensors(out / f"{backend}.params.safetensors", file_tensors, {"init_seed": INIT_SEED})

    graph = {"format": FORMAT_VERSION, "graph_inputs": graph_inputs, "nodes": a.nodes, "outputs": out_json}
    inputs_graph = {"format": FORMAT_VERSION, "nodes": a.in_nodes, "outputs": a.in_out_json, "baked": a.baked}
    (out / f"{backend}.graph.json").write_text(json.dumps(graph))
    (out / f"{backend}.inputs.json").write_text(json.dumps(inputs_graph))
    info = {"sizes": {k: v for k, v in a.sizes.items() if isinstance(v, (int, float, bool, str))},
            "inputs": input_specs, "params": param_specs, "outputs": out_specs,
            "params_storage": storage, "built_on": a.built_on}
    return info, real


def run_forward(model, inputs):
    with torch.no_grad():
        outs = model(*inputs)
    return list(outs) if isinstance(outs, (list, tuple)) else [outs]


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| in float64, a million elements at a time (no full-size float64 copies)."""
    fa, fb, m = a.reshape(-1), b.reshape(-1), 0.0
    for i in range(0, fa.numel(), 1 << 20):
        m = max(m, (fa[i:i + (1 << 20)].double() - fb[i:i + (1 << 20)].double()).abs().max().item())
    return m


def golden_and_checks(mod, model, where: str, out: Path):
    """CPU only: eager outputs for the golden seed, plus determinism and degeneracy checks.
    Holds at most two copies of the parameters (the pristine model and a working copy
    reloaded before each call, since train mode updates buffers) and three of the inputs."""
    pristine = {k: v.detach().clone() for k, v in model.state_dict().items()}
    work = model  # the real model itself, reset from `pristine` before each call

    def reset():
        with torch.no_grad():
            for k, v in work.state_dict().items():
                v.copy_(pristine[k])
    torch.manual_seed(GOLDEN_SEED)
    inputs = [x for x in mod.get_inputs() if isinstance(x, torch.Tensor)]
    before = [x.clone() for x in inputs]
    outs = run_forward(work, inputs)
    for a, b in zip(inputs, before):
        if not torch.equal(a, b):
            raise ImportProblem(f"{where} [cpu]: forward modified an input tensor in place")
    del before
    for i, o in enumerate(outs):
        if not isinstance(o, torch.Tensor):
            raise ImportProblem(f"{where} [cpu]: forward output {i} is not a tensor")
        if o.is_floating_point() and not torch.isfinite(o).all():
            raise ImportProblem(f"{where} [cpu]: output {i} is not finite for the task's own inputs")
    # Same inputs, same starting state: must give identical outputs (deterministic reference).
    reset()
    outs2 = run_forward(work, inputs)
    for i, (a, b) in enumerate(zip(outs, outs2)):
        if not torch.equal(a, b):
            raise ImportProblem(f"{where} [cpu]: forward is not deterministic (output {i} differs between identical calls)")
    del outs2
    # Degenerate: output (nearly) constant or independent of the inputs.
    torch.manual_seed(GOLDEN_SEED + 1)
    other = [x for x in mod.get_inputs() if isinstance(x, torch.Tensor)]
    reset()
    outs3 = run_forward(work, other)
    del other
    degenerate = []
    for i, (a, c) in enumerate(zip(outs, outs3)):
        scale = a.abs().max().double().item() if a.numel() else 0.0
        if torch.equal(a, c) or (scale > 0 and max_abs_diff(a, c) <= 1e-6 * scale):
            degenerate.append(f"output {i} does not depend on the inputs")
        elif a.numel() > 1 and a.double().std().item() <= 1e-7 * max(scale, 1e-30):
            degenerate.append(f"output {i} is (nearly) constant")
    del outs3
    tensors = [(f"in{i}", x) for i, x in enumerate(inputs)] + [(f"out{i}", o) for i, o in enumerate(outs)]
    kf_params.write_safetensors(out / "cpu.golden.safetensors", tensors, {"seed": GOLDEN_SEED})
    return degenerate


def task_tolerance(mod):
    tol = getattr(mod, "KF_TOLERANCE", None)
    if tol is None:
        return None
    if not (isinstance(tol, dict) and set(tol) <= {"atol", "rtol"} and all(isinstance(v, (int, float)) for v in tol.values())):
        raise ImportProblem("KF_TOLERANCE must be a dict with numeric 'atol' and/or 'rtol'")
    return {"atol": float(tol.get("atol", 0.0)), "rtol": float(tol.get("rtol", 0.0))}


def import_file(path: Path, out_root: Path, opts: Options, notes: list) -> Path:
    """Imports one problem file; appends one-line notes (cpu sizes scaled or skipped) to `notes`."""
    where = str(path)
    mod = load_module(path)
    name = path.stem
    mode, mode_source = task_mode(mod, opts.mode)
    level = getattr(mod, "KF_LEVEL", None)
    if level is None:  # KernelBench keeps levels as folder names: level1/, level2/ ...
        parent = path.parent.name.lower()
        level = int(parent[5:]) if parent.startswith("level") and parent[5:].isdigit() else 1
    tags = list(getattr(mod, "KF_TAGS", []))
    own_sizes = getattr(mod, "KF_SIZES", None) is not None
    defaults = numeric_constants(mod)
    tmp = out_root / f".tmp-{name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        meta_backends, degenerate, skipped = {}, [], {}
        for b in opts.backends:
            bwhere = f"{where} [{b}]"
            extra = opts.extra_sizes.get(b, {})
            try:
                if b == "cpu":
                    a, scaled = fit_cpu(mod, defaults, extra, mode, bwhere, opts.budget, own_sizes)
                else:
                    a, scaled = analyse(mod, b, defaults, extra, mode, bwhere), {}
            except ImportProblem as e:
                if b != "cpu" or len(opts.backends) == 1 or "the cpu golden run needs" not in str(e):
                    raise
                skipped[b] = str(e)  # the other backends still import; one line says why cpu did not
                continue
            a.mode = mode
            info, model = import_backend(mod, a, b, opts, bwhere, tmp)
            if b == "cpu":
                info["memory"] = {"estimate_bytes": a.need, "budget_bytes": opts.budget}
                if scaled:
                    info["memory"]["estimate_bytes_at_file_sizes"] = a.scaled_from_need
                    info["scaled_sizes"] = scaled
                    notes.append(f"{where} [cpu]: sizes scaled down to fit the memory budget: " +
                                 ", ".join(f"{k} {v[0]} -> {v[1]}" for k, v in scaled.items()))
                apply_sizes(mod, b, defaults, {**extra, **{k: v[1] for k, v in scaled.items()}})
                degenerate = golden_and_checks(mod, model, where, tmp)
            meta_backends[b] = info
            del model, a
        for b, why in skipped.items():
            notes.append(f"{why if why.startswith(where) else where + ' [cpu]: ' + why}; cpu backend skipped")
        meta = {
            "format": FORMAT_VERSION,
            "name": name,
            "source_file": str(path),
            "source": path.read_text(),
            "level": int(level),
            "tags": tags,
            "mode": mode,
            "mode_source": mode_source,
            "tolerance": task_tolerance(mod),
            "default_tolerance": {k: {"atol": v[0], "rtol": v[1]} for k, v in DEFAULT_TOL.items()},
            "init_seed": INIT_SEED,
            "golden_seed": GOLDEN_SEED,
            "degenerate": degenerate,
            "torch_version": torch.__version__,
            "backends": meta_backends,
            "skipped_backends": skipped,
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


def refusal_line(f: Path, e: BaseException) -> str:
    if isinstance(e, ImportProblem):
        msg = str(e)
    elif isinstance(e, MemoryError):  # an allocation the estimate did not foresee
        msg = f"out of memory while importing ({e}); lower its sizes or --max-memory-gb"
    else:  # a bug of ours or torch's: still one line naming the file, and the run goes on
        msg = f"internal importer error: {type(e).__name__}: {one_line(e)}"
    msg = " ".join(msg.split("\n"))
    return msg if msg.startswith(str(f)) else f"{f}: {msg}"


def tree_version():
    """The repository's VERSION; a copy of the importer outside the tree has none."""
    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "VERSION")) as f:
            return f.read().strip()
    except OSError:
        return "(unknown version: no VERSION file beside this copy)"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="import-tasks", description=__doc__.splitlines()[0])
    ap.add_argument("--version", action="version", version="KernelForge " + tree_version())
    ap.add_argument("paths", nargs="+", help="problem files or folders (searched recursively for *.py)")
    ap.add_argument("--out", required=True, help="artifact folder (one subfolder per task)")
    ap.add_argument("--backends", default="cpu",
                    help="comma list of cpu,cuda, or auto: cpu, and cuda when a GPU is visible (default: cpu)")
    ap.add_argument("--size", action="append", help="override a size constant: backend:NAME=VALUE")
    ap.add_argument("--skip-fresh", action="store_true", help="skip tasks whose artifact is newer than the file")
    ap.add_argument("--max-memory-gb", type=float, default=None,
                    help="memory budget of one task's cpu golden run (default: half of MemAvailable at start, shared by --jobs)")
    ap.add_argument("--mode", choices=("train", "eval"), default=None,
                    help="mode of problems that do not set KF_MODE (default: train, as nn.Module starts); "
                         "recorded in task.json")
    ap.add_argument("--params", choices=("compact", "full"), default="compact",
                    help="compact: store the parameters' init recipe where it reproduces them (default); "
                         "full: store every tensor")
    ap.add_argument("--jobs", type=int, default=1,
                    help="problems imported at once, each in its own worker process (default 1: in this process)")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        raise SystemExit(f"import-tasks: --jobs must be >= 1, got {args.jobs}")
    if args.max_memory_gb is not None and not args.max_memory_gb > 0:
        raise SystemExit(f"import-tasks: --max-memory-gb must be > 0, got {args.max_memory_gb}")
    budget = int(args.max_memory_gb * (1 << 30)) if args.max_memory_gb else kf_memory.mem_available_bytes() // 2 // args.jobs
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if backends == ["auto"]:  # what the test suite imports: its GPU tests need cuda artifacts on a GPU machine
        backends = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
    for b in backends:
        if b not in ("cpu", "cuda"):
            raise SystemExit(f"import-tasks: unknown backend {b!r} (cpu or cuda)")
    opts = Options(backends, parse_size_overrides(args.size), budget, args.mode, args.params)
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
    failed, done, skipped = 0, 0, 0
    t0 = time.time()
    todo = []
    # An artifact is fresh when it is newer than its problem file and than the importer
    # itself (a changed importer may write another format).
    importer_mtime = max(p.stat().st_mtime for p in Path(__file__).resolve().parent.glob("*.py"))
    for f in files:
        art = out_root / f.stem / "task.json"
        if args.skip_fresh and art.exists() and art.stat().st_mtime >= max(f.stat().st_mtime, importer_mtime):
            try:
                have = json.loads(art.read_text()).get("backends", {})
                if all(b in have for b in backends):
                    skipped += 1
                    continue
            except (OSError, ValueError):
                pass
        todo.append(f)

    def report(result):
        nonlocal done, failed
        ok, out_line, err_lines = result
        done += ok
        failed += not ok
        if out_line:
            print(out_line, flush=True)
        for line in err_lines:
            print(line, file=sys.stderr, flush=True)

    if args.jobs <= 1:
        quiet_torch(os.cpu_count() or 1)
        for f in todo:
            report(import_one(f, out_root, opts))
    else:
        # Worker processes (spawned: torch's thread pools do not survive fork). A worker the
        # kernel kills (out of memory) costs its problem one line, not the run.
        import concurrent.futures as cf
        import multiprocessing as mp
        threads = max(1, (os.cpu_count() or 1) // args.jobs)
        pending = list(todo)
        while pending:
            with cf.ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn"),
                                        initializer=worker_init, initargs=(threads,)) as pool:
                futs = {pool.submit(import_one, f, out_root, opts): f for f in pending}
                pending = []
                for fut in cf.as_completed(futs):
                    f = futs[fut]
                    try:
                        report(fut.result())
                    except cf.process.BrokenProcessPool:
                        report((False, None, [f"{f}: the importer's worker process died (killed, most likely out of "
                                              f"memory: lower --max-memory-gb or --jobs); the other problems go on"]))
                        pending = [g for fu, g in futs.items() if not fu.done()]
                        break
    print(f"import-tasks: {done} imported, {skipped} up to date, {failed} failed ({time.time() - t0:.1f}s) -> {out_root}",
          flush=True)
    return min(failed, 125)  # the exit status counts the failed problems


def quiet_torch(threads: int):
    """Per process: torch's thread count, and its warnings and log records off (not our one-line report)."""
    torch.set_num_threads(max(1, min(4, threads)))
    warnings.filterwarnings("ignore")
    logging.disable(logging.CRITICAL)


def worker_init(threads: int):
    """A worker dies with the importer (Linux PR_SET_PDEATHSIG), so a stopped run leaves none behind."""
    try:
        import ctypes
        import signal
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    quiet_torch(threads)


def import_one(f: Path, out_root: Path, opts: Options):
    """Imports one file; returns (ok, stdout line, stderr lines). Never raises."""
    t = time.time()
    notes, ok, out_line, err = [], True, None, []
    try:
        import_file(f, out_root, opts, notes)
        out_line = f"imported {f.stem:40s} {time.time() - t:6.2f}s"
    except KeyboardInterrupt:
        raise
    except BaseException as e:
        ok = False
        err.append(refusal_line(f, e))
    err += [" ".join(n.split("\n")) for n in notes]
    return ok, out_line, err


if __name__ == "__main__":
    sys.exit(main())

"""Parameters of an imported task: a compact init recipe where possible, full tensors otherwise.

Most problems keep the module's default init (nn.Linear's kaiming_uniform_, nn.Conv2d's,
zeros and ones of norms...). Storing those tensors at full size made a KernelBench import
33 GB. Instead the importer records `Model(*get_init_inputs())` itself as an ATen graph
(make_fx on fake tensors: nothing is allocated at any size) whose outputs are the
parameters and buffers in ABI order. C++ replays it on the CPU with a private generator
seeded with the task's init seed, the same way it replays get_inputs(), and gets the very
tensors `torch.manual_seed(seed); Model(*get_init_inputs())` made in Python.

A tensor the recipe cannot give (a constant lifted out of forward, a model whose __init__
the tracer cannot follow, a recipe whose replay differs from the real model) is stored in
<backend>.params.safetensors instead; task.json says which way each backend went.
"""
from __future__ import annotations

import contextlib
import json
import struct
from pathlib import Path

import torch
from torch.fx.experimental.proxy_tensor import make_fx

ST_DTYPE = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}


class RecipeUnavailable(Exception):
    """The init cannot be recorded as a replayable graph; the message says why (stored in full instead)."""


def resolve(model: torch.nn.Module, target: str):
    """The tensor at a dotted attribute path of `model` (parameter, buffer or plain tensor attribute), or None."""
    obj = model
    for part in target.split("."):
        if not hasattr(obj, part):
            return None
        obj = getattr(obj, part)
    return obj if isinstance(obj, torch.Tensor) else None


@contextlib.contextmanager
def deepcopy_as_clone():
    """copy.deepcopy of a tensor as a traced aten.clone. nn.TransformerEncoder (and any
    module built by deep-copying a layer) copies its tensors' storage, which fake tensors
    do not have; a clone copies the same values and the recipe records it."""
    saved = torch.Tensor.__deepcopy__, torch.nn.Parameter.__deepcopy__

    def clone_copy(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        with torch.no_grad():
            c = self.detach().clone()
        if isinstance(self, torch.nn.Parameter):
            c = torch.nn.Parameter(c, requires_grad=self.requires_grad)
        memo[id(self)] = c
        return c
    torch.Tensor.__deepcopy__ = torch.nn.Parameter.__deepcopy__ = clone_copy
    try:
        yield
    finally:
        torch.Tensor.__deepcopy__, torch.nn.Parameter.__deepcopy__ = saved


def trace_init(build, targets: list[str | None]):
    """make_fx of `build()` (which must seed nothing itself) on fake tensors.

    `targets[i]` is the attribute path of ABI slot i on the built model, or None for a slot
    the recipe does not give. Returns the GraphModule; its outputs are the non-None slots in order."""
    def init_fn():
        model = build()
        outs = []
        for t in targets:
            if t is None:
                continue
            v = resolve(model, t)
            if v is None:
                raise RecipeUnavailable(f"'{t}' is not a tensor attribute of the built model")
            outs.append(v.detach())
        return outs
    try:
        with deepcopy_as_clone():
            return make_fx(init_fn, tracing_mode="fake")()
    except RecipeUnavailable:
        raise
    except Exception as e:
        head = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise RecipeUnavailable(f"tracing Model(*get_init_inputs()) failed: {type(e).__name__}: {head}") from e


def replay(gm, seed: int) -> list[torch.Tensor]:
    """The recipe run eagerly on the CPU from `seed`, as C++ runs it."""
    torch.manual_seed(seed)
    with torch.no_grad():
        return [t.detach().contiguous() for t in gm()]


def tensor_buffer(t: torch.Tensor):
    """The bytes of `t` as a buffer, without a copy when it is already contiguous on the CPU."""
    t = t.detach().cpu().contiguous()
    if t.numel() == 0:
        return b""
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def write_safetensors(path: Path, tensors: list[tuple[str, torch.Tensor]], metadata: dict | None = None):
    header, offset = {}, 0
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    for name, t in tensors:
        if t.dtype not in ST_DTYPE:
            raise ValueError(f"tensor {name} has dtype {t.dtype}, which safetensors cannot store")
        n = t.numel() * t.element_size()
        header[name] = {"dtype": ST_DTYPE[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - (len(h) + 8) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, t in tensors:  # one tensor at a time: no second copy of the whole file in memory
            f.write(tensor_buffer(t))

"""Memory estimates for the importer's CPU golden run, made before anything is allocated.

The importer runs a problem eagerly on this machine for its cpu backend (golden outputs,
determinism and degeneracy checks). KernelBench problems are sized for a GPU: run as they
are on a small machine they exhaust its memory and the kernel kills the importer without a
word. So the need is estimated from the exported graph on fake tensors first:

  need = 2 x parameters (the model and a working copy)
       + 3 x inputs     (the set, its pristine copy, a second set)
       + outputs        (the first call's, kept while the next calls run)
       + peak of the forward's own tensors (a liveness walk over the graph: each node's
         result lives from the node to its last reader; views allocate nothing)

and compared with a budget (default half of MemAvailable at start).
"""
from __future__ import annotations

import torch

# Ops whose result aliases an input: they allocate no storage.
VIEW_OPS = {"view", "_unsafe_view", "reshape", "transpose", "permute", "expand", "slice", "select",
            "t", "unsqueeze", "squeeze", "as_strided", "alias", "detach", "unflatten", "flatten",
            "narrow", "split", "split_with_sizes", "chunk", "unbind", "view_as", "expand_as",
            "contiguous", "numpy_T", "movedim", "swapaxes", "diagonal", "real", "imag", "lift_fresh"}


def nbytes(t) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def mem_available_bytes() -> int:
    """MemAvailable from /proc/meminfo (0 when unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _val_bytes(v) -> int:
    if isinstance(v, torch.Tensor):
        return nbytes(v)
    if isinstance(v, (list, tuple)):
        return sum(_val_bytes(x) for x in v)
    return 0


def forward_peak_bytes(graph: torch.fx.Graph) -> int:
    """Peak bytes of the tensors forward itself creates (inputs and parameters not counted)."""
    nodes = list(graph.nodes)
    last = {}
    for i, n in enumerate(nodes):
        for a in n.all_input_nodes:
            last[a] = i
    live, peak, sizes = 0, 0, {}
    for i, n in enumerate(nodes):
        if n.op == "call_function":
            name = getattr(getattr(n.target, "_schema", None), "name", "").split("::")[-1]
            b = 0 if name.rstrip("_") in VIEW_OPS or name == "getitem" else _val_bytes(n.meta.get("val"))
            if getattr(n.target, "__name__", "") == "getitem":
                b = 0  # the tuple's parts were counted at the op that made them
            sizes[n] = b
            live += b
            peak = max(peak, live)
        for a in n.all_input_nodes:
            if last.get(a) == i and a in sizes:
                live -= sizes.pop(a)
    return peak


def golden_need(inputs_bytes: int, params_bytes: int, outputs_bytes: int, peak_bytes: int) -> int:
    return 2 * params_bytes + 3 * inputs_bytes + outputs_bytes + peak_bytes


def gib(x: int) -> str:
    return f"{x / (1 << 30):.2f} GiB"

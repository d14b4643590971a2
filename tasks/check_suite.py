#!/usr/bin/env python3
"""Check every task file under tasks/suite (see tasks/FORMAT.md).

Per task, at the CPU size: torch.export of the model, make_fx of get_inputs (only
ATen ops allowed), determinism, finite outputs, no in-place change of inputs,
non-triviality, input dependence (below), and the eager CPU time (median, 2 threads,
must be 1-50 ms). At the CUDA size (on the meta device, nothing allocated): every
tensor <= 4 GiB, inputs+params+buffers+outputs <= 16 GiB. Also the KF_* metadata.

Input dependence ("not degenerate"): the reference runs on DEGEN_SETS input sets (the
parameters fixed, as the evaluator does); per output element, r = the standard deviation
across the sets / the element's tolerance (atol + rtol * |value|, the task's KF_TOLERANCE
or the dtype default). The evaluator calls a task degenerate when every element of set 1
is within tolerance of set 0, and then a kernel returning a constant (a loss's expected
value) passes. An output of fewer than DEGEN_MANY elements (a loss, per-channel
statistics) needs max r >= DEGEN_MIN_RATIO; a larger one needs its DEGEN_MANY-th largest
r >= DEGEN_MANY_RATIO (a constant then misses at that many elements; a bf16 softmax's
probabilities cannot reach 100x their tolerance). Printed as `dep`: the smallest over the
outputs of r / its threshold (>= 1 passes). --degenerate also checks the CUDA size, by a
down-scaled run: the first size constant divided by 2^k until the inputs fit DEGEN_BUDGET
bytes and the forward DEGEN_FLOPS (counted on the meta device; the _MANY limits when no
output has few values), the others at their CUDA values. An output whose shape does not change with that constant reduces over it (or
ignores it): its r is scaled by sqrt(N_down / N_cuda) (N: input elements), since sampling
noise shrinks as 1/sqrt(N) and anything that does not shrink only helps (a lower bound).
An output indexed by it has the CUDA size's per-element distribution as measured.

Usage: check_suite.py [--only SUBSTR] [--no-timing] [--cuda] [--degenerate]
  --cuda        instead time each reference forward at the CUDA size on a GPU.
  --degenerate  only the input-dependence check, at the CPU and the CUDA size.
"""
import argparse
import copy
import importlib.util
import operator
import os
import statistics
import sys
import time
import traceback

import torch
from torch.fx.experimental.proxy_tensor import make_fx

SUITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "suite")
TAGS = {"elementwise", "reduction", "normalization", "matmul", "conv", "attention",
        "loss", "pooling", "model"}
GIB = 1 << 30
CPU_MS = (1.0, 50.0)
DEGEN_SETS = 4
DEGEN_MIN_RATIO = 100.0
DEGEN_MANY, DEGEN_MANY_RATIO = 100, 10.0
DEGEN_FEW_VALUES = DEGEN_MANY - 1
# Down-scaling limits at the CUDA size: looser for a task with an output of few values
# (its bound is scaled by sqrt(N_down / N_cuda)), tighter for the others.
DEGEN_BUDGET, DEGEN_FLOPS = 1 << 30, 5e10
DEGEN_BUDGET_MANY, DEGEN_FLOPS_MANY = 256 << 20, 4e9
DEGEN_SAMPLE = 1 << 20  # elements of a large output kept per set (evenly strided)
DEFAULT_TOL = {torch.float64: (1e-8, 1e-8), torch.float32: (1e-4, 1e-4),
               torch.float16: (1e-2, 1e-2), torch.bfloat16: (2e-2, 2e-2)}
RANDOM_WORDS = ("rand", "normal", "bernoulli", "dropout", "uniform", "multinomial", "poisson",
                "exponential", "cauchy", "geometric")


def task_files(only):
    out = []
    for lvl in sorted(os.listdir(SUITE)):
        d = os.path.join(SUITE, lvl)
        if not (os.path.isdir(d) and lvl.startswith("level")):
            continue
        for f in sorted(os.listdir(d)):
            if f.endswith(".py") and not f.startswith("_") and (not only or only in f):
                out.append((int(lvl[5:]), os.path.join(d, f)))
    return out


def load(path, backend):
    name = "kf_task_" + os.path.relpath(path, SUITE).replace(os.sep, "_")[:-3]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cuda_sizes = dict(mod.KF_SIZES["cuda"])  # file's own constants, before override
    file_consts = {k: getattr(mod, k, None) for k in cuda_sizes}
    for k, v in mod.KF_SIZES[backend].items():
        setattr(mod, k, v)
    return mod, cuda_sizes, file_consts


def flat(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for e in x for t in flat(e)]
    return []


def check_meta(mod, level, path):
    """Metadata checks; returns list of problems."""
    p = []
    src = open(path).read()
    if not (mod.__doc__ and mod.__doc__.strip()):
        p.append("no docstring")
    if "H200" not in src:
        p.append("no H200 estimate comment")
    if getattr(mod, "KF_LEVEL", None) != level:
        p.append(f"KF_LEVEL {getattr(mod, 'KF_LEVEL', None)} != folder level {level}")
    tags = getattr(mod, "KF_TAGS", None)
    if not tags or not set(tags) <= TAGS:
        p.append(f"bad KF_TAGS {tags}")
    if getattr(mod, "KF_MODE", None) not in ("eval", "train"):
        p.append("KF_MODE must be 'eval' or 'train'")
    sizes = getattr(mod, "KF_SIZES", {})
    if set(sizes) != {"cpu", "cuda"}:
        p.append("KF_SIZES needs exactly 'cpu' and 'cuda'")
    elif set(sizes["cpu"]) != set(sizes["cuda"]):
        p.append("KF_SIZES cpu/cuda keys differ")
    tol = getattr(mod, "KF_TOLERANCE", None)
    if tol is not None and set(tol) != {"atol", "rtol"}:
        p.append("KF_TOLERANCE needs atol and rtol")
    for fn in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(mod, fn):
            p.append(f"missing {fn}")
    return p


def aten_only(graph, what):
    bad = set()
    for n in graph.nodes:
        if n.op == "call_function" and not (
                isinstance(n.target, torch._ops.OpOverload) or n.target is operator.getitem):
            bad.add(str(n.target))
    return [f"{what}: non-aten targets {sorted(bad)}"] if bad else []


def build(mod, seed=0):
    torch.manual_seed(seed)
    model = mod.Model(*mod.get_init_inputs())
    model.train(mod.KF_MODE == "train")
    torch.manual_seed(seed + 1)
    inputs = list(mod.get_inputs())
    return model, inputs


def check_cuda_memory(path):
    p = []
    mod, cuda_sizes, file_consts = load(path, "cuda")
    for k, v in cuda_sizes.items():
        if file_consts[k] != v:
            p.append(f"module constant {k}={file_consts[k]} != cuda size {v}")
    with torch.device("meta"), torch.no_grad():
        model, inputs = build(mod)
        outs = flat(model(*inputs))
    tensors = flat(inputs) + list(model.parameters()) + list(model.buffers()) + outs
    big = [tuple(t.shape) for t in tensors if t.numel() * t.element_size() > 4 * GIB]
    if big:
        p.append(f"cuda tensor > 4 GiB: {big}")
    total = sum(t.numel() * t.element_size() for t in tensors)
    if total > 16 * GIB:
        p.append(f"cuda total {total / GIB:.1f} GiB > 16 GiB")
    return p, total / GIB


def nontrivial(inputs, outs):
    p = []
    for o in outs:
        if o.is_floating_point():
            of = o.detach().double()
            if o.numel() > 1 and not (of.std() > 1e-7 * (of.abs().mean() + 1e-30)):
                p.append(f"output {tuple(o.shape)} is constant")
            if o.numel() == 1 and of.abs().item() < 1e-8:
                p.append("scalar output is zero")
            for i in inputs:
                if isinstance(i, torch.Tensor) and i.is_floating_point() and i.shape == o.shape:
                    inf = i.double()
                    frac = ((of - inf).abs() > 1e-3 * (1 + inf.abs())).double().mean().item()
                    if frac < 0.01:
                        p.append(f"output equals an input on {100 * (1 - frac):.1f}% of elements")
        elif o.numel() > 1 and bool((o == o.flatten()[0]).all()):
            p.append(f"integer output {tuple(o.shape)} is constant")
    return p


def tolerance(mod, dtype):
    t = getattr(mod, "KF_TOLERANCE", None)
    if t is not None:
        return float(t.get("atol", 0.0)), float(t.get("rtol", 0.0))
    return DEFAULT_TOL.get(dtype, (0.0, 0.0))


def outputs_over_sets(mod, model, sets=DEGEN_SETS):
    """The reference's outputs for `sets` input sets, parameters fixed: flat float64 copies,
    of at most ~DEGEN_SAMPLE evenly strided elements (a sample only lowers the statistic)."""
    per_set = []
    with torch.no_grad():
        for k in range(sets):
            torch.manual_seed(1000 + 7919 * k)
            outs = [o.detach().reshape(-1) for o in flat(model(*mod.get_inputs()))]
            per_set.append([o[::max(1, o.numel() // DEGEN_SAMPLE)].double() for o in outs])
    return per_set


def dependence(mod, per_set, dtypes, numels, scale=None):
    """Per output: its r statistic over its threshold (see the module doc), r scaled by
    scale[i] first; inf for an integer output that differs between sets at enough
    elements, 0 for one that does not."""
    out = []
    for i, dt in enumerate(dtypes):
        v = torch.stack([s[i] for s in per_set]).flatten(1)
        few = numels[i] <= DEGEN_FEW_VALUES
        k, thr = (1, DEGEN_MIN_RATIO) if few else (min(DEGEN_MANY, v.shape[1]), DEGEN_MANY_RATIO)
        if not dt.is_floating_point:
            varies = int((v != v[0]).any(dim=0).sum())
            out.append(float("inf") if varies >= k else 0.0)
            continue
        atol, rtol = tolerance(mod, dt)
        r = v.std(dim=0, unbiased=True) / (atol + rtol * v.abs().mean(dim=0))
        if scale is not None:
            r = r * scale[i]
        out.append(float(r.topk(k).values[-1]) / thr if r.numel() else 0.0)
    return out


def check_dependence(mod, model, where):
    """Input dependence at the size `mod` is set to; returns (problems, smallest ratio)."""
    per_set = outputs_over_sets(mod, model)
    ratios = dependence(mod, per_set, dtypes_of(mod, model), [o.numel() for o in per_set[0]])
    p = [f"{where}: output {i} barely depends on the inputs (std across sets / tolerance is {r:.3g} x the "
         "threshold)" for i, r in enumerate(ratios) if r < 1.0]
    return p, min(ratios) if ratios else float("nan")


def dtypes_of(mod, model):
    with torch.no_grad():
        torch.manual_seed(1000)
        return [o.dtype for o in flat(model(*mod.get_inputs()))]


def input_numel(inputs):
    return sum(t.numel() for t in flat(inputs))


def meta_run(mod):
    """(input elements, input bytes, output shapes, forward flops, output dtypes) on the meta device."""
    from torch.utils.flop_counter import FlopCounterMode
    with torch.device("meta"), torch.no_grad():
        model, inputs = build(mod)
        with FlopCounterMode(display=False) as fc:
            outs = flat(model(*inputs))
    ins = flat(inputs)
    return (sum(t.numel() for t in ins), sum(t.numel() * t.element_size() for t in ins),
            [tuple(o.shape) for o in outs], fc.get_total_flops(), [o.dtype for o in outs])


def check_dependence_cuda(path):
    """The CUDA-size check by a down-scaled run (see the module doc); returns (problems,
    smallest r over threshold, down-scale factor)."""
    mod, cuda_sizes, _ = load(path, "cuda")
    n_cuda, nbytes, shapes, flops, dtypes = meta_run(mod)
    numels = [int(torch.Size(s).numel()) for s in shapes]
    few = any(n <= DEGEN_FEW_VALUES for n in numels)
    budget, max_flops = (DEGEN_BUDGET, DEGEN_FLOPS) if few else (DEGEN_BUDGET_MANY, DEGEN_FLOPS_MANY)
    key = next(iter(cuda_sizes))
    f = 1
    while (nbytes / f > budget or flops / f > max_flops) and cuda_sizes[key] // (2 * f) >= 1:
        f *= 2
    setattr(mod, key, cuda_sizes[key] // f)
    n_down, _, down_shapes, _, _ = meta_run(mod)
    model, _ = build(mod)
    per_set = outputs_over_sets(mod, model)
    scale = [(n_down / n_cuda) ** 0.5 if a == b else 1.0 for a, b in zip(shapes, down_shapes)]
    ratios = dependence(mod, per_set, dtypes, numels, scale)
    p = [f"cuda size ({key} / {f}): output {i} barely depends on the inputs (lower bound of std across sets / "
         f"tolerance is {r:.3g} x the threshold)" for i, r in enumerate(ratios) if r < 1.0]
    return p, min(ratios) if ratios else float("nan"), f


def time_median(model, inputs):
    with torch.no_grad():
        for _ in range(2):
            model(*inputs)
        ts, t_end = [], time.perf_counter() + 1.5
        while len(ts) < 10 and (len(ts) < 3 or time.perf_counter() < t_end):
            t0 = time.perf_counter()
            model(*inputs)
            ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def check_cpu(path, timing):
    p = []
    mod, _, _ = load(path, "cpu")
    model, inputs = build(mod)
    saved = [t.clone() for t in flat(inputs)]
    ref_state = copy.deepcopy(model.state_dict())

    ep = torch.export.export(copy.deepcopy(model), tuple(inputs))
    p += aten_only(ep.graph, "export")
    rnd = sorted({str(n.target) for n in ep.graph.nodes if n.op == "call_function"
                  and any(w in str(n.target) for w in RANDOM_WORDS)})
    if rnd:
        p.append(f"random ops in forward: {rnd}")
    gi = make_fx(mod.get_inputs)()
    p += aten_only(gi.graph, "make_fx(get_inputs)")

    with torch.no_grad():
        out1 = flat(copy.deepcopy(model)(*inputs))
        out2 = flat(copy.deepcopy(model)(*inputs))
    if not out1:
        p.append("forward returns no tensor")
    if len(out1) != len(out2) or not all(torch.equal(a, b) for a, b in zip(out1, out2)):
        p.append("forward not deterministic")
    for o in out1:
        if o.is_floating_point() and not torch.isfinite(o).all():
            p.append(f"non-finite output {tuple(o.shape)}")
    if any(not torch.equal(a, b) for a, b in zip(saved, flat(inputs))):
        p.append("forward modified its inputs")
    for t in flat(inputs):
        if t.is_floating_point() and not torch.isfinite(t).all():
            p.append("non-finite input")
    p += nontrivial(flat(inputs), out1)
    pd, dep = check_dependence(mod, copy.deepcopy(model), "cpu size")
    p += pd

    ms = float("nan")
    if timing:
        model.load_state_dict(ref_state)
        # Median of up to 10 calls (2 threads). The CI machine is shared: a median outside the
        # range is measured again (up to twice) and the best median kept, since load only slows.
        for _attempt in range(3):
            m = time_median(model, inputs)
            ms = m if ms != ms else min(ms, m)
            if CPU_MS[0] <= ms <= CPU_MS[1]:
                break
            time.sleep(0.5)
        if not CPU_MS[0] <= ms <= CPU_MS[1]:
            p.append(f"cpu time {ms:.1f} ms outside {CPU_MS[0]:g}-{CPU_MS[1]:g} ms")
    return p, ms, dep


def time_cuda(path):
    mod, _, _ = load(path, "cuda")
    with torch.device("cuda"):
        model, inputs = build(mod)
    with torch.no_grad():
        for _ in range(2):
            model(*inputs)
        ts = []
        for _ in range(5):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            model(*inputs)
            b.record()
            torch.cuda.synchronize()
            ts.append(a.elapsed_time(b))
    est = next((l.strip() for l in open(path) if "H200" in l and l.lstrip().startswith("#")), "")
    del model, inputs
    torch.cuda.empty_cache()
    return statistics.median(ts), est


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--cuda", action="store_true")
    ap.add_argument("--degenerate", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(2)
    files = task_files(args.only)
    if not files:
        print("no task files found")
        return 1

    if args.cuda:
        print(f"device: {torch.cuda.get_device_name()}")
        for level, path in files:
            try:
                ms, est = time_cuda(path)
                print(f"{level} | {os.path.basename(path):40s} | {ms:9.3f} ms | {est}", flush=True)
            except Exception as e:  # report and go on
                print(f"{level} | {os.path.basename(path):40s} | ERROR {type(e).__name__}: {e}", flush=True)
                torch.cuda.empty_cache()
        return 0

    failed = 0
    t_start = time.time()
    if args.degenerate:
        print(f"{'level':5s} | {'file':40s} | {'dep_cpu':>9s} | {'dep_cuda':>9s} | {'down':>5s} | status")
        for level, path in files:
            dc, dg, f = float("nan"), float("nan"), 1
            try:
                mod, _, _ = load(path, "cpu")
                model, _ = build(mod)
                probs, dc = check_dependence(mod, model, "cpu size")
                pg, dg, f = check_dependence_cuda(path)
                probs += pg
            except Exception as e:
                probs = [f"{type(e).__name__}: {e}".splitlines()[0][:200]]
            failed += bool(probs)
            status = "ok" if not probs else "; ".join(probs)
            print(f"{level:5d} | {os.path.relpath(path, SUITE):40s} | {dc:9.3g} | {dg:9.3g} | {f:5d} | {status}",
                  flush=True)
        print(f"{len(files)} tasks, {failed} failed, {time.time() - t_start:.0f} s")
        return 1 if failed else 0

    print(f"{'level':5s} | {'file':40s} | {'cpu_ms':>8s} | {'cuda_GiB':>8s} | {'dep':>8s} | status")
    for level, path in files:
        ms, gib, dep = float("nan"), float("nan"), float("nan")
        try:
            mod, _, _ = load(path, "cpu")
            probs = check_meta(mod, level, path)
            if not probs:
                pm, gib = check_cuda_memory(path)
                pc, ms, dep = check_cpu(path, not args.no_timing)
                probs = pm + pc
        except Exception as e:
            probs = [f"{type(e).__name__}: {e}".splitlines()[0][:200]]
            if os.environ.get("KF_CHECK_DEBUG"):
                traceback.print_exc()
        failed += bool(probs)
        status = "ok" if not probs else "; ".join(probs)
        print(f"{level:5d} | {os.path.relpath(path, SUITE):40s} | {ms:8.2f} | {gib:8.2f} | {dep:8.3g} | {status}",
              flush=True)
    print(f"{len(files)} tasks, {failed} failed, {time.time() - t_start:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""C++ reference time against Python eager time for the same task, size and inputs.

Order in one run: C++ pass, Python pass, C++ pass again; the C++ figure is the mean of
the two C++ medians, so drift during the run shows up as the gap between them.
Both sides use one protocol: warm-up calls, then per trial device sync, clock, forward,
device sync, clock; median reported. Python runs under torch.inference_mode(), as C++
runs under c10::InferenceMode.
  python3 bench/reference/bench_reference.py --build build --backend cuda
Prints a table and rows "BENCH|reference|<task>|<metric>|<value>|<unit>".
"""
import argparse, importlib.util, json, os, statistics, subprocess, sys, time
import torch

def cpp_pass(build, tasks_dir, backend, warmup, trials):
    r = subprocess.run([f"{build}/tools/kf-reference", "--tasks", tasks_dir, "--backend", backend, "--json",
                        "--warmup", str(warmup), "--trials", str(trials)], capture_output=True, text=True)
    rows = {}
    for line in r.stdout.splitlines():
        j = json.loads(line)
        if j.get("status") == "ok":
            rows[j["task"]] = j["median_ms"]
    return rows

def python_ms(meta, backend, warmup, trials):
    spec = importlib.util.spec_from_file_location("kf_bench_task", meta["source_file"])
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    for k, v in meta["backends"][backend]["sizes"].items():
        setattr(mod, k, v)
    dev = torch.device("cuda" if backend == "cuda" else "cpu")
    torch.manual_seed(0)
    model = mod.Model(*mod.get_init_inputs()).to(dev)
    model.train(meta["mode"] == "train")
    torch.manual_seed(0)
    with torch.device(dev):
        inputs = [x for x in mod.get_inputs() if isinstance(x, torch.Tensor)]
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    with torch.inference_mode():
        for _ in range(warmup):
            model(*inputs)
        ms = []
        for _ in range(trials):
            sync(); t0 = time.perf_counter(); out = model(*inputs); sync(); t1 = time.perf_counter()
            ms.append((t1 - t0) * 1e3)
            del out
    del model, inputs
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return statistics.median(ms)

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--trials", type=int, default=20)
    a = ap.parse_args()
    tasks_dir = f"{a.build}/tasks"
    if a.backend == "cpu":
        torch.set_num_threads(int(os.environ.get("KF_BENCH_THREADS", "2")))
    c1 = cpp_pass(a.build, tasks_dir, a.backend, a.warmup, a.trials)
    py = {}
    for name in sorted(c1):
        meta = json.load(open(f"{tasks_dir}/{name}/task.json"))
        py[name] = python_ms(meta, a.backend, a.warmup, a.trials)
    c2 = cpp_pass(a.build, tasks_dir, a.backend, a.warmup, a.trials)
    dev = torch.cuda.get_device_name(0) if a.backend == "cuda" else "cpu"
    print(f"# C++ reference vs Python eager, backend={a.backend}, device={dev}, torch {torch.__version__}, "
          f"warmup={a.warmup} trials={a.trials}")
    print(f"{'task':36s} {'cpp_ms':>9s} {'cpp2_ms':>9s} {'py_ms':>9s} {'cpp/py':>7s}")
    ratios = []
    for name in sorted(c1):
        if name not in c2:
            continue
        cpp = 0.5 * (c1[name] + c2[name])
        r = cpp / py[name]
        if py[name] >= 1.0:
            ratios.append((r, name))
        print(f"{name:36s} {c1[name]:9.3f} {c2[name]:9.3f} {py[name]:9.3f} {r:7.3f}")
        print(f"BENCH|reference|{name}|cpp_over_python|{r:.4f}|ratio")
    if ratios:
        worst = max(ratios)
        print(f"tasks >= 1 ms: {len(ratios)}; median cpp/py {statistics.median(r for r, _ in ratios):.3f}; "
              f"worst {worst[0]:.3f} ({worst[1]}); slower than 1.05x: {sum(r > 1.05 for r, _ in ratios)}")

if __name__ == "__main__":
    main()

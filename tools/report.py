"""tools/report RUN_DIR [--out DIR]: plots and one HTML page for a run directory.

Reads (each optional; a missing or corrupt file is skipped with a warning naming it):
  RUN_DIR/metrics/learner.jsonl    kf-learner, one line per step (loss, grad_norm, lr, ...)
  RUN_DIR/metrics/run.jsonl        the launcher's status lines (samples_per_s, verdict
                                   fractions, speedups, queue depths, policy_lag, ...)
  RUN_DIR/metrics/actor-*.jsonl    each actor's lines (samples_per_s, policy_lag_mean, ...)
  RUN_DIR/kernels/kernel_db.json   the kernel database saved at checkpoint
Writes into --out (default RUN_DIR/report): reward.png, speedup.png, verdicts.png,
throughput.png and index.html (the plots plus the best kernel of each task), and prints
each path written. Exit 0 ok, 1 error (e.g. matplotlib missing), 2 usage / no metrics.
docs/operations.md describes the fields.
"""
import argparse
import glob
import html
import json
import math
import os
import sys
import time

PROG = "tools/report"


def warn(msg):
    print(f"{PROG}: warning: {msg}", file=sys.stderr)


def die(code, msg):
    print(f"{PROG}: {msg}", file=sys.stderr)
    sys.exit(code)


# --- inputs -------------------------------------------------------------------------

def read_jsonl(path):
    """The records of a JSONL file, or None when it cannot be read. Lines that are not JSON
    objects (a torn last line after a kill, hand edits) are skipped with one warning."""
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        warn(f"{path}: cannot read ({e.strerror}); skipped")
        return None
    records, bad = [], []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        if isinstance(rec, dict):
            records.append(rec)
        else:
            bad.append(n)
    if bad:
        shown = ", ".join(str(n) for n in bad[:5]) + (" ..." if len(bad) > 5 else "")
        warn(f"{path}: {len(bad)} line(s) are not JSON objects (line {shown}); skipped them")
    if not records:
        warn(f"{path}: no usable records; skipped")
        return None
    return records


def num(rec, key):
    """rec[key] as a finite float, else None (absent, null, text, NaN)."""
    v = rec.get(key)
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)) and math.isfinite(v):
        return float(v)
    return None


def series(records, xkey, ykey):
    """(xs, ys) of the records that have both keys as numbers."""
    xs, ys = [], []
    for r in records or []:
        x, y = num(r, xkey), num(r, ykey)
        if x is not None and y is not None:
            xs.append(x)
            ys.append(y)
    return xs, ys


def read_kernel_db(path):
    """Best entry per task from a kf-kernel-db file (docs/replay.md), or None."""
    if not os.path.exists(path):
        warn(f"{path}: not found; the page has no kernel table")
        return None
    try:
        with open(path, "r", encoding="utf-8") as f:
            db = json.load(f)
    except (OSError, ValueError) as e:
        warn(f"{path}: not readable JSON ({e}); the page has no kernel table")
        return None
    if not isinstance(db, dict) or db.get("format") != "kf-kernel-db":
        warn(f"{path}: field format: expected \"kf-kernel-db\"; the page has no kernel table")
        return None
    if db.get("version") != 1:
        warn(f"{path}: field version: expected 1, got {db.get('version')!r}; the page has no kernel table")
        return None
    entries = db.get("entries")
    if not isinstance(entries, list):
        warn(f"{path}: field entries: expected an array; the page has no kernel table")
        return None
    best, counts = {}, {}
    for i, e in enumerate(entries):
        ok = (isinstance(e, dict) and isinstance(e.get("task"), str) and e["task"]
              and isinstance(e.get("source"), str)
              and isinstance(e.get("speedup"), (int, float)) and not isinstance(e.get("speedup"), bool)
              and math.isfinite(e["speedup"])
              and isinstance(e.get("policy_version"), int) and not isinstance(e.get("policy_version"), bool))
        if not ok:
            warn(f"{path}: entries[{i}]: needs task, speedup (finite number), policy_version (integer) "
                 "and source; skipped")
            continue
        t = e["task"]
        counts[t] = counts.get(t, 0) + 1
        if t not in best or e["speedup"] > best[t]["speedup"]:
            best[t] = e
    return {t: dict(best[t], kernels=counts[t]) for t in sorted(best)}


# --- plots --------------------------------------------------------------------------

def time_axis(streams):
    """Converts each record's unix 'time' into minutes since the earliest record of any stream
    (the launcher's elapsed_s would not cover the learner's or actors' lines)."""
    times = [num(r, "time") for recs in streams for r in (recs or []) if num(r, "time") is not None]
    t0 = min(times) if times else 0.0
    for recs in streams:
        for r in recs or []:
            t = num(r, "time")
            if t is not None:
                r["_min"] = (t - t0) / 60.0
    return t0


def no_data(ax, what):
    ax.text(0.5, 0.5, f"no {what} in this run", ha="center", va="center", transform=ax.transAxes, color="gray")


def plot_lines(ax, curves, xlabel, ylabel, what):
    """curves: [(label, xs, ys)]; draws the non-empty ones. Returns True when something was drawn."""
    drawn = False
    for label, xs, ys in curves:
        if xs:
            ax.plot(xs, ys, label=label, marker="." if len(xs) < 50 else None)
            drawn = True
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if drawn:
        ax.legend(fontsize="small")
    else:
        no_data(ax, what)
    return drawn


def plot_reward(plt, learner, run, out):
    fig, (a, b) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    plot_lines(a, [("mean reward (evaluated candidates)", *series(run, "step", "mean_reward"))],
               "", "reward", "mean_reward (metrics/run.jsonl)")
    a.set_title("Reward and learner loss by learner step")
    plot_lines(b, [("loss", *series(learner, "step", "loss")),
                   ("GRPO loss", *series(learner, "step", "grpo_loss")),
                   ("pairwise loss", *series(learner, "step", "pairwise_loss"))],
               "learner step", "loss", "loss (metrics/learner.jsonl)")
    return save(fig, out, "reward.png")


def plot_speedup(plt, run, out):
    fig, ax = plt.subplots(figsize=(9, 5))
    plot_lines(ax, [("mean", *series(run, "_min", "mean_speedup")),
                    ("median", *series(run, "_min", "median_speedup")),
                    ("best", *series(run, "_min", "best_speedup"))],
               "minutes since start", "speedup over the reference (x)", "speedups (metrics/run.jsonl)")
    if any(num(r, "best_speedup") is not None for r in run or []):
        ax.axhline(1.0, color="gray", linestyle=":", linewidth=1)
    ax.set_title("Speedup of correct kernels over time")
    return save(fig, out, "speedup.png")


VERDICTS = [("correct_frac", "ok (correct)", "tab:green"), ("incorrect_frac", "incorrect", "tab:orange"),
            ("compile_error_frac", "compile error", "tab:red"), ("runtime_error_frac", "runtime error", "tab:purple"),
            ("timeout_frac", "timeout", "tab:brown"), ("cheat_frac", "rejected (cheat)", "black")]


def plot_verdicts(plt, run, out):
    fig, ax = plt.subplots(figsize=(9, 5))
    rows = [r for r in run or [] if "_min" in r and any(num(r, k) is not None for k, _, _ in VERDICTS)]
    if rows:
        xs = [r["_min"] for r in rows]
        ys = [[num(r, k) or 0.0 for r in rows] for k, _, _ in VERDICTS]
        ax.stackplot(xs, *ys, labels=[label for _, label, _ in VERDICTS], colors=[c for _, _, c in VERDICTS],
                     alpha=0.85)
        ax.set_ylim(0, max(1.0, max(sum(col) for col in zip(*ys))))
        ax.legend(fontsize="small", loc="upper left")
    else:
        no_data(ax, "verdict fractions (metrics/run.jsonl)")
    ax.set_xlabel("minutes since start")
    ax.set_ylabel("fraction of evaluated candidates")
    ax.set_title("Verdict mix over time")
    ax.grid(True, alpha=0.3)
    return save(fig, out, "verdicts.png")


def plot_throughput(plt, run, actors, learner, out):
    fig, axes = plt.subplots(4, 2, figsize=(12, 14.5))
    (a, b), (c, d), (e, f), (g, h) = axes
    actor_rate = [(f"{name} samples/s", *series(recs, "_min", "samples_per_s")) for name, recs in actors]
    plot_lines(a, [("run samples/s", *series(run, "_min", "samples_per_s"))] + actor_rate,
               "minutes since start", "samples / s", "sample rates")
    a.set_title("Sampling")
    plot_lines(b, [("candidates / min", *series(run, "_min", "candidates_per_min"))],
               "minutes since start", "candidates / min", "candidates_per_min (metrics/run.jsonl)")
    b.set_title("Evaluation")
    plot_lines(c, [("candidate queue", *series(run, "_min", "candidate_queue_depth")),
                   ("result queue", *series(run, "_min", "result_queue_depth")),
                   ("ready groups", *series(run, "_min", "ready_groups"))],
               "minutes since start", "depth", "queue depths (metrics/run.jsonl)")
    c.set_title("Queues")
    actor_lag = [(f"{name} lag (mean)", *series(recs, "_min", "policy_lag_mean")) for name, recs in actors]
    plot_lines(d, [("policy lag", *series(run, "_min", "policy_lag"))] + actor_lag,
               "minutes since start", "versions behind", "policy lag")
    d.set_title("Policy lag")
    plot_lines(e, [("GPU busy", *series(run, "_min", "gpu_busy_frac"))],
               "minutes since start", "fraction", "gpu_busy_frac (metrics/run.jsonl)")
    e.set_title("GPU busy")
    plot_lines(f, [("seconds / step", *series(learner, "step", "seconds"))],
               "learner step", "seconds", "learner step times (metrics/learner.jsonl)")
    f.set_title("Learner")
    # Where the time went: cumulative process seconds per role (control-block counters).
    parts = [("generate", "generate_s"), ("compile", "compile_s"), ("verify", "verify_s"), ("learn", "learn_s"),
             ("GPU-lock wait", "gpu_wait_s")]
    plot_lines(g, [(label, *series(run, "_min", key)) for label, key in parts],
               "minutes since start", "process seconds (cumulative)", "time split (metrics/run.jsonl)")
    g.set_title("Time split")
    last = {key: num(r, key) for r in (run or []) for key in [k for _, k in parts] if num(r, key) is not None}
    if last:
        labels = [label for label, key in parts if key in last]
        h.barh(labels, [last[key] for _, key in parts if key in last])
        h.invert_yaxis()
        h.set_xlabel("process seconds, whole run")
        h.grid(True, axis="x", alpha=0.3)
    else:
        no_data(h, "time split (metrics/run.jsonl)")
    h.set_title("Time split, totals")
    fig.tight_layout()
    return save(fig, out, "throughput.png")


def save(fig, out, name):
    path = os.path.join(out, name)
    fig.savefig(path, dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt
    plt.close(fig)
    return path


# --- page ---------------------------------------------------------------------------

SUMMARY_KEYS = [("step", "learner step"), ("elapsed_s", "elapsed (s)"), ("verified_total", "candidates verified"),
                ("samples_per_s", "samples / s"), ("candidates_per_min", "candidates / min"),
                ("correct_frac", "correct fraction"), ("mean_speedup", "mean speedup"),
                ("best_speedup", "best speedup"), ("fast1_frac", "fraction faster than reference"),
                ("mean_reward", "mean reward"), ("policy_lag", "policy lag"),
                ("generate_s", "generating (process s)"), ("compile_s", "compiling (process s)"),
                ("verify_s", "verifying (process s)"), ("learn_s", "learning (process s)"),
                ("gpu_wait_s", "GPU-lock wait (process s)")]


def fmt(v):
    if v is None:
        return "–"
    if float(v).is_integer() and abs(v) < 1e15:
        return str(int(v))
    return f"{v:.4g}"


def write_html(out, run_dir, pngs, run, learner, kernels, sources):
    e = html.escape
    parts = [
        "<!DOCTYPE html>", "<html><head><meta charset=\"utf-8\">",
        f"<title>KernelForge run {e(os.path.basename(os.path.abspath(run_dir)))}</title>",
        "<style>body{font-family:sans-serif;margin:2em;max-width:1200px}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}"
        "pre{max-height:40em;overflow:auto;background:#f6f6f6;padding:8px}img{max-width:100%}</style>",
        "</head><body>",
        f"<h1>Run {e(os.path.abspath(run_dir))}</h1>",
        f"<p>Report written {e(time.strftime('%Y-%m-%d %H:%M:%S %Z'))} from: "
        f"{e(', '.join(sources) if sources else 'nothing')}.</p>",
    ]
    last = (run or [])[-1] if run else None
    if last is not None:
        parts.append("<h2>Latest status</h2><table>")
        for key, label in SUMMARY_KEYS:
            parts.append(f"<tr><th>{e(label)}</th><td>{e(fmt(num(last, key)))}</td></tr>")
        parts.append("</table>")
    elif learner:
        ll = learner[-1]
        parts.append(f"<h2>Latest learner step</h2><p>step {e(fmt(num(ll, 'step')))}, "
                     f"loss {e(fmt(num(ll, 'loss')))}</p>")
    parts.append("<h2>Curves</h2>")
    for title, path in pngs:
        name = os.path.basename(path)
        parts.append(f"<h3>{e(title)}</h3><img src=\"{e(name)}\" alt=\"{e(title)}\">")
    parts.append("<h2>Best kernel per task</h2>")
    if kernels is None:
        parts.append("<p>No kernel database (kernels/kernel_db.json) was readable.</p>")
    elif not kernels:
        parts.append("<p>The kernel database holds no kernels.</p>")
    else:
        parts.append("<table><tr><th>task</th><th>speedup</th><th>policy version</th><th>kernels</th>"
                     "<th>source</th></tr>")
        for task, k in kernels.items():
            version = "seed" if k["policy_version"] < 0 else str(k["policy_version"])
            parts.append(
                f"<tr><td>{e(task)}</td><td>{k['speedup']:.3f}x</td><td>{e(version)}</td><td>{k['kernels']}</td>"
                f"<td><details><summary>{len(k['source'].splitlines())} lines</summary>"
                f"<pre>{e(k['source'])}</pre></details></td></tr>")
        parts.append("</table>")
    parts.append("</body></html>")
    path = os.path.join(out, "index.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(parts) + "\n")
    return path


# --- main ---------------------------------------------------------------------------

def main(argv):
    ap = argparse.ArgumentParser(prog=PROG, description="Plots and an HTML page for a KernelForge run directory.")
    ap.add_argument("run_dir", metavar="RUN_DIR")
    ap.add_argument("--out", metavar="DIR", help="output folder (default RUN_DIR/report)")
    args = ap.parse_args(argv)
    run_dir = args.run_dir
    if not os.path.isdir(run_dir):
        die(2, f"{run_dir}: not a directory (give a run folder, e.g. runs/<name>)")
    metrics = os.path.join(run_dir, "metrics")

    sources = []

    def load(path):
        if not os.path.exists(path):
            warn(f"{path}: not found; its plots stay empty")
            return None
        recs = read_jsonl(path)
        if recs is not None:
            sources.append(os.path.relpath(path, run_dir))
        return recs

    learner = load(os.path.join(metrics, "learner.jsonl"))
    run = load(os.path.join(metrics, "run.jsonl"))
    actors = []
    for path in sorted(glob.glob(os.path.join(metrics, "actor-*.jsonl"))):
        recs = read_jsonl(path)
        if recs is None:
            continue
        sources.append(os.path.relpath(path, run_dir))
        name = os.path.basename(path)[: -len(".jsonl")]
        if not any(num(r, "time") is not None for r in recs):
            warn(f"{path}: lines have no 'time' field; not drawn on the time axis")
        actors.append((name, recs))
    if learner is None and run is None and not actors:
        die(2, f"{run_dir}: no metrics at all (expected metrics/learner.jsonl, metrics/run.jsonl or "
               "metrics/actor-*.jsonl with at least one JSON line)")
    kernels = read_kernel_db(os.path.join(run_dir, "kernels", "kernel_db.json"))
    if kernels is not None:
        sources.append("kernels/kernel_db.json")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as ex:  # ImportError or a broken install underneath it
        die(1, f"matplotlib is not importable by {sys.executable} ({ex}); install requirements.txt (./setup.sh)")

    out = args.out or os.path.join(run_dir, "report")
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as ex:
        die(1, f"{out}: cannot create the output folder ({ex.strerror})")
    time_axis([learner, run] + [recs for _, recs in actors])
    try:
        pngs = [("Reward and loss", plot_reward(plt, learner, run, out)),
                ("Speedup", plot_speedup(plt, run, out)),
                ("Verdict mix", plot_verdicts(plt, run, out)),
                ("Throughput, queues and lag", plot_throughput(plt, run, actors, learner, out))]
        page = write_html(out, run_dir, pngs, run, learner, kernels, sources)
    except OSError as ex:
        die(1, f"{ex.filename or out}: cannot write ({ex.strerror})")
    for _, path in pngs:
        print(path)
    print(page)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""tools/score-policy --model DIR --out DIR [...]: a policy's per-level table on the built-in tasks.

For every chosen imported task (--tasks-dir; the levels of --levels, or exactly --include)
it runs tools/optimize: N samples with the no-exemplar (first-round) prompt, each one
verified by the real evaluator. A task listed in the held-out file (tasks/heldout.txt) is
"held-out", every other one "train". Per (split, level), and per split:
  correct %   ok samples / samples
  fast_1 %    tasks whose best ok speedup is > 1.0x / tasks
  solved %    tasks with at least one ok sample / tasks
  mean, median speedup over tasks of the best ok speedup, a task without one counted 1.0x
  mean ok-sample speedup  over every ok sample
A task the evaluator flags degenerate (its reference output barely depends on the inputs, so
a kernel returning a constant can pass; the results' task_degenerate) is left out of the
figures, with one log line and a note under the table; --include-degenerate counts it.
Writes OUT/scores.json, OUT/table.md, and OUT/tasks/<task>/ (tools/optimize's outputs) with
OUT/tasks/<task>.log; prints the table. A task whose tools/optimize exits 2 or 3, or leaves
no report.json, is "failed": listed and left out of the figures; one that exits 3 because
the GPU ran out of memory is run again first (3 tries, pauses of 10 and 20 s). A candidate
whose verification the machine failed (its result's cause "environment": a loaded host
slowed the reference, the compile service failed) is not a sample: the task is run again
(3 tries, pauses of 5 and 10 s), and what is still unmeasured is counted apart
(not_measured) and noted under the table; a task with no measured sample is "failed".
Exit 0 every task scored, 1 some failed or were not scored (--time-limit; or an output could not be written), 2 usage or
bad input. docs/stages.md describes the figures.

tools/score-policy --compare DIR DIR... [--out FILE]: the scores.json of several such runs
(SFT, stage 2, RL, ...) in one table, per (split, level) with the policies side by side,
then per task; only tasks every policy scored count, so each row compares like for like.
Differing settings (n, backend, seed, config, machine) are named above the table. Exit 2
naming the file and field when a folder has no valid scores.json.
"""
import argparse
import concurrent.futures
import json
import os
import random
import re
import shlex
import statistics
import subprocess
import sys
import time

PROG = "tools/score-policy"
TREE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The task-list rule of tasks/include/kf/tasks/tasks.h: a folder name, so a path or two
# names on one line is an error rather than a name that silently matches nothing.
NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
SPLITS = ["train", "held-out"]
OOM_ATTEMPTS, OOM_PAUSE_S = 3, 10  # tools/optimize runs per task when the GPU is out of memory
ENV_ATTEMPTS, ENV_PAUSE_S = 3, 5  # tools/optimize runs per task when the machine failed a verification
PROMPT_NOTE = ("every task gets the no-exemplar (first-round) prompt (no --exemplars), so policies "
               "are comparable")
UNSOLVED_NOTE = "a task without an ok sample counts as 1.0x (the user keeps the reference)"
COLUMNS_NOTE = ("correct % = ok samples / samples; fast_1 % = tasks whose best ok speedup is > 1.0x; solved % = "
                "tasks with at least one ok sample; mean and median speedup are over tasks, of each task's best ok "
                f"speedup, and {UNSOLVED_NOTE}; the last column is the mean over every ok sample.")


def warn(msg):
    print(f"{PROG}: warning: {msg}", file=sys.stderr)


def die(code, msg):
    print(f"{PROG}: {msg}", file=sys.stderr)
    sys.exit(code)


def is_name(s):
    return s not in (".", "..") and NAME_RE.match(s) is not None


# --- inputs -------------------------------------------------------------------------

def read_heldout(path):
    """The names in a task-list file, in order; exit 2 naming the file (and line) when bad."""
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        die(2, f"{path}: cannot read the held-out task list ({e.strerror}); give one with --heldout FILE")
    names = []
    for n, line in enumerate(text.splitlines(), 1):
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        if not is_name(name):
            die(2, f"{path}:{n}: '{name}' is not a task name (one name per line: letters, digits, '_', '-', '.')")
        if name not in names:
            names.append(name)
    return names


def load_json(path):
    """A JSON file's content; ValueError naming the file when it cannot be read or parsed."""
    try:
        with open(path, "r", encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise ValueError(f"{path}: cannot read ({e.strerror})")
    except ValueError as e:
        raise ValueError(f"{path}: not JSON ({e})")


def read_task(folder):
    """(level, backends) of an imported task; ValueError saying what is wrong."""
    path = os.path.join(folder, "task.json")
    j = load_json(path)
    level = j.get("level") if isinstance(j, dict) else None
    if not isinstance(level, int) or isinstance(level, bool):
        raise ValueError(f"{path}: field level: expected an integer")
    if not isinstance(j.get("backends"), dict):
        raise ValueError(f"{path}: field backends: expected an object")
    return level, set(j["backends"])


def select_tasks(tasks_dir, levels, include, backend):
    """[(name, level)] in name order: exactly --include, or every task of `levels` (None: all)
    that has the backend's artifact."""
    if not os.path.isdir(tasks_dir):
        die(2, f"--tasks-dir: {tasks_dir} is not a directory (import the suite with setup.sh or tools/import-tasks)")
    if include:
        picked = []
        for name in include:
            folder = os.path.join(tasks_dir, name)
            if not is_name(name) or not os.path.isfile(os.path.join(folder, "task.json")):
                die(2, f"--include: no task '{name}' in {tasks_dir}")
            try:
                level, backends = read_task(folder)
            except ValueError as e:
                die(2, str(e))
            if backend not in backends:
                die(2, f"--include: task {name} in {tasks_dir} has no {backend} artifact "
                       f"(import it with --backends {backend})")
            picked.append((name, level))
        return picked
    picked, no_backend = [], 0
    for name in sorted(os.listdir(tasks_dir)):
        folder = os.path.join(tasks_dir, name)
        if not os.path.isfile(os.path.join(folder, "task.json")):
            continue  # the tasks' own build files share the folder
        try:
            level, backends = read_task(folder)
        except ValueError as e:
            warn(f"{e}; task skipped")
            continue
        if levels is not None and level not in levels:
            continue
        if backend not in backends:
            no_backend += 1
            continue
        picked.append((name, level))
    if no_backend:
        warn(f"{no_backend} task(s) of the chosen levels in {tasks_dir} have no {backend} artifact; skipped")
    if not picked:
        shown = "any level" if levels is None else "level " + ",".join(str(v) for v in levels)
        die(2, f"no task of {shown} with a {backend} artifact in {tasks_dir}")
    return picked


def gpu_name():
    """The GPU's name from nvidia-smi ("2 x NAME" for several), or None without one."""
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                           text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    names = [line.strip() for line in p.stdout.splitlines() if line.strip()] if p.returncode == 0 else []
    if not names:
        return None
    return names[0] if len(names) == 1 else f"{len(names)} x {names[0]}"


# --- scoring ------------------------------------------------------------------------

LOG_PREFIX = re.compile(r"^\S+Z [DIWE] \[[^\]]*\] ")  # kf::log's "<time> E [optimize:0 pid=N] "


ERROR_LINE = re.compile(r" E \[")


def last_line(path):
    """The likely reason of a failure: the log's last error line (kf::log's " E [" lines;
    a message with a stack trace ends many lines later), else its last line, without
    kf::log's prefix."""
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            lines = [line.strip() for line in f.read().splitlines() if line.strip()]
    except OSError:
        return ""
    errors = [line for line in lines if ERROR_LINE.search(line)]
    pick = errors[-1] if errors else (lines[-1] if lines else "")
    return LOG_PREFIX.sub("", pick)[:200]


def read_report(path):
    """(samples, ok, verdict counts, ok speedups, degenerate reason or None, reasons of the
    candidates not measured) from tools/optimize's report.json; ValueError if bad. A candidate
    whose verification failed by the machine (its result's cause "environment": a loaded host
    slowed the reference, the compiler's service failed) says nothing of the policy: it is not
    a sample, and its reason is returned instead (a duplicate shares its original's result)."""
    rep = load_json(path)
    cands = rep.get("candidates") if isinstance(rep, dict) else None
    if not isinstance(cands, list):
        raise ValueError(f"{path}: field candidates: expected an array")
    verdicts, speedups, degenerate, unmeasured = {}, [], None, []
    results = [c.get("result") if isinstance(c, dict) and isinstance(c.get("result"), dict) else {} for c in cands]
    for i, c in enumerate(cands):
        v = c.get("verdict") if isinstance(c, dict) else None
        if not isinstance(v, str):
            raise ValueError(f"{path}: candidates[{i}]: no verdict")
        res = results[i]
        dup = c.get("duplicate_of")
        if not res and isinstance(dup, int) and not isinstance(dup, bool) and 0 <= dup < len(cands):
            res = results[dup]
        cause = c.get("cause") or res.get("cause")
        reason = c.get("reason") or res.get("reason")
        if degenerate is None and (c.get("task_degenerate") is True or res.get("task_degenerate") is True):
            degenerate = str(res.get("degenerate_reason") or "flagged by the evaluator")
        if v != "ok" and cause == "environment":
            unmeasured.append(f"{v}: {reason or 'no reason given'}")
            continue
        verdicts[v] = verdicts.get(v, 0) + 1
        s = c.get("speedup")
        if v == "ok":
            if not isinstance(s, (int, float)) or isinstance(s, bool):
                raise ValueError(f"{path}: candidates[{i}]: an ok candidate without a speedup")
            speedups.append(float(s))
    return len(cands) - len(unmeasured), verdicts.get("ok", 0), verdicts, speedups, degenerate, unmeasured


def unmeasured_in(report):
    """The reasons of report's candidates that were not measured; none if it cannot be read
    (score_task's read then names the problem)."""
    try:
        return read_report(report)[5]
    except (OSError, ValueError):
        return []


def score_task(name, split, level, args, out, deadline):
    """Runs tools/optimize for one task; its record for scores.json."""
    dest = os.path.join(out, "tasks", name)
    log = dest + ".log"
    rec = {"task": name, "split": split, "level": level, "status": "failed", "reason": "", "rc": None,
           "samples": 0, "not_measured": 0, "ok": 0, "verdicts": {}, "best_speedup": None, "counted_speedup": None,
           "ok_speedups": [], "degenerate": None, "seconds": 0.0, "out": os.path.relpath(dest, out),
           "log": os.path.relpath(log, out)}
    if deadline is not None and time.monotonic() >= deadline:
        rec.update(status="not scored", reason="--time-limit reached before it started")
        return rec
    cmd = [os.path.join(TREE, "tools", "optimize"), "--model", args.model, "--task", name, "--tasks-dir",
           args.tasks_dir, "-n", str(args.n), "--backend", args.backend, "--out", dest]
    if args.config:
        cmd += ["--config", args.config]
    for s in args.set:
        cmd += ["--set", s]
    if args.seed is not None:
        cmd += ["--seed", str(args.seed)]
    report = os.path.join(dest, "report.json")
    start = time.monotonic()
    try:
        # A previous run's report must not pass for this one's.
        if os.path.exists(report):
            os.remove(report)
        with open(log, "w", encoding="utf-8") as lf:
            oom_try = env_try = 1
            while True:
                lf.write("$ " + shlex.join(cmd) + "\n")
                lf.flush()
                rc = subprocess.run(cmd, stdout=lf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
                # The evaluator ran out of GPU memory (other processes hold it: the machine's
                # state, not the policy's): again after a pause, as the run's evaluators do.
                if rc == 3 and oom_try < OOM_ATTEMPTS and "out of memory" in last_line(log):
                    lf.write(f"{PROG}: out of GPU memory; tools/optimize again in {OOM_PAUSE_S * oom_try} s "
                             f"(try {oom_try + 1} of {OOM_ATTEMPTS})\n")
                    lf.flush()
                    time.sleep(OOM_PAUSE_S * oom_try)
                    oom_try += 1
                    continue
                # Verifications the machine failed (a loaded host, often this tool's other
                # tasks beside it): the whole task again after a pause, so that every sample
                # is measured; what is still unmeasured after the last try is reported.
                unmeasured = unmeasured_in(report) if rc in (0, 1) else []
                if unmeasured and env_try < ENV_ATTEMPTS:
                    lf.write(f"{PROG}: {len(unmeasured)} candidate(s) not measured, the machine failed their "
                             f"verification ({unmeasured[0]}); tools/optimize again in {ENV_PAUSE_S * env_try} s "
                             f"(try {env_try + 1} of {ENV_ATTEMPTS})\n")
                    lf.flush()
                    os.remove(report)
                    time.sleep(ENV_PAUSE_S * env_try)
                    env_try += 1
                    continue
                break
    except OSError as e:
        rec["reason"] = f"could not run tools/optimize ({e.strerror or e})"
        return rec
    rec["seconds"] = round(time.monotonic() - start, 1)
    rec["rc"] = rc
    # 0: some candidate verified ok, 1: none did; both leave a report.
    if rc not in (0, 1):
        how = f"killed by signal {-rc}" if rc < 0 else f"exited {rc}"
        tail = last_line(log)
        rec["reason"] = f"tools/optimize {how}" + (f": {tail}" if tail else "")
        return rec
    if not os.path.exists(report):
        rec["reason"] = f"tools/optimize exited {rc} but wrote no report.json"
        return rec
    try:
        samples, ok, verdicts, speedups, degenerate, unmeasured = read_report(report)
    except ValueError as e:
        rec["reason"] = str(e)
        return rec
    rec["not_measured"] = len(unmeasured)
    if samples == 0 and unmeasured:
        rec["reason"] = (f"no candidate was measured: the machine failed all {len(unmeasured)} verifications "
                         f"in {ENV_ATTEMPTS} tries ({unmeasured[0]})")
        return rec
    best = max(speedups) if speedups else None
    rec.update(status="scored", samples=samples, ok=ok, verdicts=verdicts, ok_speedups=speedups, best_speedup=best,
               counted_speedup=best if best is not None else 1.0, degenerate=degenerate)
    if degenerate is not None and not args.include_degenerate:
        rec.update(status="degenerate", reason=f"task degenerate: {degenerate}")
    return rec


def mean(xs):
    return sum(xs) / len(xs) if xs else None


def make_row(split, level, recs):
    scored = [r for r in recs if r["status"] == "scored"]
    tasks, samples = len(scored), sum(r["samples"] for r in scored)
    ok = sum(r["ok"] for r in scored)
    counted = [r["counted_speedup"] for r in scored]
    failed = sum(1 for r in recs if r["status"] == "failed")
    degenerate = sum(1 for r in recs if r["status"] == "degenerate")
    return {"split": split, "level": level, "tasks": tasks, "failed": failed, "degenerate": degenerate,
            "not_scored": len(recs) - tasks - failed - degenerate, "samples": samples, "ok": ok,
            "not_measured": sum(r.get("not_measured", 0) for r in scored),
            "correct_pct": 100.0 * ok / samples if samples else None,
            "fast1_pct": 100.0 * sum(1 for r in scored if r["counted_speedup"] > 1.0) / tasks if tasks else None,
            "solved_pct": 100.0 * sum(1 for r in scored if r["ok"] > 0) / tasks if tasks else None,
            "mean_speedup": mean(counted), "median_speedup": statistics.median(counted) if counted else None,
            "mean_ok_speedup": mean([s for r in scored for s in r["ok_speedups"]])}


def make_rows(records):
    """Per (split, level), then the split's total (level "all"); splits without tasks are left out."""
    rows = []
    for split in SPLITS:
        recs = [r for r in records if r["split"] == split]
        if not recs:
            continue
        for level in sorted({r["level"] for r in recs}):
            rows.append(make_row(split, level, [r for r in recs if r["level"] == level]))
        rows.append(make_row(split, "all", recs))
    return rows


# --- outputs ------------------------------------------------------------------------

def pct(v):
    return "–" if v is None else f"{v:.1f}"


def spd(v):
    return "–" if v is None else f"{v:.3f}"


HEADERS = ["split", "level", "tasks", "failed", "samples", "correct %", "fast_1 %", "solved %", "mean speedup",
           "median speedup", "mean ok-sample speedup"]


def md_table(headers, rows):
    return "\n".join(["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
                     + ["| " + " | ".join(r) + " |" for r in rows])


def table_md(meta, rows, records):
    head = (f"Policy `{meta['model']}`" + (f" ({meta['label']})" if meta["label"] else "")
            + f": n = {meta['n']} per task, backend {meta['backend']}, {meta['date']}, {meta['machine']}")
    notes = [f"Prompts: {PROMPT_NOTE}.",
             COLUMNS_NOTE]
    failed = [r for r in records if r["status"] == "failed"]
    if failed:
        notes.append(f"{len(failed)} task(s) failed and are not in the figures: "
                     + "; ".join(f"{r['task']} ({r['reason']}, log {r['log']})" for r in failed) + ".")
    degenerate = [r for r in records if r["status"] == "degenerate"]
    if degenerate:
        notes.append(f"{len(degenerate)} task(s) are degenerate for the evaluator (the reference output barely depends "
                     "on the inputs, so a constant passes) and are not in the figures (--include-degenerate counts "
                     "them): " + "; ".join(f"{r['task']} ({r['degenerate']})" for r in degenerate) + ".")
    included = [r["task"] for r in records if r["status"] == "scored" and r.get("degenerate")]
    if included:
        notes.append(f"{len(included)} degenerate task(s) are counted (--include-degenerate): "
                     + ", ".join(included) + ".")
    unmeasured = [r for r in records if r["status"] == "scored" and r.get("not_measured")]
    if unmeasured:
        notes.append(f"{sum(r['not_measured'] for r in unmeasured)} sample(s) were not measured (the machine failed "
                     f"their verification in all {ENV_ATTEMPTS} tries: cause environment, e.g. a loaded host) and are "
                     "not in the figures: " + ", ".join(f"{r['task']} {r['not_measured']}" for r in unmeasured) + ".")
    skipped = [r["task"] for r in records if r["status"] == "not scored"]
    if skipped:
        notes.append(f"{len(skipped)} task(s) were not scored (--time-limit reached; tasks run in a seeded random "
                     "order, so the scored ones are a random subset): " + ", ".join(skipped) + ".")
    body = md_table(HEADERS, [[r["split"], str(r["level"]), str(r["tasks"]), str(r["failed"]), str(r["samples"]),
                               pct(r["correct_pct"]), pct(r["fast1_pct"]), pct(r["solved_pct"]),
                               spd(r["mean_speedup"]), spd(r["median_speedup"]), spd(r["mean_ok_speedup"])]
                              for r in rows])
    per_task = md_table(["task", "split", "level", "samples", "ok", "best speedup", "verdicts"],
                        [[r["task"], r["split"], str(r["level"]), str(r["samples"]), str(r["ok"]),
                          spd(r["best_speedup"]) if r["status"] in ("scored", "degenerate") else r["status"],
                          (", ".join(f"{k} {v}" for k, v in sorted(r["verdicts"].items())) or r["reason"])
                          + (f"; not measured {r['not_measured']}" if r.get("not_measured") else "")
                          + ("; degenerate: left out" if r["status"] == "degenerate" else "")]
                         for r in records])
    summary = head + "\n\n" + "\n\n".join(notes) + "\n\n" + body + "\n"
    return summary, summary + "\nPer task:\n\n" + per_task + "\n"


def write_atomic(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


# --- --compare: several scored policies in one table ------------------------------------

def load_scores(folder):
    """A tools/score-policy output folder's scores.json, checked; exit 2 naming the file and field."""
    path = os.path.join(folder, "scores.json")
    try:
        j = load_json(path)
    except ValueError as e:
        die(2, f"{e} (a tools/score-policy --out folder?)")
    if not isinstance(j, dict) or j.get("format") != "kf-policy-scores":
        die(2, f"{path}: field format: expected 'kf-policy-scores'")
    if not isinstance(j.get("tasks"), list):
        die(2, f"{path}: field tasks: expected a list")
    need = {"task": str, "split": str, "level": int, "status": str}
    scored_need = {"samples": int, "ok": int, "ok_speedups": list, "counted_speedup": (int, float)}
    for i, t in enumerate(j["tasks"]):
        where = f"{path}: tasks[{i}]" + (f" ({t['task']})" if isinstance(t, dict) and "task" in t else "")
        if not isinstance(t, dict):
            die(2, f"{where}: expected an object")
        fields = dict(need, **scored_need) if t.get("status") == "scored" else need
        for k, typ in fields.items():
            if not isinstance(t.get(k), typ) or isinstance(t.get(k), bool):
                die(2, f"{where}: field {k}: missing or not a {typ.__name__ if isinstance(typ, type) else 'number'}")
        if t["split"] not in SPLITS:
            die(2, f"{where}: field split: '{t['split']}' is not one of {', '.join(SPLITS)}")
    return path, j


def compare_md(names, runs, by_name, common, left_out):
    """The --compare table: per (split, level), one row per policy side by side, then per task.
    by_name[i] maps a task name to its record in runs[i]."""
    paths = [p for p, _ in runs]
    first = runs[0][1]
    n_train = sum(1 for _, split in common if split == "train")
    head = (f"{len(names)} policies on the {len(common)} task(s) every one of them scored ({n_train} train, "
            f"{len(common) - n_train} held-out); scores from " + ", ".join(paths))
    notes = [f"Prompts: {PROMPT_NOTE}.", COLUMNS_NOTE]
    settings = []
    for key in ("n", "backend", "seed", "config", "sets", "machine"):
        vals = [j.get(key) for _, j in runs]
        if any(v != vals[0] for v in vals):
            settings.append(f"{key} " + " / ".join(json.dumps(v) for v in vals))
    if settings:
        notes.append("**The runs' settings differ** (in policy order): " + "; ".join(settings) + ".")
    else:
        notes.append(f"Same settings for all: n = {first.get('n')} per task, backend {first.get('backend')}, "
                     f"seed {first.get('seed')}, {first.get('machine')}.")
    if left_out:
        notes.append(f"{len(left_out)} task(s) left out, not scored by every policy: "
                     + "; ".join(f"{t} ({why})" for t, why in left_out) + ".")
    by_run = [make_rows([recs[t] for t, _ in common]) for recs in by_name]
    rows = []
    for i in range(len(by_run[0])):  # the same (split, level) rows for every policy: the same tasks
        for name, rr in zip(names, by_run):
            r = rr[i]
            rows.append([name, r["split"], str(r["level"]), str(r["tasks"]), str(r["samples"]), pct(r["correct_pct"]),
                         pct(r["fast1_pct"]), pct(r["solved_pct"]), spd(r["mean_speedup"]),
                         spd(r["median_speedup"]), spd(r["mean_ok_speedup"])])
    table = md_table(["policy"] + [h for h in HEADERS if h != "failed"], rows)
    cells = []
    for t, split in common:
        row = [t, split]
        for recs in by_name:
            rec = recs[t]
            row.append(f"{rec['ok']}/{rec['samples']}" + (f", {rec['counted_speedup']:.3f}x" if rec["ok"] else ""))
        cells.append(row)
    per_task = md_table(["task", "split"] + [f"{n}: ok, best" for n in names], cells)
    return head + "\n\n" + "\n\n".join(notes) + "\n\n" + table + "\n\nPer task:\n\n" + per_task + "\n"


def compare_main(argv):
    ap = argparse.ArgumentParser(prog=PROG + " --compare",
                                 description="Several scored policies (tools/score-policy --out folders) in one "
                                             "per-level table, on the tasks every one of them scored.")
    ap.add_argument("dirs", nargs="+", metavar="DIR", help="score folders, in table order (SFT, stage 2, RL, ...)")
    ap.add_argument("--out", metavar="FILE", help="also write the table (markdown) to FILE")
    args = ap.parse_args(argv)
    if len(args.dirs) < 2:
        die(2, "--compare: expected two or more score folders")
    runs = [load_scores(d) for d in args.dirs]
    names = [j.get("label") or j.get("model") or d for d, (_, j) in zip(args.dirs, runs)]
    # Like for like: a task counts only where every policy scored it, and with one split.
    by_name = [{x["task"]: x for x in j["tasks"]} for _, j in runs]
    common, left_out = [], []
    for t in dict.fromkeys(x["task"] for _, j in runs for x in j["tasks"]):
        recs = [idx.get(t) for idx in by_name]
        missing = [n for n, r in zip(names, recs) if r is None or r["status"] != "scored"]
        if missing:
            left_out.append((t, "not scored by " + ", ".join(missing)))
            continue
        if any(r["split"] != recs[0]["split"] for r in recs):
            p = next(p for (p, _), r in zip(runs, recs) if r["split"] != recs[0]["split"])
            die(2, f"{p}: task {t} is {'/'.join(r['split'] for r in recs)} across the folders: they used different "
                   "held-out lists, so their splits cannot be compared")
        common.append((t, recs[0]["split"]))
    if not common:
        die(2, "--compare: no task was scored by every policy")
    # make_rows keeps SPLITS order; the per-task list follows it too.
    common.sort(key=lambda ts: SPLITS.index(ts[1]))
    text = compare_md(names, runs, by_name, common, left_out)
    if args.out:
        try:
            write_atomic(args.out, text)
        except OSError as e:
            print(text)
            die(1, f"--out: {args.out}: cannot write ({e.strerror})")
    print(text)
    return 0


# --- main ---------------------------------------------------------------------------

def parse_levels(text):
    try:
        levels = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        levels = []
    if not levels or any(v < 1 for v in levels):
        die(2, f"--levels: expected levels like 1,2, got '{text}'")
    return levels


def main(argv):
    if argv[:1] == ["--compare"]:
        return compare_main(argv[1:])
    build = os.environ.get("KF_BUILD_DIR") or os.path.join(TREE, "build")
    ap = argparse.ArgumentParser(prog=PROG, description="A policy's per-level table on the built-in tasks: "
                                 "train and held-out split, via tools/optimize.")
    ap.add_argument("--version", action="version",
                    version="KernelForge " + open(os.path.join(TREE, "VERSION")).read().strip())
    ap.add_argument("--model", required=True, metavar="DIR", help="HF-format policy folder (tools/export, tools/sft)")
    ap.add_argument("--out", required=True, metavar="DIR", help="output folder")
    ap.add_argument("--tasks-dir", metavar="DIR", default=os.path.join(build, "tasks"),
                    help="imported tasks (default $KF_BUILD_DIR/tasks, else build/tasks of the tree)")
    ap.add_argument("--levels", metavar="L,L", help="task levels to score (default: all)")
    ap.add_argument("--include", metavar="A,B", help="exactly these tasks (overrides --levels)")
    ap.add_argument("--heldout", metavar="FILE", default=os.path.join(TREE, "tasks", "heldout.txt"),
                    help="held-out task list (default tasks/heldout.txt of the tree)")
    ap.add_argument("-n", type=int, default=8, help="samples per task (default 8)")
    ap.add_argument("--jobs", type=int, default=2, help="tools/optimize processes at once (default 2)")
    ap.add_argument("--backend", choices=["auto", "cpu", "cuda"], default="auto",
                    help="auto: cuda when nvidia-smi shows a GPU, else cpu")
    ap.add_argument("--config", metavar="FILE", help="config YAML for tools/optimize")
    ap.add_argument("--set", action="append", default=[], metavar="K=V", help="config override, repeatable")
    ap.add_argument("--seed", type=int, help="sampling and input seed (default: the config's run.seed)")
    ap.add_argument("--label", default="", help="a name for this policy in the table (e.g. SFT, stage 2, RL)")
    ap.add_argument("--include-degenerate", action="store_true",
                    help="count tasks the evaluator flags degenerate (left out of the figures by default)")
    ap.add_argument("--time-limit", type=float, metavar="S",
                    help="start no task after S seconds; the rest are listed as not scored (tasks run in a seeded "
                         "random order so a cut leaves a random subset)")
    args = ap.parse_args(argv)
    if not 1 <= args.n <= 256:
        die(2, f"-n: expected 1..256 samples, got {args.n}")
    if args.jobs < 1:
        die(2, f"--jobs: expected at least 1, got {args.jobs}")
    if args.seed is not None and args.seed < 0:
        die(2, f"--seed: expected a non-negative seed, got {args.seed}")
    for s in args.set:
        if "=" not in s or not s.split("=", 1)[0].strip():
            die(2, f"--set: expected key=value, got '{s}'")
    if args.config and not os.path.isfile(args.config):
        die(2, f"--config: {args.config} is not a file")
    gpu = gpu_name()
    if args.backend == "auto":
        args.backend = "cuda" if gpu else "cpu"
    levels = parse_levels(args.levels) if args.levels else None
    include = None
    if args.include is not None:
        include = list(dict.fromkeys(v.strip() for v in args.include.split(",") if v.strip()))
        if not include:
            die(2, "--include: expected task names like 001_relu,002_gelu")
        if levels is not None:
            warn("--include overrides --levels")

    tasks = select_tasks(args.tasks_dir, levels, include, args.backend)
    heldout = read_heldout(args.heldout)
    missing = [h for h in heldout if not os.path.isfile(os.path.join(args.tasks_dir, h, "task.json"))]
    if missing:
        warn(f"{args.heldout}: {len(missing)} held-out task(s) not imported in {args.tasks_dir}: {', '.join(missing)}")
    if not os.path.isdir(args.model):
        die(2, f"--model: model folder '{args.model}' does not exist")
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        die(2, f"--model: {os.path.join(args.model, 'config.json')}: not found (an HF folder from tools/export?)")
    binary = os.path.join(build, "actors", "kf-optimize")
    if not os.access(binary, os.X_OK):
        die(2, f"{binary} not built (cmake --build build --target kf-optimize)")
    out = args.out
    try:
        os.makedirs(os.path.join(out, "tasks"), exist_ok=True)
    except OSError as e:
        die(2, f"--out: cannot create {os.path.join(out, 'tasks')} ({e.strerror})")

    split_of = {name: ("held-out" if name in heldout else "train") for name, _ in tasks}
    n_held = sum(1 for s in split_of.values() if s == "held-out")
    print(f"{PROG}: {len(tasks)} task(s) ({len(tasks) - n_held} train, {n_held} held-out) from {args.tasks_dir}, "
          f"n {args.n}, backend {args.backend}, {min(args.jobs, len(tasks))} at once; {PROMPT_NOTE}. "
          f"Logs: {os.path.join(out, 'tasks')}/", flush=True)
    records, done = {}, 0
    deadline = time.monotonic() + args.time_limit if args.time_limit else None
    # Run order only (the tables keep name order): a --time-limit cut must not drop one
    # level or split wholesale.
    run_order = list(tasks)
    random.Random(0).shuffle(run_order)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs)
    try:
        futures = {pool.submit(score_task, name, split_of[name], level, args, out, deadline): name
                   for name, level in run_order}
        for fut in concurrent.futures.as_completed(futures):
            r = fut.result()
            records[r["task"]] = r
            done += 1
            what = (f"{r['ok']}/{r['samples']} ok, best {spd(r['best_speedup'])}"
                    + (f", {r['not_measured']} not measured" if r.get("not_measured") else "") if r["status"] == "scored"
                    else f"{r['ok']}/{r['samples']} ok; left out of the tables: {r['reason']} "
                         "(--include-degenerate counts it)" if r["status"] == "degenerate"
                    else "not scored (--time-limit)" if r["status"] == "not scored"
                    else f"FAILED: {r['reason']} (log {os.path.join(out, r['log'])})")
            print(f"[{done}/{len(tasks)}] {r['task']} ({r['split']}, level {r['level']}): {what}, {r['seconds']:.0f} s",
                  flush=True)
    except KeyboardInterrupt:
        # The children got the same SIGINT; don't start the queued ones.
        pool.shutdown(wait=True, cancel_futures=True)
        die(130, "interrupted; no scores written")
    pool.shutdown()

    ordered = [records[name] for name, _ in tasks]
    rows = make_rows(ordered)
    meta = {"model": args.model, "label": args.label, "n": args.n, "backend": args.backend,
            "date": time.strftime("%Y-%m-%d %H:%M %Z"), "machine": gpu or "CPU"}
    summary, full = table_md(meta, rows, ordered)
    scores = dict(meta, format="kf-policy-scores", version=1, model_abs=os.path.abspath(args.model),
                  seed=args.seed, config=args.config, sets=args.set, tasks_dir=args.tasks_dir, heldout=args.heldout,
                  levels=levels, include=include, prompt="no-exemplar (first-round)", unsolved_speedup=1.0,
                  include_degenerate=args.include_degenerate,
                  degenerate=[r["task"] for r in ordered if r["status"] == "degenerate"],
                  failed=[r["task"] for r in ordered if r["status"] == "failed"],
                  not_scored=[r["task"] for r in ordered if r["status"] == "not scored"], tasks=ordered, rows=rows)
    try:
        write_atomic(os.path.join(out, "scores.json"), json.dumps(scores, indent=1) + "\n")
        write_atomic(os.path.join(out, "table.md"), full)
    except OSError as e:
        print(summary)
        die(1, f"{e.filename or out}: cannot write ({e.strerror})")
    print()
    print(summary)
    print(f"per task: {os.path.join(out, 'table.md')}; scores: {os.path.join(out, 'scores.json')}")
    return 1 if scores["failed"] or scores["not_scored"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

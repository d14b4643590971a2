"""tools/report RUN_DIR [--out DIR] [--pool RUN_DIR2 ...]: plots and one HTML page for a run directory.

Reads (each optional; a missing or corrupt file is skipped with a warning naming it):
  RUN_DIR/metrics/learner.jsonl    kf-learner, one line per step (loss, grad_norm, lr, ...)
  RUN_DIR/metrics/run.jsonl        the launcher's status lines (samples_per_s, verdict
                                   fractions, speedups, queue depths, policy_lag, ...)
  RUN_DIR/metrics/actor-*.jsonl    each actor's lines (samples_per_s, policy_lag_mean, ...)
  RUN_DIR/metrics/verdicts-*.jsonl each evaluator's lines, one per scored candidate (t, task,
                                   level, verdict, speedup, reason, ...)
  RUN_DIR/metrics/groups-*.jsonl   each actor's lines, one per group (the prompt's exemplars
                                   shown and cut, completions, extraction failures)
  RUN_DIR/metrics/probe.jsonl      actor 0's learning-curve probe, one line per probed
                                   policy version (reward_mean, pass_rate, per task)
  RUN_DIR/kernels/kernel_db.json   the kernel database saved at checkpoint
Writes into --out (default RUN_DIR/report): reward.png, learner.png, learning.png (the
learning curve: probe reward and pass rate by policy version next to kl_start, entropy,
clip fraction, completion lengths and the share of groups skipped for equal rewards),
speedup.png, verdicts.png, throughput.png and index.html (the plots, the probe table plus the
best kernel of each task), and prints each path written. From the verdict logs, when there are any: windows.json and windows.png
(per 1-minute window: verified, correct %, fast_1 %, mean / median / best / within-task
speedup of the ok results; the first-vs-final-window ratios and the within-task trend), a
per-level table, compile errors by first error line, what each kind of prompt produced
(with the actors' group lines), per turn for multi-turn runs (what each turn produced, and
per member whether its next answer got better) and the rejected cheats with their reasons;
the tables are also printed as text. Without verdict logs (runs older than them) that part is skipped
with one line on stdout.
--pool RUN_DIR2 ... (repeatable) adds the within-task trend of RUN_DIR and those runs
together ("within_task_pooled" in windows.json, and a printed line): each run's ok speedups
over its own tasks' geometric means, on its own time axis, groups resampled across runs.
One 10-minute run's interval is wide; replications pooled say whether the rise is real.
Exit 0 ok, 1 error (e.g. matplotlib missing), 2 usage / no metrics.
docs/metrics.md describes the fields.
"""
import argparse
import glob
import html
import json
import math
import os
import random
import re
import statistics
import sys
import time

PROG = "tools/report"


def warn(msg):
    print(f"{PROG}: warning: {msg}", file=sys.stderr)


def die(code, msg):
    print(f"{PROG}: {msg}", file=sys.stderr)
    sys.exit(code)


# --- inputs -------------------------------------------------------------------------

def read_jsonl(path, usable=None, what="JSON objects"):
    """The records of a JSONL file, or None when it cannot be read. Lines that are not JSON
    objects (a torn last line after a kill, hand edits), or that `usable` rejects, are
    skipped with one warning; `what` names what a good line is in it."""
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
        if isinstance(rec, dict) and (usable is None or usable(rec)):
            records.append(rec)
        else:
            bad.append(n)
    if bad:
        shown = ", ".join(str(n) for n in bad[:5]) + (" ..." if len(bad) > 5 else "")
        warn(f"{path}: {len(bad)} line(s) are not {what} (line {shown}); skipped them")
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


# --- verdict logs -------------------------------------------------------------------

MAX_CHEATS = 50


def is_verdict(rec):
    """A verdict line needs a time, a verdict and a task; every other key may be missing."""
    return (num(rec, "t") is not None and isinstance(rec.get("verdict"), str) and rec["verdict"] != ""
            and isinstance(rec.get("task"), str) and rec["task"] != "")


def read_verdicts(paths):
    """The usable lines of every verdict log, oldest first, and the files they came from."""
    records, used = [], []
    for path in paths:
        recs = read_jsonl(path, is_verdict, "JSON objects with t, verdict and task")
        if recs is not None:
            records += recs
            used.append(path)
    records.sort(key=lambda r: num(r, "t"))
    return records, used


def level_of(rec):
    """The task's level, or None (unknown): the evaluator writes 0 when the task did not load."""
    v = num(rec, "level")
    return int(v) if v is not None and v.is_integer() and v >= 1 else None


def verdict_stats(recs):
    """n, ok and fast_1 counts and percentages, and the ok results' mean, median and best speedup.
    An ok line without a speedup counts as correct but not in the speedup figures."""
    speeds = sorted(s for s in (num(r, "speedup") for r in recs if r["verdict"] == "ok") if s is not None)
    n = len(recs)
    ok = sum(1 for r in recs if r["verdict"] == "ok")
    fast = sum(1 for s in speeds if s > 1.0)
    return {"n": n, "ok": ok, "fast1": fast,
            "correct_pct": 100.0 * ok / n if n else None, "fast1_pct": 100.0 * fast / n if n else None,
            "mean_speedup": sum(speeds) / len(speeds) if speeds else None,
            "median_speedup": statistics.median(speeds) if speeds else None,
            "best_speedup": speeds[-1] if speeds else None}


def summarize_verdicts(records, min_window):
    """windows.json's content. Windows are whole minutes of the time axis (records carry
    '_min' from time_axis), so they line up with the other plots."""
    by_minute = {}
    for r in records:
        by_minute.setdefault(int(math.floor(r["_min"])), []).append(r)
    windows = []
    for m in sorted(by_minute):
        w = {"minute": m}
        w.update(verdict_stats(by_minute[m]))
        w["few"] = w["n"] < min_window
        windows.append(w)
    # Thin windows are too noisy to anchor the comparison; one window compares with nothing.
    usable = [w for w in windows if not w["few"] and w["mean_speedup"] is not None]
    first_final = None
    if len(usable) >= 2 and usable[0]["mean_speedup"] > 0:
        first, final = usable[0], usable[-1]
        first_final = {"first_minute": first["minute"], "final_minute": final["minute"],
                       "first_mean": first["mean_speedup"], "final_mean": final["mean_speedup"],
                       "ratio": final["mean_speedup"] / first["mean_speedup"]}
    by_level = {}
    for r in records:
        by_level.setdefault(level_of(r), []).append(r)
    levels = []
    for lv in sorted(by_level, key=lambda v: (v is None, v or 0)):
        row = {"level": lv, "tasks": len({r["task"] for r in by_level[lv]})}
        row.update(verdict_stats(by_level[lv]))
        levels.append(row)
    trend, trend_geomean = task_trend(records)
    within = within_task(records, windows)
    compile_errors = compile_error_kinds(records)
    versions = version_buckets(records)
    all_cheats = [r for r in records if r["verdict"] == "rejected_cheat"]
    cheats = [{"minute": round(r["_min"], 2), "t": num(r, "t"), "task": r["task"], "level": level_of(r),
               "evaluator": r.get("evaluator"), "candidate": r.get("candidate"),
               "policy_version": r.get("policy_version"),
               "reason": r["reason"] if isinstance(r.get("reason"), str) else ""}
              for r in all_cheats[-MAX_CHEATS:]]
    return {"min_window": min_window, "verified": len(records), "windows": windows, "levels": levels,
            "first_final_ratio": first_final["ratio"] if first_final else None, "first_final": first_final,
            "task_trend": trend, "task_trend_geomean": trend_geomean, "within_task": within,
            "compile_errors": compile_errors, "versions": versions,
            "cheats_total": len(all_cheats), "cheats": cheats, "time_split": time_split(records)}


def verdict_kind(rec):
    """ok, timing unstable, or the verdict's name: the kinds whose verification time differs."""
    reason = rec.get("reason") if isinstance(rec.get("reason"), str) else ""
    # ok results measured unstably carry the flag (older logs: a runtime_error reason)
    if rec.get("timing_unstable") or reason.startswith("timing unstable"):
        return "timing unstable"
    return rec["verdict"]


TIME_PARTS = [("claim_wait_s", "memory claim wait"), ("lock_wait_s", "timing lock wait"),
              ("timing_s", "timed trials")]


def time_split(records):
    """Where the evaluators' verification time went, per kind of verdict: the records'
    verify_s summed, the median, the share of it spent waiting for the GPU memory claim,
    waiting for the timing lock, and in the timed trials (lock waits of the trials
    included), and the median number of timed trials. Only lines with verify_s count; the
    parts only from lines that carry them (older verdict logs do not)."""
    by_kind = {}
    for r in records:
        if num(r, "verify_s") is not None:
            by_kind.setdefault(verdict_kind(r), []).append(r)
    rows = []
    for kind, recs in sorted(by_kind.items(), key=lambda kv: -sum(num(r, "verify_s") for r in kv[1])):
        verify = [num(r, "verify_s") for r in recs]
        row = {"kind": kind, "n": len(recs), "verify_s": sum(verify), "median_verify_s": statistics.median(verify)}
        for key, _ in TIME_PARTS:
            have = [r for r in recs if num(r, key) is not None]
            total = sum(num(r, "verify_s") for r in have)
            row[key + "_pct"] = 100.0 * sum(num(r, key) for r in have) / total if have and total > 0 else None
        trials = [num(r, "timed_trials") for r in recs if num(r, "timed_trials")]
        row["median_timed_trials"] = statistics.median(trials) if trials else None
        rows.append(row)
    return rows


TIME_HEADERS = ["verdict", "n", "verify s", "median s"] + [name + " %" for _, name in TIME_PARTS] + ["timed trials"]


def time_rows(summary):
    return [[t["kind"], str(t["n"]), f"{t['verify_s']:.0f}", f"{t['median_verify_s']:.2f}"] +
            [pct(t[key + "_pct"]) or "-" for key, _ in TIME_PARTS] +
            ["-" if t["median_timed_trials"] is None else f"{t['median_timed_trials']:g}"]
            for t in summary["time_split"]]


PROMPT_KINDS = ["no exemplars", "exemplars in full", "an exemplar cut"]


def is_group_line(rec):
    return (isinstance(rec.get("group"), int) and not isinstance(rec.get("group"), bool)
            and isinstance(rec.get("task"), str) and num(rec, "completions") is not None)


def prompt_kind(g):
    if (num(g, "exemplars_shown") or 0) <= 0:
        return PROMPT_KINDS[0]
    return PROMPT_KINDS[2] if (num(g, "exemplars_cut") or 0) > 0 else PROMPT_KINDS[1]


def prompt_split(groups, records):
    """What each kind of prompt produced: the actors' per-group lines (metrics/groups-*.jsonl:
    exemplars shown and cut, completions, extraction failures) joined with the verdicts on
    the group id. Per kind, in all and per task: groups, completions, and as shares of the
    completions: no extractable kernel, compile errors and ok results (an evaluator's
    compile_error of an extraction failure is counted once, as no kernel); the ok results'
    mean speedup. Rows of kinds without groups are left out."""
    by_group = {}
    for r in records:
        g = r.get("group")
        if isinstance(g, int) and not isinstance(g, bool):
            by_group.setdefault(g, []).append(r)
    cells = {}
    for g in groups:
        kind = prompt_kind(g)
        for key in ((kind, None), (kind, g["task"])):
            c = cells.setdefault(key, {"groups": 0, "completions": 0, "no_kernel": 0, "compile_error": 0, "ok": 0,
                                       "speeds": []})
            c["groups"] += 1
            c["completions"] += int(num(g, "completions"))
            c["no_kernel"] += int(num(g, "extraction_failures") or 0)
            for r in by_group.get(g["group"], []):
                reason = r.get("reason") if isinstance(r.get("reason"), str) else ""
                if r["verdict"] == "compile_error" and not reason.startswith("extract"):
                    c["compile_error"] += 1
                elif r["verdict"] == "ok":
                    c["ok"] += 1
                    if num(r, "speedup") is not None:
                        c["speeds"].append(num(r, "speedup"))
    rows = []
    for (kind, task) in sorted(cells, key=lambda k: (k[1] is not None, k[1] or "", PROMPT_KINDS.index(k[0]))):
        c = cells[(kind, task)]
        n = c["completions"]
        rows.append({"kind": kind, "task": task, "groups": c["groups"], "completions": n,
                     "no_kernel_pct": 100.0 * c["no_kernel"] / n if n else None,
                     "compile_error_pct": 100.0 * c["compile_error"] / n if n else None,
                     "ok_pct": 100.0 * c["ok"] / n if n else None,
                     "mean_ok_speedup": sum(c["speeds"]) / len(c["speeds"]) if c["speeds"] else None})
    return rows


PROMPT_HEADERS = ["task", "prompt", "groups", "completions", "no kernel %", "compile error %", "ok %", "mean ok"]


def prompt_rows(summary):
    return [[p["task"] or "all", p["kind"], str(p["groups"]), str(p["completions"]), pct(p["no_kernel_pct"]),
             pct(p["compile_error_pct"]), pct(p["ok_pct"]), spd(p["mean_ok_speedup"])] for p in summary["prompts"]]


PROMPT_TITLE = ("By prompt (the actors' metrics/groups-*.jsonl joined with the verdicts on the group; shares of "
                "the completions):")


# --- multi-turn refinement ----------------------------------------------------------

MASK64 = (1 << 64) - 1
MAX_MEMBERS = 4096  # a group line claiming more completions is not searched member by member


def splitmix(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def member_index(group, candidate, completions):
    """A candidate's index in its group, for verdict lines that do not carry it: the actor
    makes a candidate's id from its group id and its index (actors/src/actor.cpp,
    finish_group). None when no index below `completions` gives that id."""
    if not (is_int(group) and is_int(candidate)) or completions is None:
        return None
    for i in range(min(int(completions), MAX_MEMBERS)):
        if splitmix((group ^ ((i + 1) * 0x9E3779B97F4A7C15)) & MASK64) == candidate:
            return i
    return None


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


TURN_VERDICTS = ["ok", "incorrect", "compile_error", "runtime_error", "timeout", "rejected_cheat"]
NO_KERNEL = "no kernel"


def member_state(r):
    """A verdict line's outcome for the per-turn tables: the verdict, or "no kernel" for an
    evaluator's compile_error of a completion without an extractable kernel."""
    reason = r.get("reason") if isinstance(r.get("reason"), str) else ""
    if r["verdict"] == "compile_error" and reason.startswith("extract"):
        return NO_KERNEL
    return r["verdict"]


def turn_split(groups, records):
    """Multi-turn refinement (actors.turns > 1): per turn, what the members produced, and per
    member from turn t to turn t+1 whether its answer got better. None for a single-turn run
    (no group line or verdict line of a turn above 1).

    A verdict's turn is its line's "turn", else its group line's (metrics/groups-*.jsonl);
    a member is named by its turn-1 group and its index there: the line's "parent_group" /
    "parent_index", else the group line's "parent_group" and the member's index in its group
    (from the candidate id), which is the turn-1 index only when no member of the
    conversation's group ended before this turn (the group has as many completions as the
    turn-1 group). A member of a known group without a verdict line had no extractable
    kernel (the actor scored it itself) when the group's extraction failures account for
    all such members."""
    by_id = {}
    for g in groups:
        by_id.setdefault(g["group"], g)

    def line_turn(g):
        t = g.get("turn")
        return t if is_int(t) and t >= 1 else 1

    if not (any(line_turn(g) > 1 for g in by_id.values())
            or any(is_int(r.get("turn")) and r["turn"] > 1 for r in records)):
        return None

    def root_of(g):  # a group line's turn-1 group
        p = g.get("parent_group")
        return p if line_turn(g) > 1 and is_int(p) and p != 0 else g["group"]

    def identity(g):  # member index == turn-1 index for every member of this group
        if line_turn(g) == 1:
            return True
        root = by_id.get(root_of(g))
        return root is not None and root is not g and num(root, "completions") == num(g, "completions")

    # Each group of a known turn: its line (if any) and its verdict lines.
    cells = {}  # group id -> {"turn", "line", "verdicts": [(record, root key or None)]}
    unknown_turn = 0
    for r in records:
        gid = r.get("group")
        line = by_id.get(gid) if is_int(gid) else None
        t = r.get("turn")
        if not (is_int(t) and t >= 1):
            t = line_turn(line) if line is not None else None
        if t is None:
            unknown_turn += 1
            continue
        key = None
        pi, pg = r.get("parent_index"), r.get("parent_group")
        if is_int(pi) and pi >= 0 and (t == 1 or (is_int(pg) and pg != 0)):
            key = (gid if t == 1 else pg, pi)
        elif line is not None and identity(line):
            idx = member_index(gid, r.get("candidate"), num(line, "completions"))
            if idx is not None:
                key = (root_of(line), idx)
        c = cells.setdefault(gid, {"turn": t, "line": line, "verdicts": []})
        c["verdicts"].append((r, key))
    for gid, g in by_id.items():
        cells.setdefault(gid, {"turn": line_turn(g), "line": g, "verdicts": []})

    rows, states = {}, {}  # states: (turn-1 group, index) -> {turn: (state, speedup)}
    unjoined = 0
    for gid, c in cells.items():
        t, line, vs = c["turn"], c["line"], c["verdicts"]
        row = rows.setdefault(t, {"turn": t, "groups": 0, "members": 0, "no_kernel": 0, "verified": 0,
                                  "speeds": [], **{v: 0 for v in TURN_VERDICTS}})
        row["groups"] += 1
        members = int(num(line, "completions")) if line is not None else len(vs)
        failures = int(num(line, "extraction_failures") or 0) if line is not None else 0
        row["members"] += members
        row["no_kernel"] += failures
        for r, key in vs:
            s = member_state(r)
            speed = num(r, "speedup") if s == "ok" else None
            if s in TURN_VERDICTS:
                row[s] += 1
                row["verified"] += 1
                if speed is not None:
                    row["speeds"].append(speed)
            if key is None:
                unjoined += 1
            else:
                states.setdefault(key, {}).setdefault(t, (s, speed))
        # The members without a verdict line, where their turn-1 index is known.
        if line is not None and identity(line) and all(key is not None for _, key in vs):
            root = root_of(line)
            seen = {key for _, key in vs if key is not None}
            missing = [(root, i) for i in range(min(members, MAX_MEMBERS)) if (root, i) not in seen]
            if missing and len(missing) <= failures:
                for key in missing:
                    states.setdefault(key, {}).setdefault(t, (NO_KERNEL, None))

    turns = []
    for t in sorted(rows):
        row = rows[t]
        n, speeds = row["members"], sorted(row.pop("speeds"))
        row["fast1"] = sum(1 for s in speeds if s > 1.0)
        row["unscored"] = max(0, n - row["no_kernel"] - row["verified"])
        for key in TURN_VERDICTS + ["no_kernel", "fast1", "unscored"]:
            row[key + "_pct"] = 100.0 * row[key] / n if n else None
        row["mean_speedup"] = sum(speeds) / len(speeds) if speeds else None
        row["median_speedup"] = statistics.median(speeds) if speeds else None
        turns.append(row)

    pairs = []
    for t in sorted(rows):
        if t + 1 not in rows:
            continue
        p = {"from_turn": t, "to_turn": t + 1, "next_members": rows[t + 1]["members"], "pairs": 0,
             "fixed": 0, "broke": 0, "still_failing": 0, "faster": 0, "slower": 0, "same_speed": 0,
             "both_ok": 0, "transitions": {}}
        ratios = []
        for key in sorted(states, key=repr):
            s = states[key]
            if t not in s or t + 1 not in s:
                continue
            (a, sa), (b, sb) = s[t], s[t + 1]
            p["pairs"] += 1
            tr = f"{a} -> {b}"
            p["transitions"][tr] = p["transitions"].get(tr, 0) + 1
            if a != "ok" and b != "ok":
                p["still_failing"] += 1
            elif a != "ok":
                p["fixed"] += 1
            elif b != "ok":
                p["broke"] += 1
            else:
                p["both_ok"] += 1
                if sa is not None and sb is not None and sa > 0 and sb > 0:
                    ratios.append(sb / sa)
                if sa is None or sb is None or sa == sb:
                    p["same_speed"] += 1
                else:
                    p["faster" if sb > sa else "slower"] += 1
        p["improved"] = p["fixed"] + p["faster"]
        p["worse"] = p["broke"] + p["slower"]
        p["stayed"] = p["still_failing"] + p["same_speed"]
        p["unpaired"] = max(0, p["next_members"] - p["pairs"])
        ratios.sort()
        p["median_ratio"] = statistics.median(ratios) if ratios else None
        p["ratios"] = len(ratios)
        p["transitions"] = dict(sorted(p["transitions"].items(), key=lambda kv: (-kv[1], kv[0])))
        pairs.append(p)
    return {"turns": turns, "pairs": pairs, "unknown_turn": unknown_turn, "unjoined": unjoined}


TURN_HEADERS = ["turn", "groups", "members", "ok %", "fast_1 %", "incorrect %", "compile error %", "no kernel %",
                "runtime error %", "timeout %", "cheat %", "unscored %", "mean", "median"]


def turn_rows(summary):
    return [[str(t["turn"]), str(t["groups"]), str(t["members"]), pct(t["ok_pct"]), pct(t["fast1_pct"]),
             pct(t["incorrect_pct"]), pct(t["compile_error_pct"]), pct(t["no_kernel_pct"]),
             pct(t["runtime_error_pct"]), pct(t["timeout_pct"]), pct(t["rejected_cheat_pct"]),
             pct(t["unscored_pct"]), spd(t["mean_speedup"]), spd(t["median_speedup"])]
            for t in summary["turns"]["turns"]]


PAIR_HEADERS = ["turns", "went on", "paired", "improved", "worse", "stayed", "fixed", "broke", "faster", "slower",
                "still failing", "both ok", "median ratio"]


def pair_rows(summary):
    return [[f"{p['from_turn']}->{p['to_turn']}", str(p["next_members"]), str(p["pairs"]), str(p["improved"]),
             str(p["worse"]), str(p["stayed"]), str(p["fixed"]), str(p["broke"]), str(p["faster"]),
             str(p["slower"]), str(p["still_failing"]), str(p["both_ok"]), spd(p["median_ratio"])]
            for p in summary["turns"]["pairs"]]


TURN_TITLE = ("Per turn (multi-turn refinement; shares of the members, the completions of the turn's groups; "
              "speedups are of the ok results):")
PAIR_TITLE = ("Turn t -> t+1, per member (its turn-1 group and index; improved = fixed (not ok -> ok) + faster, "
              "worse = broke (ok -> not ok) + slower; median ratio = speedup at t+1 / at t where both are ok):")


def turn_notes(summary):
    ts = summary["turns"]
    notes = []
    for p in ts["pairs"]:
        top = ", ".join(f"{k} {v}" for k, v in list(p["transitions"].items())[:6])
        if top:
            notes.append(f"{p['from_turn']}->{p['to_turn']} transitions: {top}")
        if p["unpaired"]:
            notes.append(f"{p['from_turn']}->{p['to_turn']}: {p['unpaired']} of the {p['next_members']} turn-"
                         f"{p['to_turn']} members could not be paired with their turn-{p['from_turn']} answer "
                         "(their answer before has no verdict line, or their verdict lines carry no parent_index and "
                         "some members of the conversation ended before)")
    if ts["unknown_turn"]:
        notes.append(f"{ts['unknown_turn']} verdict line(s) of groups without a group line and without a turn: "
                     "left out of the per-turn tables")
    return notes


MAX_VERSION_BUCKETS = 6


def version_buckets(records):
    """The verdicts by the policy version that sampled them, in at most MAX_VERSION_BUCKETS
    equal ranges of versions: what each policy wrote, whenever the evaluator got to it (a
    minute window mixes versions when the queue lags)."""
    versioned = [(r, v) for r in records for v in [r.get("policy_version")]
                 if isinstance(v, int) and not isinstance(v, bool)]
    if not versioned:
        return []
    lo = min(v for _, v in versioned)
    hi = max(v for _, v in versioned)
    width = max(1, -(-(hi - lo + 1) // MAX_VERSION_BUCKETS))
    by_bucket = {}
    for r, v in versioned:
        by_bucket.setdefault((v - lo) // width, []).append(r)
    out = []
    for b in sorted(by_bucket):
        row = {"first_version": lo + b * width, "last_version": min(hi, lo + (b + 1) * width - 1),
               "tasks": len({r["task"] for r in by_bucket[b]})}
        row.update(verdict_stats(by_bucket[b]))
        out.append(row)
    return out


VERSION_HEADERS = ["versions", "tasks", "verified", "correct %", "fast_1 %", "mean", "median", "best"]


def version_rows(summary):
    return [[f"{v['first_version']}-{v['last_version']}", str(v["tasks"]), str(v["n"]), pct(v["correct_pct"]),
             pct(v["fast1_pct"]), spd(v["mean_speedup"]), spd(v["median_speedup"]), spd(v["best_speedup"])]
            for v in summary["versions"]]


def task_trend(records):
    """Per task, its first visit against its last one (a visit = one group of candidates,
    the verdict lines' "group"), over visits with at least one ok result: the minute windows
    mix tasks, this compares a task only with itself. Returns the rows of the tasks with two
    or more such visits, and the geometric mean of their last/first mean-speedup ratios."""
    visits = {}  # (task, group) -> records
    for r in records:
        g = r.get("group")
        if isinstance(g, int) and not isinstance(g, bool):
            visits.setdefault((r["task"], g), []).append(r)
    by_task = {}
    for (task, _), recs in visits.items():
        stats = verdict_stats(recs)
        if stats["mean_speedup"] is not None:
            by_task.setdefault(task, []).append((min(num(r, "t") for r in recs), stats))
    rows = []
    for task in sorted(by_task):
        v = sorted(by_task[task], key=lambda x: x[0])
        if len(v) < 2 or v[0][1]["mean_speedup"] <= 0:
            continue
        first, last = v[0][1], v[-1][1]
        rows.append({"task": task, "visits": len(v), "first_mean": first["mean_speedup"],
                     "last_mean": last["mean_speedup"], "ratio": last["mean_speedup"] / first["mean_speedup"],
                     "first_correct_pct": first["correct_pct"], "last_correct_pct": last["correct_pct"]})
    ratios = [r["ratio"] for r in rows if r["ratio"] > 0]
    geomean = math.exp(sum(math.log(x) for x in ratios) / len(ratios)) if ratios else None
    return rows, geomean


TREND_HEADERS = ["task", "visits", "first mean", "last mean", "ratio", "first correct %", "last correct %"]


def trend_rows(summary):
    return [[t["task"], str(t["visits"]), spd(t["first_mean"]), spd(t["last_mean"]), spd(t["ratio"]),
             pct(t["first_correct_pct"]), pct(t["last_correct_pct"])] for t in summary["task_trend"]]


def trend_text(summary):
    if not summary["task_trend"]:
        return "per task, first vs last visit: n/a (no task had two visits with an ok result)"
    return (f"per task, first vs last visit: geometric mean of the mean-speedup ratios "
            f"{summary['task_trend_geomean']:.3f} over {len(summary['task_trend'])} task(s)")


MAX_COMPILE_KINDS = 8
LOCATION = re.compile(r"^[^\s:]*(\(\d+\)|:\d+(:\d+)?):\s*")  # "k.cu(12): " or "k.cpp:3:9: "


def compile_error_kinds(records):
    """Compile errors by the compiler's first error line (the verdict lines' "diagnostic",
    when the log has it; its file:line prefix dropped), most frequent first, counted in the
    early and the late half of the policy versions: what the policy keeps getting wrong, and
    whether that changed as it trained. [] without such lines."""
    errs = [r for r in records if r["verdict"] == "compile_error" and isinstance(r.get("diagnostic"), str)
            and r["diagnostic"]]
    if not errs:
        return []
    versions = sorted(r["policy_version"] for r in errs if isinstance(r.get("policy_version"), int))
    split = versions[len(versions) // 2] if versions else None
    kinds = {}
    for r in errs:
        k = kinds.setdefault(LOCATION.sub("", r["diagnostic"]), {"n": 0, "early": 0, "late": 0})
        k["n"] += 1
        v = r.get("policy_version")
        if split is not None and isinstance(v, int):
            k["early" if v < split else "late"] += 1
    rows = [dict(message=m, **k) for m, k in sorted(kinds.items(), key=lambda kv: (-kv[1]["n"], kv[0]))]
    return [dict(r, split_version=split, total=len(errs), kinds=len(rows)) for r in rows[:MAX_COMPILE_KINDS]]


COMPILE_HEADERS = ["n", "early", "late", "first error"]


def compile_rows(summary):
    return [[str(k["n"]), str(k["early"]), str(k["late"]), k["message"]] for k in summary["compile_errors"]]


def compile_title(summary):
    k = summary["compile_errors"][0]
    return (f"Compile errors by first error line ({k['total']} with a diagnostic, {k['kinds']} kinds, top "
            f"{len(summary['compile_errors'])}; early = policy versions below {k['split_version']}, late = the rest):")


WITHIN_RESAMPLES = 1000


def within_task(records, windows):
    """Speedups with the task mix taken out. A minute window holds 4-6 groups, so a few of
    the tasks, and the tasks' speedups differ tenfold: a window's mean mostly says which
    tasks it held. Here each ok speedup is divided by its task's geometric mean over the run
    (tasks with two or more ok results; one result compares with nothing). Adds
    "within_task" (the geometric mean of those ratios, or None) to each window, and returns
    the trend: the within-task least-squares slope of the log speedups over minutes (both
    taken relative to their task's means) as a factor per 10 minutes, with a 95 % interval from resampling whole groups (seeded, so a report is
    reproducible), and the first/final usable window ratio. None without two such tasks'
    results over more than one minute."""
    points = []  # (group key, task, minute, log speedup)
    for r in records:
        s = num(r, "speedup")
        if r["verdict"] == "ok" and s is not None and s > 0:
            g = r.get("group")
            key = g if isinstance(g, int) and not isinstance(g, bool) else ("candidate", r.get("candidate"), r["t"])
            points.append((key, r["task"], r["_min"], math.log(s)))

    def relative(pts):
        # Both the log speedup and the minute are taken relative to the task's mean: a task
        # met mostly late (or early) in the run must not pass its level off as a trend.
        by_task = {}
        for _, task, x, y in pts:
            by_task.setdefault(task, []).append((x, y))
        centre = {t: (sum(x for x, _ in v) / len(v), sum(y for _, y in v) / len(v))
                  for t, v in by_task.items() if len(v) >= 2}
        return [(x, x - centre[task][0], y - centre[task][1]) for _, task, x, y in pts if task in centre], len(centre)

    def slope(rows):  # the within-task least-squares slope (x and y already centred per task)
        sxx = sum(dx * dx for _, dx, _ in rows)
        return sum(dx * dy for _, dx, dy in rows) / sxx if sxx > 0 else None

    rel, tasks = relative(points)
    by_minute = {}
    for x, _, y in rel:
        by_minute.setdefault(int(math.floor(x)), []).append(y)
    for w in windows:
        ys = by_minute.get(w["minute"])
        w["within_task"] = math.exp(sum(ys) / len(ys)) if ys else None
    b = slope(rel) if len(rel) >= 2 else None
    if b is None:
        return None
    groups = {}
    for p in points:
        groups.setdefault(p[0], []).append(p)
    keys = sorted(groups, key=repr)
    rng = random.Random(0)
    draws = []
    for _ in range(WITHIN_RESAMPLES):
        rows, _ = relative([p for k in rng.choices(keys, k=len(keys)) for p in groups[k]])
        d = slope(rows) if len(rows) >= 2 else None
        if d is not None:
            draws.append(d)
    draws.sort()
    usable = [w for w in windows if not w["few"] and w["within_task"] is not None]
    return {"ok_results": len(rel), "tasks": tasks, "groups": len(keys), "per_10_min": math.exp(10 * b),
            "low": math.exp(10 * draws[int(0.025 * len(draws))]) if draws else None,
            "high": math.exp(10 * draws[min(len(draws) - 1, int(0.975 * len(draws)))]) if draws else None,
            "first_minute": usable[0]["minute"] if len(usable) >= 2 else None,
            "final_minute": usable[-1]["minute"] if len(usable) >= 2 else None,
            "first_final_ratio": usable[-1]["within_task"] / usable[0]["within_task"] if len(usable) >= 2 else None}


def within_text(summary):
    wt = summary.get("within_task")
    if wt is None:
        return "within task: n/a (needs ok results of a task at two or more times)"
    ff = ("" if wt["first_final_ratio"] is None else
          f"first vs final window {wt['first_final_ratio']:.3f} (minutes {wt['first_minute']}, {wt['final_minute']}); ")
    ci = "" if wt["low"] is None else f", 95 % interval {wt['low']:.3f}-{wt['high']:.3f} (resampling the {wt['groups']} groups)"
    return (f"within task (each ok speedup over its task's geometric mean in the run; {wt['ok_results']} ok results "
            f"of {wt['tasks']} tasks): {ff}trend x{wt['per_10_min']:.3f} per 10 minutes{ci}")


def pooled_within_task(runs):
    """The within-task trend of several runs' verdict records together: `runs` is a list of
    record lists, each already on its own time axis ('_min'). A task of one run is never
    compared with the same task of another (their speeds differ with the run's policy and
    load), so tasks and groups are keyed by the run's index."""
    pooled = []
    for i, records in enumerate(runs):
        for r in records:
            r = dict(r)
            r["task"] = f"{i}:{r['task']}"
            g = r.get("group")
            if isinstance(g, int) and not isinstance(g, bool):
                r["group"] = i * (1 << 64) + g
            pooled.append(r)
    trend = within_task(pooled, [])
    if trend is not None:
        trend["runs"] = len(runs)
    return trend


def pooled_text(trend, names):
    if trend is None:
        return f"within task, pooled over {len(names)} runs: n/a (needs ok results of a task at two or more times)"
    ci = "" if trend["low"] is None else f", 95 % interval {trend['low']:.3f}-{trend['high']:.3f}"
    return (f"within task, pooled over {trend['runs']} runs ({', '.join(names)}; {trend['ok_results']} ok results, "
            f"{trend['groups']} groups): trend x{trend['per_10_min']:.3f} per 10 minutes{ci}")


def run_verdicts(run_dir):
    """A run folder's verdict records on its own time axis (minutes since its earliest
    metrics line)."""
    metrics = os.path.join(run_dir, "metrics")
    verdicts, _ = read_verdicts(sorted(glob.glob(os.path.join(metrics, "verdicts-*.jsonl"))))
    streams = [read_jsonl(path) for path in [os.path.join(metrics, "learner.jsonl"), os.path.join(metrics, "run.jsonl")]
               + sorted(glob.glob(os.path.join(metrics, "actor-*.jsonl"))) if os.path.exists(path)]
    time_axis(streams, verdicts)
    return verdicts


def pct(v):
    return "" if v is None else f"{v:.1f}"


def spd(v):
    return "" if v is None else f"{v:.3f}"


def window_rows(summary):
    return [[str(w["minute"]), str(w["n"]), pct(w["correct_pct"]), pct(w["fast1_pct"]), spd(w["mean_speedup"]),
             spd(w["median_speedup"]), spd(w["best_speedup"]), spd(w.get("within_task")), "*" if w["few"] else ""]
            for w in summary["windows"]]


WINDOW_HEADERS = ["minute", "verified", "correct %", "fast_1 %", "mean", "median", "best", "within task", ""]
LEVEL_HEADERS = ["level", "tasks", "verified", "correct %", "fast_1 %", "mean", "median", "best"]


def level_rows(summary):
    return [["?" if lv["level"] is None else str(lv["level"]), str(lv["tasks"]), str(lv["n"]),
             pct(lv["correct_pct"]), pct(lv["fast1_pct"]), spd(lv["mean_speedup"]), spd(lv["median_speedup"]),
             spd(lv["best_speedup"])]
            for lv in summary["levels"]]


def first_final_text(summary):
    ff = summary["first_final"]
    if ff is None:
        return (f"first window vs final window: n/a (needs two windows with at least {summary['min_window']} "
                "verified and one ok)")
    return (f"first window vs final window: mean speedup {ff['first_mean']:.3f}x (minute {ff['first_minute']}) -> "
            f"{ff['final_mean']:.3f}x (minute {ff['final_minute']}), ratio {ff['ratio']:.3f}")


def text_table(headers, rows):
    """Plain columns, right-aligned, for pasting into docs."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)).rstrip() for row in [headers] + rows]
    return "\n".join(lines)


def print_verdict_tables(summary):
    print(f"Verified candidates per 1-minute window (metrics/verdicts-*.jsonl, {summary['verified']} in all; "
          "speedups are of the ok results):")
    print(text_table(WINDOW_HEADERS, window_rows(summary)))
    if any(w["few"] for w in summary["windows"]):
        print(f"* fewer than {summary['min_window']} verified: not used for the first/final ratio")
    print(first_final_text(summary))
    print(within_text(summary))
    if "within_task_pooled" in summary:
        print(pooled_text(summary["within_task_pooled"], summary["pooled_runs"]))
    print()
    print("Per level, whole run:")
    print(text_table(LEVEL_HEADERS, level_rows(summary)))
    print()
    if summary["versions"]:
        print("Per policy version that sampled the candidates:")
        print(text_table(VERSION_HEADERS, version_rows(summary)))
        print()
    print("Per task, first visit vs last visit (visits = groups with at least one ok result):")
    if summary["task_trend"]:
        print(text_table(TREND_HEADERS, trend_rows(summary)))
    print(trend_text(summary))
    print(f"rejected as cheats: {summary['cheats_total']} (reasons in index.html and windows.json)")
    print()
    if summary["compile_errors"]:
        print(compile_title(summary))
        print(text_table(COMPILE_HEADERS, compile_rows(summary)))
        print()
    if summary.get("prompts"):
        print(PROMPT_TITLE)
        print(text_table(PROMPT_HEADERS, prompt_rows(summary)))
        print()
    if summary.get("turns"):
        print(TURN_TITLE)
        print(text_table(TURN_HEADERS, turn_rows(summary)))
        if summary["turns"]["pairs"]:
            print(PAIR_TITLE)
            print(text_table(PAIR_HEADERS, pair_rows(summary)))
        for note in turn_notes(summary):
            print(note)
        print()
    if summary["time_split"]:
        print("Verification time by verdict (evaluator process seconds; shares of verify s):")
        print(text_table(TIME_HEADERS, time_rows(summary)))
        print()


def write_windows_json(out, summary):
    path = os.path.join(out, "windows.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    return path


# --- plots --------------------------------------------------------------------------

def time_axis(streams, verdicts=None):
    """Converts each record's unix 'time' (a verdict line's 't') into minutes since the
    earliest record of any stream, verdict lines included (the launcher's elapsed_s would
    not cover the learner's or actors' lines)."""
    stamped = [(r, "time") for recs in streams for r in (recs or [])] + [(r, "t") for r in verdicts or []]
    times = [num(r, key) for r, key in stamped if num(r, key) is not None]
    t0 = min(times) if times else 0.0
    for r, key in stamped:
        t = num(r, key)
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


def plot_learner(plt, learner, run, out):
    """The learner's per-step health on the learner-step axis: the numbers veRL and OpenRLHF
    users read first (reward, KL, clipping, entropy, gradient norm, learning rate, lengths)."""
    fig, axes = plt.subplots(4, 2, figsize=(12, 14))
    (a, b), (c, d), (e, f), (g, h) = axes
    rm = series(learner, "step", "reward_mean")
    if not rm[0]:  # learners that do not log it: the evaluated candidates' mean by step
        rm = series(run, "step", "mean_reward")
    plot_lines(a, [("reward mean", *rm), ("reward std", *series(learner, "step", "reward_std"))],
               "learner step", "reward", "reward by step")
    a.set_title("Reward")
    plot_lines(b, [("KL to the reference (k3)", *series(learner, "step", "kl")),
                   ("KL to the behaviour policy", *series(learner, "step", "kl_behaviour"))],
               "learner step", "KL", "KL (metrics/learner.jsonl)")
    b.set_title("KL")
    plot_lines(c, [("clip fraction", *series(learner, "step", "clip_fraction"))],
               "learner step", "fraction of completion tokens", "clip_fraction (metrics/learner.jsonl)")
    c.set_title("Clipped tokens")
    plot_lines(d, [("entropy (estimate)", *series(learner, "step", "entropy"))],
               "learner step", "nats / token", "entropy (metrics/learner.jsonl)")
    d.set_title("Entropy")
    plot_lines(e, [("gradient norm (before clipping)", *series(learner, "step", "grad_norm"))],
               "learner step", "norm", "grad_norm (metrics/learner.jsonl)")
    e.set_title("Gradient norm")
    plot_lines(f, [("learning rate", *series(learner, "step", "lr"))],
               "learner step", "lr", "lr (metrics/learner.jsonl)")
    f.set_title("Learning rate")
    plot_lines(g, [("mean", *series(learner, "step", "response_length_mean")),
                   ("max", *series(learner, "step", "response_length_max"))],
               "learner step", "completion tokens", "response lengths (metrics/learner.jsonl)")
    g.set_title("Response length")
    plot_lines(h, [("truncated (no end-of-sequence token)", *series(learner, "step", "truncated_fraction"))],
               "learner step", "fraction of completions", "truncated_fraction (metrics/learner.jsonl)")
    h.set_title("Truncation")
    fig.tight_layout()
    return save(fig, out, "learner.png")


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


def plot_windows(plt, summary, out):
    from matplotlib.ticker import MaxNLocator
    fig, (a, b) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    # Windows with fewer than --min-window verified (a run's start or drain tail) are
    # drawn hollow and unjoined: one candidate's figure is not a point of the trend.
    ws = [w for w in summary["windows"] if not w.get("few")]
    few = [w for w in summary["windows"] if w.get("few")]

    def series(ax, key, label, color):  # True when it drew anything
        pts = [(w["minute"], w[key]) for w in ws if w[key] is not None]
        tail = [(w["minute"], w[key]) for w in few if w[key] is not None]
        if pts:
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=label, color=color)
        if tail:
            ax.plot([x for x, _ in tail], [y for _, y in tail], marker="o", linestyle="none",
                    markerfacecolor="none", color=color, label=None if pts else label)
        return bool(pts or tail)

    drawn = False
    for key, label, color in [("mean_speedup", "mean", "tab:blue"), ("median_speedup", "median", "tab:orange"),
                              ("within_task", "within task (over the task's run geomean)", "tab:green")]:
        drawn = series(a, key, label, color) or drawn
    if drawn:
        a.axhline(1.0, color="gray", linestyle=":", linewidth=1)
        a.legend(fontsize="small")
    else:
        no_data(a, "ok results in the verdict logs")
    a.set_ylabel("speedup of ok results (x)")
    a.set_title("Verified results per 1-minute window")
    a.grid(True, alpha=0.3)
    series(b, "correct_pct", "correct %", "tab:green")
    series(b, "fast1_pct", "fast_1 % (correct and faster)", "tab:blue")
    if few:
        b.plot([], [], marker="o", linestyle="none", markerfacecolor="none", color="gray",
               label=f"hollow: fewer than {summary['min_window']} verified")
    b.set_ylim(0, 100)
    b.xaxis.set_major_locator(MaxNLocator(integer=True))  # windows are whole minutes
    b.set_xlabel("window (minutes since start)")
    b.set_ylabel("% of verified")
    b.legend(fontsize="small")
    b.grid(True, alpha=0.3)
    return save(fig, out, "windows.png")


def skipped_share(rec):
    """Share of the trained-on groups a learner line skipped for equal rewards (probe groups
    are not trained on and do not count), or None."""
    taken, skipped, probes = num(rec, "groups_in"), num(rec, "skipped_equal"), num(rec, "probe_groups") or 0.0
    if taken is None or skipped is None or taken - probes <= 0:
        return None
    return skipped / (taken - probes)


def probe_points(probes):
    """Probe lines (metrics/probe.jsonl) by policy version, oldest first; a version probed
    twice (actor 0 restarted) keeps its last line."""
    by_version = {}
    for r in probes or []:
        v = num(r, "policy_version")
        if v is None:
            v = num(r, "step")
        if v is not None and num(r, "reward_mean") is not None:
            by_version[int(v)] = r
    return [by_version[v] for v in sorted(by_version)]


def learner_at(learner, version):
    """The last learner line that trained at a step <= version (the step that made the policy
    version `version` is step `version`), or None."""
    best = None
    for r in learner or []:
        s = num(r, "step")
        if s is not None and s <= version and num(r, "updated") != 0.0 and num(r, "loss") is not None:
            if best is None or s >= num(best, "step"):
                best = r
    return best


LEARNING_HEADERS = ["policy version", "samples", "scored", "mean reward", "pass %", "lost groups",
                    "kl_start", "entropy", "clip fraction", "completion tokens", "skipped equal %"]


def learning_rows(probes, learner):
    rows = []
    for p in probe_points(probes):
        v = int(num(p, "policy_version") if num(p, "policy_version") is not None else num(p, "step"))
        at = learner_at(learner, v) or {}
        share = skipped_share(at) if at else None
        pass_rate = num(p, "pass_rate")
        rows.append([str(v), fmt(num(p, "samples")), fmt(num(p, "scored")), f"{num(p, 'reward_mean'):.3f}",
                     "–" if pass_rate is None else f"{100 * pass_rate:.1f}", fmt(num(p, "lost_groups")),
                     fmt(num(at, "kl_start")), fmt(num(at, "entropy")), fmt(num(at, "clip_fraction")),
                     fmt(num(at, "response_length_mean")), "–" if share is None else f"{100 * share:.1f}"])
    return rows


LEARNING_TITLE = ("Learning curve (metrics/probe.jsonl): actor 0's probe, the same fixed prompts and seeds at each "
                  "probed policy version, never trained on; mean reward and pass % over its scored samples. The "
                  "learner columns are those of the last step that trained at or before that version "
                  "(metrics/learner.jsonl; skipped equal % = groups skipped for equal rewards / groups trained "
                  "on or skipped).")


def print_learning_table(probes, learner):
    rows = learning_rows(probes, learner)
    if not rows:
        return
    print(LEARNING_TITLE)
    print(text_table(LEARNING_HEADERS, rows))
    print()


def plot_learning(plt, probes, learner, out):
    """The learning curve: the probe's reward and pass rate by policy version, next to what
    the learner saw on the same axis (learner step = the policy version it produced)."""
    fig, axes = plt.subplots(4, 2, figsize=(12, 14))
    (a, b), (c, d), (e, f), (g, h) = axes
    points = probe_points(probes)
    versions = [int(num(p, "policy_version") if num(p, "policy_version") is not None else num(p, "step"))
                for p in points]
    curves = [("mean, all probe tasks", versions, [num(p, "reward_mean") for p in points])]
    tasks = sorted({t for p in points for t in (p.get("tasks") or {}) if isinstance(p.get("tasks"), dict)})
    for t in tasks:
        xs, ys = [], []
        for v, p in zip(versions, points):
            rec = (p.get("tasks") or {}).get(t)
            if isinstance(rec, dict) and num(rec, "reward_mean") is not None and (num(rec, "scored") or 0) > 0:
                xs.append(v)
                ys.append(num(rec, "reward_mean"))
        curves.append((t, xs, ys))
    plot_lines(a, curves, "policy version", "mean reward", "probe (metrics/probe.jsonl)")
    a.set_title("Probe: mean reward on fixed prompts")
    plot_lines(b, [("pass rate (ok / scored)", versions, [num(p, "pass_rate") for p in points])],
               "policy version", "fraction", "probe (metrics/probe.jsonl)")
    b.set_title("Probe: pass rate")
    plot_lines(c, [("KL to the start policy (k3)", *series(learner, "step", "kl_start"))],
               "learner step", "KL", "kl_start (metrics/learner.jsonl)")
    c.set_title("KL to the start policy")
    plot_lines(d, [("entropy", *series(learner, "step", "entropy"))],
               "learner step", "nats / token", "entropy (metrics/learner.jsonl)")
    d.set_title("Entropy")
    plot_lines(e, [("clip fraction", *series(learner, "step", "clip_fraction"))],
               "learner step", "fraction of completion tokens", "clip_fraction (metrics/learner.jsonl)")
    e.set_title("Clipped tokens")
    plot_lines(f, [("mean", *series(learner, "step", "response_length_mean")),
                   ("max", *series(learner, "step", "response_length_max"))],
               "learner step", "completion tokens", "response lengths (metrics/learner.jsonl)")
    f.set_title("Completion length")
    xs, ys = [], []
    for r in learner or []:
        s, share = num(r, "step"), skipped_share(r)
        if s is not None and share is not None:
            xs.append(s)
            ys.append(share)
    plot_lines(g, [("skipped for equal rewards", xs, ys)], "learner step", "share of the groups",
               "groups_in / skipped_equal (metrics/learner.jsonl)")
    g.set_title("Groups without signal")
    plot_lines(h, [("scored", versions, [num(p, "scored") for p in points]),
                   ("samples", versions, [num(p, "samples") for p in points])],
               "policy version", "probe samples", "probe (metrics/probe.jsonl)")
    h.set_title("Probe samples")
    fig.tight_layout()
    return save(fig, out, "learning.png")


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


def html_table(headers, rows):
    e = html.escape
    return ("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in headers) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows) + "</table>")


def verdict_html(summary, windows_png):
    e = html.escape
    parts = ["<h2>Verified results per 1-minute window</h2>",
             f"<p>From metrics/verdicts-*.jsonl: {summary['verified']} verified candidates; speedups are of the "
             "ok results; fast_1 = correct and faster than the reference, as a share of all verified.</p>",
             html_table(WINDOW_HEADERS, window_rows(summary))]
    if any(w["few"] for w in summary["windows"]):
        parts.append(f"<p>* fewer than {summary['min_window']} verified: not used for the first/final ratio.</p>")
    parts.append(f"<p>{e(first_final_text(summary))}</p>")
    parts.append(f"<p>{e(within_text(summary))}. The within-task column takes the task mix out of a window: "
                 "each ok speedup is divided by its task's geometric mean over the run.</p>")
    name = os.path.basename(windows_png)
    parts.append(f"<img src=\"{e(name)}\" alt=\"speedup and correct % per window\">")
    parts.append("<h2>Per level, whole run</h2>")
    parts.append(html_table(LEVEL_HEADERS, level_rows(summary)))
    parts.append("<h2>Per task, first visit vs last visit</h2>")
    parts.append("<p>A visit is one group of candidates of the task; only visits with an ok result count. "
                 "The minute windows mix tasks; this compares each task with itself.</p>")
    if summary["task_trend"]:
        parts.append(html_table(TREND_HEADERS, trend_rows(summary)))
    parts.append(f"<p>{e(trend_text(summary))}</p>")
    if summary["compile_errors"]:
        parts.append("<h2>Compile errors</h2>")
        parts.append(f"<p>{e(compile_title(summary))}</p>")
        parts.append(html_table(COMPILE_HEADERS, compile_rows(summary)))
    if summary.get("prompts"):
        parts.append("<h2>By prompt</h2>")
        parts.append(f"<p>{e(PROMPT_TITLE)}</p>")
        parts.append(html_table(PROMPT_HEADERS, prompt_rows(summary)))
    if summary.get("turns"):
        parts.append("<h2>Per turn</h2>")
        parts.append(f"<p>{e(TURN_TITLE)}</p>")
        parts.append(html_table(TURN_HEADERS, turn_rows(summary)))
        if summary["turns"]["pairs"]:
            parts.append(f"<p>{e(PAIR_TITLE)}</p>")
            parts.append(html_table(PAIR_HEADERS, pair_rows(summary)))
        for note in turn_notes(summary):
            parts.append(f"<p>{e(note)}</p>")
    parts.append("<h2>Rejected as cheats</h2>")
    cheats = summary["cheats"]
    if not cheats:
        parts.append("<p>No candidate was rejected as a cheat.</p>")
    else:
        shown = (f"The last {len(cheats)} of {summary['cheats_total']}" if summary["cheats_total"] > len(cheats)
                 else f"All {len(cheats)}")
        parts.append(f"<p>{shown}, most recent last.</p>")
        parts.append(html_table(["minute", "task", "candidate", "reason"],
                                [[f"{c['minute']:.2f}", c["task"],
                                  "" if c["candidate"] is None else str(c["candidate"]), c["reason"]]
                                 for c in cheats]))
    return parts


def write_html(out, run_dir, pngs, run, learner, kernels, sources, verdicts=None, probes=None):
    """verdicts: (summary, windows.png path) from the verdict logs, or None when there are none;
    probes: the lines of metrics/probe.jsonl."""
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
        if name == "learning.png":
            rows = learning_rows(probes, learner)
            if rows:
                parts.append(f"<p>{e(LEARNING_TITLE)}</p>")
                parts.append(html_table(LEARNING_HEADERS, rows))
            else:
                parts.append("<p>No learning-curve probe in this run (metrics/probe.jsonl; actors.probe.every).</p>")
    if verdicts is not None:
        parts += verdict_html(*verdicts)
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
    ap.add_argument("--version", action="version",
                    version="KernelForge " + open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "VERSION")).read().strip())
    ap.add_argument("run_dir", metavar="RUN_DIR")
    ap.add_argument("--out", metavar="DIR", help="output folder (default RUN_DIR/report)")
    ap.add_argument("--min-window", metavar="N", type=int, default=5,
                    help="windows with fewer verified candidates are marked and left out of the "
                         "first/final ratio (default 5)")
    ap.add_argument("--pool", metavar="RUN_DIR2", action="append", default=[],
                    help="another run folder whose within-task trend is pooled with RUN_DIR's (repeatable)")
    args = ap.parse_args(argv)
    if args.min_window < 1:
        die(2, f"--min-window: expected a positive count, got {args.min_window}")
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
    probe_path = os.path.join(metrics, "probe.jsonl")
    probes = read_jsonl(probe_path) if os.path.exists(probe_path) else None  # runs without the probe: none
    if probes is not None:
        sources.append(os.path.relpath(probe_path, run_dir))
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
    verdict_paths = sorted(glob.glob(os.path.join(metrics, "verdicts-*.jsonl")))
    verdicts, used = read_verdicts(verdict_paths)
    sources += [os.path.relpath(path, run_dir) for path in used]
    if learner is None and run is None and not actors and not verdicts:
        die(2, f"{run_dir}: no metrics at all (expected metrics/learner.jsonl, metrics/run.jsonl, "
               "metrics/actor-*.jsonl or metrics/verdicts-*.jsonl with at least one JSON line)")
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
    time_axis([learner, run] + [recs for _, recs in actors], verdicts)
    summary = summarize_verdicts(verdicts, args.min_window) if verdicts else None
    group_lines = []
    for path in sorted(glob.glob(os.path.join(metrics, "groups-*.jsonl"))):
        recs = read_jsonl(path, is_group_line, "JSON objects with group, task and completions")
        if recs:
            group_lines += recs
            sources.append(os.path.relpath(path, run_dir))
    if summary is not None and group_lines:
        summary["prompts"] = prompt_split(group_lines, verdicts)
    if summary is not None:
        turns = turn_split(group_lines, verdicts)
        if turns is not None:
            summary["turns"] = turns
    if args.pool:
        if summary is None:
            die(2, f"--pool: {run_dir} has no usable verdict records in {os.path.join(metrics, 'verdicts-*.jsonl')} to pool")
        pool = [verdicts]
        for other in args.pool:
            if not os.path.isdir(other):
                die(2, f"--pool {other}: not a directory (give a run folder, e.g. runs/<name>)")
            recs = run_verdicts(other)
            if not recs:
                die(2, f"--pool {other}: no usable verdict records in {os.path.join(other, 'metrics', 'verdicts-*.jsonl')}")
            pool.append(recs)
        summary["within_task_pooled"] = pooled_within_task(pool)
        summary["pooled_runs"] = [run_dir] + args.pool
    print_learning_table(probes, learner)
    if summary is not None:
        print_verdict_tables(summary)
    elif verdict_paths:
        print(f"no usable verdict records in {os.path.join(metrics, 'verdicts-*.jsonl')}: "
              "no per-minute windows, level table or cheat list")
    else:
        # Runs from before the evaluators wrote verdict logs.
        print(f"no verdict logs ({os.path.join(metrics, 'verdicts-*.jsonl')}): "
              "no per-minute windows, level table or cheat list")
    try:
        pngs = [("Reward and loss", plot_reward(plt, learner, run, out)),
                ("Learner health", plot_learner(plt, learner, run, out)),
                ("Learning curve", plot_learning(plt, probes, learner, out)),
                ("Speedup", plot_speedup(plt, run, out)),
                ("Verdict mix", plot_verdicts(plt, run, out)),
                ("Throughput, queues and lag", plot_throughput(plt, run, actors, learner, out))]
        extra = []
        if summary is not None:
            extra = [plot_windows(plt, summary, out), write_windows_json(out, summary)]
        page = write_html(out, run_dir, pngs, run, learner, kernels, sources,
                          (summary, extra[0]) if summary is not None else None, probes)
    except OSError as ex:
        die(1, f"{ex.filename or out}: cannot write ({ex.strerror})")
    for path in [path for _, path in pngs] + extra:
        print(path)
    print(page)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

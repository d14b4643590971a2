#!/usr/bin/env python3
"""dev/learning_stats.py: the pre-registered test of a learning experiment.

  dev/learning_stats.py --reward-config FILE START_SCORES RL_SCORES PLACEBO_SCORES [--out FILE.md]

Each *_SCORES is a tools/score-policy output folder (tasks/<task>/report.json per task). Every
sample gets the reward the run trained on, from its verdict and speedup (the evaluator.reward
keys of --reward-config, kind `speedup` or `log_speedup`; a completion without an extractable
kernel counts as a compile error). Tasks are strata.

Primary metric: mean reward per sample. Test, one-sided, alpha 0.05, for RL > start and for
RL > placebo (both must hold: an intersection-union test, no correction needed): a stratified
permutation test (labels permuted within each task, 20,000 draws, fixed seed), statistic = the
mean over tasks of the per-task difference of means. 95 % intervals: stratified bootstrap
(10,000 draws) of the same statistic, and per task. Secondary: pass rate (ok share), one-sided
Cochran-Mantel-Haenszel test over the task strata. Power: the smallest difference of the
primary statistic the design detects with 80 % power at one-sided alpha 0.05, from the pooled
within-task standard deviation.
"""
import argparse
import json
import math
import os
import random
import sys

PROG = "dev/learning_stats.py"


def die(msg):
    print(f"{PROG}: {msg}", file=sys.stderr)
    sys.exit(2)


def reward_rule(path):
    """The evaluator.reward section of a run config (flat YAML read without a YAML library)."""
    rule = {"kind": "speedup", "clip": 2.0, "compile_error": -1.0, "runtime_error": -1.0, "timeout": -1.0,
            "incorrect": -1.0, "rejected_cheat": -2.0, "ok_bonus": 0.0}
    try:
        import yaml  # the venv has PyYAML through torch's requirements; fall back below if not
        with open(path) as f:
            cfg = yaml.safe_load(f)
        sec = ((cfg or {}).get("evaluator") or {}).get("reward") or {}
    except ImportError:
        die("PyYAML is needed to read --reward-config")
    except OSError as e:
        die(f"{path}: {e.strerror}")
    for k, v in sec.items():
        if k not in rule:
            die(f"{path}: evaluator.reward.{k}: not a key this script knows")
        rule[k] = v
    if rule["kind"] not in ("speedup", "log_speedup"):
        die(f"{path}: evaluator.reward.kind: {rule['kind']} (this test needs a per-sample rule: speedup or log_speedup)")
    return rule


def sample_reward(c, rule):
    if not c.get("extracted", False):
        return rule["compile_error"], False
    v = c.get("verdict", "")
    if v != "ok":
        if v not in rule:
            die(f"verdict {v!r} has no reward in the rule")
        return float(rule[v]), False
    s = float(c.get("speedup", 0) or 0)
    if not s > 0:
        return float(rule["runtime_error"]), False
    raw = s - 1.0 if rule["kind"] == "speedup" else math.log(s)
    clip = float(rule["clip"])
    return float(rule["ok_bonus"]) + max(-clip, min(clip, raw)), True


def load_arm(folder, rule):
    """{task: [(reward, ok), ...]} from tools/score-policy's per-task report.json files."""
    tasks_dir = os.path.join(folder, "tasks")
    if not os.path.isdir(tasks_dir):
        die(f"{folder}: no tasks/ folder (a tools/score-policy output?)")
    out = {}
    for name in sorted(os.listdir(tasks_dir)):
        rep = os.path.join(tasks_dir, name, "report.json")
        if not os.path.isfile(rep):
            continue
        try:
            with open(rep) as f:
                j = json.load(f)
        except (OSError, ValueError) as e:
            die(f"{rep}: {e}")
        cands = j.get("candidates")
        if not isinstance(cands, list):
            die(f"{rep}: field 'candidates' missing or not a list")
        out[name] = [sample_reward(c, rule) for c in cands]
    if not out:
        die(f"{folder}: no task reports")
    return out


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def stat(a, b, tasks):
    return mean([mean(a[t]) - mean(b[t]) for t in tasks])


def perm_test(a, b, tasks, draws, rng):
    """One-sided p of stat(a, b) >= observed, labels permuted within each task."""
    obs = stat(a, b, tasks)
    hits = 0
    for _ in range(draws):
        pa, pb = {}, {}
        for t in tasks:
            pool = a[t] + b[t]
            rng.shuffle(pool)
            pa[t], pb[t] = pool[:len(a[t])], pool[len(a[t]):]
        hits += stat(pa, pb, tasks) >= obs - 1e-12
    return obs, (hits + 1) / (draws + 1)


def bootstrap(a, b, tasks, draws, rng):
    vals = []
    for _ in range(draws):
        ra = {t: [rng.choice(a[t]) for _ in a[t]] for t in tasks}
        rb = {t: [rng.choice(b[t]) for _ in b[t]] for t in tasks}
        vals.append(stat(ra, rb, tasks))
    vals.sort()
    return vals[int(0.025 * draws)], vals[int(0.975 * draws) - 1]


def cmh_one_sided(a_ok, b_ok, tasks):
    """Cochran-Mantel-Haenszel, one-sided (a's pass rate above b's); a_ok/b_ok: {task: [bool]}."""
    num, var = 0.0, 0.0
    for t in tasks:
        x1, n1 = sum(a_ok[t]), len(a_ok[t])
        x2, n2 = sum(b_ok[t]), len(b_ok[t])
        n, m1 = n1 + n2, x1 + x2
        if n < 2 or m1 in (0, n):
            continue
        num += x1 - n1 * m1 / n
        var += n1 * n2 * m1 * (n - m1) / (n * n * (n - 1))
    if var == 0:
        return float("nan"), 1.0
    z = num / math.sqrt(var)
    return z, 0.5 * math.erfc(z / math.sqrt(2))


def main(argv):
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    ap.add_argument("start")
    ap.add_argument("rl")
    ap.add_argument("placebo")
    ap.add_argument("--reward-config", required=True)
    ap.add_argument("--out")
    ap.add_argument("--seed", type=int, default=20261207)
    args = ap.parse_args(argv)
    rule = reward_rule(args.reward_config)
    arms = {k: load_arm(p, rule) for k, p in (("start", args.start), ("rl", args.rl), ("placebo", args.placebo))}
    tasks = sorted(set.intersection(*(set(v) for v in arms.values())))
    if not tasks:
        die("no task was scored for all three policies")
    r = {k: {t: [x[0] for x in v[t]] for t in tasks} for k, v in arms.items()}
    ok = {k: {t: [x[1] for x in v[t]] for t in tasks} for k, v in arms.items()}
    rng = random.Random(args.seed)
    lines = [f"Tasks (strata): {', '.join(tasks)}",
             "Samples per policy: " + ", ".join(f"{k} {sum(len(r[k][t]) for t in tasks)}" for k in r), ""]
    lines.append("| task | n | start reward | RL reward | placebo reward | start ok % | RL ok % | placebo ok % |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for t in tasks:
        lines.append(f"| {t} | {len(r['rl'][t])} | {mean(r['start'][t]):.3f} | {mean(r['rl'][t]):.3f} | "
                     f"{mean(r['placebo'][t]):.3f} | {100 * mean(ok['start'][t]):.1f} | {100 * mean(ok['rl'][t]):.1f} | "
                     f"{100 * mean(ok['placebo'][t]):.1f} |")
    lines.append(f"| all (mean over tasks) | | {mean([mean(r['start'][t]) for t in tasks]):.3f} | "
                 f"{mean([mean(r['rl'][t]) for t in tasks]):.3f} | {mean([mean(r['placebo'][t]) for t in tasks]):.3f} | "
                 f"{100 * mean([mean(ok['start'][t]) for t in tasks]):.1f} | {100 * mean([mean(ok['rl'][t]) for t in tasks]):.1f} | "
                 f"{100 * mean([mean(ok['placebo'][t]) for t in tasks]):.1f} |")
    lines.append("")
    verdict = True
    for other in ("start", "placebo"):
        obs, p = perm_test(r["rl"], r[other], tasks, 20000, rng)
        lo, hi = bootstrap(r["rl"], r[other], tasks, 10000, rng)
        z, pc = cmh_one_sided(ok["rl"], ok[other], tasks)
        verdict = verdict and p < 0.05
        lines.append(f"RL - {other}: mean reward difference {obs:+.3f} (95 % interval {lo:+.3f} to {hi:+.3f}), "
                     f"stratified permutation p = {p:.4f} (one-sided) -> {'PASS' if p < 0.05 else 'FAIL'} at 0.05; "
                     f"pass rate CMH z = {z:.2f}, p = {pc:.4f}")
        for t in tasks:
            d = mean(r["rl"][t]) - mean(r[other][t])
            tl, th = bootstrap({t: r["rl"][t]}, {t: r[other][t]}, [t], 2000, rng)
            lines.append(f"  {t}: {d:+.3f} ({tl:+.3f} to {th:+.3f})")
    # Power: pooled within-task SD of the reward, n per task per policy.
    resid = [x - mean(r[k][t]) for k in r for t in tasks for x in r[k][t]]
    sd = math.sqrt(sum(e * e for e in resid) / max(1, len(resid) - 3 * len(tasks)))
    n = mean([len(r["rl"][t]) for t in tasks])
    se = sd * math.sqrt(2 / n) / math.sqrt(len(tasks))
    lines.append("")
    lines.append(f"Power: within-task reward SD {sd:.3f}, {n:.0f} samples per task and policy, {len(tasks)} tasks: "
                 f"the design detects a difference of {2.486 * se:.3f} in mean reward with 80 % power "
                 f"(one-sided alpha 0.05; SE {se:.3f}).")
    lines.append(f"Primary result: {'RL above start AND above placebo at alpha 0.05' if verdict else 'NOT shown'}.")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

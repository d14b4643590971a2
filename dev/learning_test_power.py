#!/usr/bin/env python3
"""How often LaunchLearningTest's sampled-reward checks fail an RL run that learned.

The RL arm's verdicts are draws of two rewards: the correct kernel's (1 + clip(speedup - 1),
near 0 on a loaded machine) and the wrong one's (-1). Their share moves from the start
share toward the end share along a logistic path over the run's verdicts. For each setting
this simulates many runs and prints the share of runs in which each check fails:
  windows: last 24 - first 24 >= 0.30 and Welch t >= 2.33 (the check before 2026-12-07)
  trend:   one-sided t of the least-squares slope of reward on order >= 1.645 (the check now)
Usage: dev/learning_test_power.py [--runs N] [--seed S]
"""
import argparse
import math
import random
import statistics as st


def one_run(rng, n, p0, p1, gap, window):
    l0, l1 = math.log(p0 / (1 - p0)), math.log(p1 / (1 - p1))
    ys = []
    for i in range(n):
        p = 1 / (1 + math.exp(-(l0 + (l1 - l0) * i / (n - 1))))
        ys.append(-1 + gap if rng.random() < p else -1.0)
    early, late = ys[:window], ys[-window:]
    rise = st.mean(late) - st.mean(early)
    se = math.sqrt((st.variance(early) + st.variance(late)) / window)
    win_t = rise / se if se > 0 else (math.inf if rise > 0 else 0.0)
    mx, my = (n - 1) / 2, st.mean(ys)
    sxx = sum((i - mx) ** 2 for i in range(n))
    slope = sum((i - mx) * (y - my) for i, y in enumerate(ys)) / sxx
    sse = sum((y - my - slope * (i - mx)) ** 2 for i, y in enumerate(ys))
    se_slope = math.sqrt(sse / (n - 2) / sxx)
    trend_t = slope / se_slope if se_slope > 0 else (math.inf if slope > 0 else 0.0)
    return rise, win_t, trend_t


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    # (verdicts, share of the first verdicts, share of the last, reward gap)
    settings = [(96, 0.25, 0.92, 1.03), (117, 0.25, 0.92, 1.03), (160, 0.25, 0.92, 1.2), (96, 0.25, 0.85, 1.03),
                (117, 0.25, 0.85, 1.03), (96, 0.25, 0.80, 1.0)]
    print(f"{args.runs} simulated runs per row, seed {args.seed}")
    print("| verdicts | share first -> last | gap | windows check fails | trend check fails | trend t median |")
    print("|---|---|---|---|---|---|")
    for n, p0, p1, gap in settings:
        win_fail = trend_fail = 0
        trends = []
        for _ in range(args.runs):
            rise, win_t, trend_t = one_run(rng, n, p0, p1, gap, 24)
            win_fail += not (rise >= 0.30 and win_t >= 2.33)
            trend_fail += not (trend_t >= 1.645)
            trends.append(trend_t)
        print(f"| {n} | {p0:.2f} -> {p1:.2f} | {gap:.2f} | {100 * win_fail / args.runs:.2f} % | "
              f"{100 * trend_fail / args.runs:.2f} % | {st.median(trends):.1f} |")


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# The leads of the RL drop, tested on the closed loop (tests/launch/learning_test.cpp): each
# setting runs the RL arm and its placebo twin (same setting, rewards shuffled within groups)
# and prints one "[ learning ]" line per arm: the correct kernel's share before and after,
# the mean trained reward of the first and last 32 verdicts, and how many completions left
# both memorised kernels (the damage of the update noise, which the placebo shows alone).
#   dev/learning_causes.sh [SETTING ...]    a SETTING is "k=v,k=v" (--set overrides), default: the list below
# Results: docs/results/2026-12-07-learning-causes.md. Needs a built tree (learning_test).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${KF_BUILD_DIR:-build}/tests/launch/learning_test
[ -x "$BIN" ] || { echo "dev/learning_causes.sh: $BIN not built" >&2; exit 2; }
settings=("$@")
[ ${#settings[@]} -gt 0 ] || settings=(
  ""                                    # the test's own: lr 3e-3, no std normalisation
  "learner.optim.lr=3e-2"               # lead 1: a step ten times larger
  "learner.optim.lr=3e-4"               # and ten times smaller
  "learner.grpo.std_normalize=true"     # lead 2: unit-size advantages
)
for s in "${settings[@]}"; do
  echo "== setting: ${s:-(the test's own)}"
  for arm in Rl Shuffled; do
    KF_LEARNING_SET="${s//,/ }" "$BIN" --gtest_filter="LaunchLearningTest.${arm}*" 2>&1 | grep -E "^\[ learning \]|FAILED  \]|OK \]"
  done
done

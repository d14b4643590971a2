#!/usr/bin/env bash
# On the GPU machine: the pre-registered learning experiment
# (docs/results/2026-12-07-learning-experiment.md) as one pipeline that outlives a `device`
# call: `start` builds and detaches it (setsid), `wait` follows it in later calls. Issue
# `start` and its `wait` calls as one batch of tool calls (the machine goes back 30 s after a
# call ends). Every call copies what is packed so far into $OUT.
#   dev/learning_experiment.sh start [SECONDS]   configure + build, detach, follow
#   dev/learning_experiment.sh wait [SECONDS]    follow (default 570 s) until it ends
# Environment: KF_PYTHON (python with torch), KF_ARM_MINUTES (default 6), KF_SCORE_N
# (default 48 samples per task and policy), KF_SCORE_SEED (default 1), KF_SCORE_S (default 420:
# tools/score-policy --time-limit; a task not scored for all three policies is left out).
# Carry [".deps"] (TBB and seccomp.h for the GPU machine).
# The pipeline:
#  1. build (build-gpu/) while the suite is imported;
#  2. the two arms side by side from policies/default for KF_ARM_MINUTES: `rl`
#     (dev/learning/arm.yaml) and `placebo` (the same, learner.grpo.shuffle_rewards=true);
#  3. tools/export of each arm's final checkpoint;
#  4. tools/score-policy of the start, RL and placebo policies at once: the arm config's six
#     tasks, KF_SCORE_N samples each, the same seed and config for all three;
#  5. dev/learning_stats.py: the pre-registered test (stats.md);
#  6. packs results.tar.gz.part-* (both run folders without checkpoint weights, the score
#     folders, logs) and summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=/tmp/kf-learning        # survives between calls while the machine is held
PACK=$WORK/pack
PY=${KF_PYTHON:-$(command -v python3)}
ARM_CFG=dev/learning/arm.yaml
TASKS=001_relu,002_gelu,004_sigmoid,011_silu,014_sum_dim,021_softmax

copy_out() {
  [ -n "${OUT:-}" ] || return 0
  cp "$PACK"/* "$OUT"/ 2>/dev/null
  ls -la "$OUT"
}

follow() {
  local limit=$1 t0=$SECONDS
  while [ $((SECONDS - t0)) -lt "$limit" ]; do
    [ -f "$PACK/DONE" ] && break
    if ! pgrep -f "learning_experiment.sh pipeline" > /dev/null; then echo "pipeline process is gone"; break; fi
    sleep 10
  done
  echo "--- pipeline log (tail)"; tail -30 "$WORK/pipeline.log"
  for arm in rl placebo; do
    [ -f runs/learn-$arm/logs/launch-0.log ] && { echo "--- $arm"; grep -E "status:" runs/learn-$arm/logs/launch-0.log | tail -1; }
  done
  [ -f "$PACK/DONE" ] && echo "pipeline DONE"
  copy_out
}

pack() {  # $1: name of the archive
  . dev/gpu_session.sh
  local tmp=$WORK/results
  rm -rf "$tmp"; mkdir -p "$tmp"
  for arm in rl placebo; do [ -d runs/learn-$arm ] && gpu_pack_run runs/learn-$arm | tar -x -C "$tmp"; done
  for s in start rl placebo; do
    [ -d $WORK/scores-$s ] && (cd $WORK && tar -cf - --exclude='*.completion.txt' scores-$s) | tar -x -C "$tmp"
  done
  cp "$WORK/pipeline.log" "$tmp/" 2>/dev/null
  rm -f "$PACK/$1".tar.gz.part-*
  tar -C "$WORK" -czf - results logs 2>/dev/null | split -b 15M - "$PACK/$1.tar.gz.part-"
}

pipeline() {
  . dev/gpu_session.sh
  mkdir -p "$PACK"
  gpu_session_start "$WORK/logs"
  local minutes=${KF_ARM_MINUTES:-6} n=${KF_SCORE_N:-48} seed=${KF_SCORE_SEED:-1} score_s=${KF_SCORE_S:-420}
  export KF_BUILD_DIR=$ROOT/$BUILD KF_TASKS_DIR=$ROOT/$BUILD/tasks KF_PYTHON=$PY PYTHONUNBUFFERED=1
  gpu_build kf-launch kf-actor kf-learner kf-evaluator kf-sandbox-worker kf-export kf-optimize kf-eval
  gpu_import_wait
  stamp "built and imported after ${SECONDS} s; $GPU; $(nproc) cores"
  git log -1 --format='tree: %H %s' 2>/dev/null || true

  # 2. both arms at once: the same machine, load and minutes for each
  for arm in rl placebo; do
    local extra=()
    [ $arm = placebo ] && extra=(--set learner.grpo.shuffle_rewards=true)
    tools/launch $ARM_CFG --name learn-$arm --set tasks.dir=$BUILD/tasks --set launch.max_minutes="$minutes" \
      "${extra[@]}" > $WORK/logs/launch-$arm.txt 2>&1 &
  done
  wait
  stamp "arms ended after ${SECONDS} s"
  for arm in rl placebo; do
    grep -E "status:" runs/learn-$arm/logs/launch-0.log | tail -1
    tail -1 runs/learn-$arm/metrics/learner.jsonl 2>/dev/null | cut -c1-300
  done
  pack partial

  # 3. the final checkpoints as HF folders
  for arm in rl placebo; do
    tools/export runs/learn-$arm $WORK/policy-$arm > $WORK/logs/export-$arm.txt 2>&1 ||
      { stamp "export of $arm failed"; tail -5 $WORK/logs/export-$arm.txt; }
  done

  # 4. the three policies scored at once, same tasks, seed, samples and config
  local pids=()
  for s in start rl placebo; do
    local model=$WORK/policy-$s
    [ $s = start ] && model=policies/default
    tools/score-policy --model "$model" --out $WORK/scores-$s --include $TASKS -n "$n" --backend cpu \
      --config $ARM_CFG --set actors.device=cuda:0 --set evaluator.cpu_threads=2 --seed "$seed" --jobs 2 --time-limit "$score_s" \
      --label "$s" > $WORK/logs/score-$s.txt 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  stamp "scored after ${SECONDS} s"
  for s in start rl placebo; do tail -12 $WORK/logs/score-$s.txt; done

  # 5. the pre-registered test
  "$PY" dev/learning_stats.py --reward-config $ARM_CFG $WORK/scores-start $WORK/scores-rl $WORK/scores-placebo \
    --out $PACK/stats.md > $WORK/logs/stats.txt 2>&1
  echo "stats exit $?"
  cat $WORK/logs/stats.txt
  pack results
  rm -f "$PACK"/partial.tar.gz.part-*
  { cat $WORK/logs/gpu.txt; cat $PACK/stats.md 2>/dev/null; } > $PACK/summary.txt
  stamp "done after ${SECONDS} s"
  touch "$PACK/DONE"
}

case "${1:-}" in
  start)
    rm -rf "$WORK"; mkdir -p "$PACK"
    setsid bash "$0" pipeline > "$WORK/pipeline.log" 2>&1 < /dev/null &
    sleep 5
    follow "${2:-570}"
    ;;
  wait) follow "${2:-570}" ;;
  pipeline) pipeline ;;
  *) sed -n '2,22p' "$0"; exit 2 ;;
esac

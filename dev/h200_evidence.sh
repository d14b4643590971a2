#!/usr/bin/env bash
# On the GPU machine: issue 9's evidence (and issue 8's H200 run) as one pipeline that
# outlives a single `device` call (10 min each): `start` builds and detaches it (setsid),
# `wait` follows it in later calls. Every call copies what is packed so far into $OUT.
#   dev/h200_evidence.sh start [SECONDS]   configure + build, detach, follow
#   dev/h200_evidence.sh wait [SECONDS]    follow (default 570 s) until it ends
# The machine goes back 30 s after a call ends, and a session's next turn can take longer:
# issue `start` and its `wait` calls as one batch of tool calls, which run one after the
# other with no turn between (the only way a 10-minute run came back whole).
# Environment: KF_PYTHON (python with torch), KF_SFT_SECONDS (default 200),
# KF_RUN_MINUTES (default 10.5), KF_SCORE_N (default 8), KF_RL_SCORE_BY_S (default 1080:
# the RL policy is scored only if the runs end before this many seconds of pipeline time),
# KF_RL_SCORE_S (default 300: tools/score-policy --time-limit for each policy scored after
# the runs; four policies at once with 180 s left 3-6 of the 20 tasks unscored),
# KF_ALONE=1 (h200-contrast alone on the GPU, no ablation; then the starting policy and the
# RL policy scored one after the other, one task at a time, KF_RL_SCORE_S each).
# KF_SFT_SECONDS=0 skips stage 1 and the corpus verification: the runs start from
# policies/h200 (configs/h200.yaml's policy). With stage 1 (KF_FOCUS runs) that shipped
# policy is scored beside the new one, so that the choice of which to ship rests on one
# scoring round.
# KF_FOCUS=a,b,... (side by side only): both runs train on these tasks only (tasks.include),
# picked in passes over all of them (actors.schedule.policy=cycle, so the per-minute windows
# keep one task mix, which uniform picks do not), so each task is visited many times
# and tools/report's first-vs-last visit table has data;
# the starting policy is not scored during the runs but after them, at the same time as the
# RL policies of both runs (same load for all), on the focus tasks and the held-out split.
# KF_SELFSUP=1 (with KF_FOCUS): stage 2 on the GPU during the runs, one round on the focus
# tasks from the starting policy (tools/selfsup --include, 16 samples a task at temperature
# 1.2 so that it can find kernels the corpus does not have; --time-limit leaves it 150 s
# before the runs end to retrain), and its policy scored with the other two.
# KF_SELFSUP=first (with KF_FOCUS): CUDA-L1's order instead: the same stage-2 round alone on
# the GPU before the runs (KF_SELFSUP_S, default 240 s, retraining included), and both runs
# start from its policy (from the starting policy if it failed); then the starting,
# stage-2 and RL policies are scored together. On the H200, stage 2 beside the runs had
# not finished one task in 295 s (its verifications wait for GPU memory claims).
# KF_SCORE=0 (with KF_FOCUS): no policy scored after the runs (a short check of the runs).
# KF_CORPUS_RECHECK=1 (with KF_FOCUS): after the scoring, corpus/verify.py --not-ok re-runs
# the CUDA corpus kernels not recorded ok (at most KF_CORPUS_S, default 200 s; skipped after
# KF_CORPUS_BY_S, default 1400 s, of pipeline time); logs/verified_cuda.json comes back.
# KF_GPU_TESTS=0 skips the GPU tests run after the build (evaluator service, sampler).
# Two GPUs (nvidia-h200-x2): each run gets a GPU of its own (h200-contrast GPU 0, h200-noex
# GPU 1: configs/h200.yaml is a one-GPU config, and on one GPU the two runs shared the
# timing lock and the memory claims); the corpus verification runs on GPU 1 beside stage 1
# on GPU 0, and the scored policies are spread over both. On one GPU all of it shares GPU 0.
# The pipeline:
#  1. build (build-gpu/) while the suite is imported for cpu,cuda;
#  2. stage 1 on the GPU on the train split (tools/sft --heldout tasks/heldout.txt) for
#     KF_SFT_SECONDS, while corpus/verify.py --backend cuda measures the corpus kernels
#     still "compiled, not run" (2 at a time);
#  3. side by side on the one GPU, from that policy, for KF_RUN_MINUTES:
#       run h200-contrast: configs/h200.yaml (contrastive prompts, K = 2 exemplars);
#       run h200-noex:     the same with actors.prompt.mode=no_exemplars (the ablation);
#     and meanwhile tools/score-policy scores the SFT policy on every level-1/2 task
#     (train and held-out split) with KF_SCORE_N samples each;
#  4. the RL policy (h200-contrast's final checkpoint, tools/export) scored the same way,
#     if there is time;
#  5. packs: policy.tar.part-* (the SFT policy), policy-s2.tar.part-* (the stage-2 policy of
#     KF_SELFSUP=first, packed as soon as it exists), results.tar.gz.part-* (both run folders
#     without checkpoint weights, the score folders, logs, verified_cuda.json), summary.txt.
# Here: `cat results.tar.gz.part-* | tar -xz -C DIR`; `cat policy.tar.part-* | tar -x`.
# A call that ends before the pipeline does also brings partial.tar.gz.part-* (the run
# folders and logs so far), in case the machine is gone before the next call.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=/tmp/kf-evidence          # survives between calls while the machine is held
PACK=$WORK/pack
PY=${KF_PYTHON:-$(command -v python3)}
SHIPPED=policies/h200          # configs/h200.yaml's learner.policy

copy_out() {  # what is packed so far, into this call's $OUT
  [ -n "${OUT:-}" ] || return 0
  cp "$PACK"/* "$OUT"/ 2>/dev/null
  ls -la "$OUT"
}

follow() {  # prints progress until the pipeline ends or $1 seconds pass
  local limit=$1 t0=$SECONDS
  while [ $((SECONDS - t0)) -lt "$limit" ]; do
    [ -f "$PACK/DONE" ] && break
    # by name: setsid may fork, so $! need not be the pipeline's pid
    if ! pgrep -f "h200_evidence.sh pipeline" > /dev/null; then echo "pipeline process is gone"; break; fi
    sleep 15
  done
  echo "--- pipeline log (tail)"; tail -25 "$WORK/pipeline.log"
  for r in h200-contrast h200-noex; do
    [ -f runs/$r/logs/launch-0.log ] && { echo "--- $r"; grep -E "status:" runs/$r/logs/launch-0.log | tail -1; }
  done
  [ -f "$PACK/DONE" ] && echo "pipeline DONE"
  copy_out
  [ -f "$PACK/DONE" ] || pack_partial
}

pack_partial() {  # the run folders and logs as they are now, into this call's $OUT: the
  # machine goes back 30 s after a call ends, so a `wait` that comes late finds nothing
  [ -n "${OUT:-}" ] || return 0
  . dev/gpu_session.sh
  local tmp=$WORK/partial
  rm -rf "$tmp"; mkdir -p "$tmp"
  pack_runs "$tmp"
  cp "$WORK/pipeline.log" "$tmp/" 2>/dev/null
  tar -C "$WORK" -czf - partial logs 2>/dev/null | split -b 15M - "$OUT/partial.tar.gz.part-"
  ls -la "$OUT"
}

pipeline() {
  . dev/gpu_session.sh
  gpu_session_start "$WORK/logs"
  local sft_s=${KF_SFT_SECONDS:-200} minutes=${KF_RUN_MINUTES:-10.5} n=${KF_SCORE_N:-8} rl_by=${KF_RL_SCORE_BY_S:-1080}
  local rl_s=${KF_RL_SCORE_S:-300} run_s
  # Stage 2 alone before the runs (CUDA-L1's order) only exists for focus runs.
  local s2_first=0
  [ -n "${KF_FOCUS:-}" ] && [ "${KF_SELFSUP:-0}" = first ] && s2_first=1
  run_s=$(awk "BEGIN{print int($minutes*60)}")
  export KF_BUILD_DIR=$ROOT/$BUILD KF_TASKS_DIR=$ROOT/$BUILD/tasks KF_PYTHON=$PY PYTHONUNBUFFERED=1
  gpu_build kf-sft kf-eval kf-sandbox-worker kf-launch kf-actor kf-learner kf-evaluator kf-export kf-optimize kf-selfsup \
    evaluator_test policy_model_test
  gpu_import_wait
  stamp "built and imported after ${SECONDS} s"
  if [ "${KF_GPU_TESTS:-1}" = 1 ]; then
    # This change's GPU tests, before the GPU gets busy: the evaluator's cache limit and
    # OOM handling, the sampler (CUDA-graph decode included).
    # The evaluator binary directly (ctest's task fixture would re-import the tasks for cpu
    # only); the sampler through ctest, which makes its HF reference fixture.
    timeout 240 $BUILD/tests/evaluator/evaluator_test --gtest_filter='EvaluatorServiceTest.*' \
      > $WORK/logs/gpu_test_evaluator.txt 2>&1
    stamp "EvaluatorServiceTest exit $?: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' $WORK/logs/gpu_test_evaluator.txt | tr '\n' ' ')"
    timeout 240 ctest --test-dir $BUILD -R PolicySamplerTest -j 8 > $WORK/logs/gpu_test_sampler.txt 2>&1
    stamp "PolicySamplerTest exit $?: $(grep -E 'tests passed|Failed' $WORK/logs/gpu_test_sampler.txt | tr '\n' ' ')"
  fi

  # 2. stage 1 on the train split; the unmeasured CUDA corpus kernels measured alongside
  if [ "$sft_s" -le 0 ]; then
    cp -r $SHIPPED $WORK/policy
    stamp "no SFT (KF_SFT_SECONDS=0): the runs start from $SHIPPED"
  else
  local todo
  todo=$("$PY" - <<'EOF'
import json
v = json.load(open("corpus/verified_cuda.json"))
m = json.load(open("corpus/manifest.json"))
print(" ".join(sorted({e["task"] for e in m if e["backend"] == "cuda" and v.get(e["file"], {}).get("verdict") != "ok"})))
EOF
)
  stamp "tools/sft --heldout for $sft_s s; corpus/verify.py on: ${todo:-nothing (every CUDA kernel is ok)}"
  on_gpu 0 timeout $((sft_s + 90)) tools/sft --corpus corpus --tasks "$KF_TASKS_DIR" --out $WORK/policy --heldout tasks/heldout.txt \
    --shape small --vocab 4096 --steps 100000 --batch 8 --lr 1.5e-3 --warmup 30 --seed 0 --device cuda --threads 4 \
    --max-new-tokens 2048 --time-limit "$sft_s" > $WORK/logs/sft.txt 2>&1 &
  local sft=$!
  # On a second GPU the verification goes on through stage 2 too (the runs need that GPU).
  local ver_s=$sft_s
  [ "$GPU_COUNT" -gt 1 ] && [ $s2_first = 1 ] && ver_s=$((sft_s + ${KF_SELFSUP_S:-240}))
  if [ -n "$todo" ]; then  # an empty --tasks would mean every kernel of the corpus
    on_gpu 1 timeout "$ver_s" "$PY" corpus/verify.py --backend cuda --jobs 2 --tasks $todo \
      --note "tools/eval on $GPU, 2 at once, while tools/sft trained on $([ "$GPU_COUNT" -gt 1 ] && echo "the other" || echo "the same") GPU" > $WORK/logs/verify_cuda.txt 2>&1 &
    VERIFY_PID=$!
  fi
  wait $sft || { stamp "tools/sft failed"; tail -20 $WORK/logs/sft.txt; exit 1; }
  [ "$ver_s" = "$sft_s" ] && verify_wait
  grep -E "held-out|examples|wrote" $WORK/logs/sft.txt | tail -3
  tar -C $WORK -cf - policy | split -b 15M - "$PACK/policy.tar.part-"
  stamp "SFT policy packed after ${SECONDS} s"
  fi

  # GPU memory by process every 5 s (evaluators, their workers, actors, learners), to set
  # against the claims the evaluators make (gpu_claim_gb/gpu_peak_gb in the verdict logs)
  ( while :; do echo "# $(date +%s)"; nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader
      nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader; sleep 5; done ) \
    > $WORK/logs/gpu_mem.txt 2>&1 &
  GPU_MEM_PID=$!
  local focus=${KF_FOCUS:-} start_policy=$WORK/policy
  if [ $s2_first = 1 ]; then
    local s2_s=${KF_SELFSUP_S:-240}
    stamp "stage 2 alone on the GPU (at most $s2_s s) on $focus"
    on_gpu 0 timeout $((s2_s + 60)) tools/selfsup --model $WORK/policy --corpus corpus --out $WORK/policy-s2 --rounds 1 \
      --samples 16 --temperature 1.2 --max-new-tokens 2048 --exemplars 2 --steps 60 --batch 8 --backend cuda \
      --tasks "$KF_TASKS_DIR" --heldout tasks/heldout.txt --include "$focus" --device cuda --threads 4 \
      --time-limit $((s2_s - 30)) > $WORK/logs/selfsup.txt 2>&1
    local rc=$?
    cp $WORK/policy-s2/selfsup.jsonl $WORK/logs/ 2>/dev/null
    stamp "stage 2 exit $rc after ${SECONDS} s: $(s2_totals)"
    if [ $rc = 0 ] && [ -f $WORK/policy-s2/config.json ]; then
      start_policy=$WORK/policy-s2
      # Packed now: every later call brings it back, so a machine lost mid-run no longer
      # takes it along; scored in a later session if need be.
      tar -C $WORK -cf - policy-s2 | split -b 15M - "$PACK/policy-s2.tar.part-"
    else stamp "the runs start from the starting policy (stage 2 failed)"; fi
  fi
  verify_wait
  # 3. the run and its ablation side by side; the SFT policy scored meanwhile
  local common=(--set tasks.dir="$KF_TASKS_DIR" --set learner.policy=$start_policy --set launch.max_minutes="$minutes")
  rm -rf runs/h200-contrast runs/h200-noex
  if [ "${KF_ALONE:-0}" = 1 ]; then
    # One run alone on the GPU (its figures are its own), then both policies scored alone.
    tools/launch configs/h200.yaml --name h200-contrast "${common[@]}" > $WORK/logs/launch-contrast.txt 2>&1
    stamp "h200-contrast (alone) exit $?"
    grep -E "status:" runs/h200-contrast/logs/launch-0.log | tail -1
    tools/export runs/h200-contrast $WORK/policy-rl > $WORK/logs/export.txt 2>&1 || stamp "tools/export failed"
    local pol label
    for pol in policy policy-rl; do
      [ -f $WORK/$pol/config.json ] || continue
      label=$([ $pol = policy ] && echo "start (shipped / SFT)" || echo "RL (h200-contrast final checkpoint)")
      timeout $((rl_s + 120)) tools/score-policy --model $WORK/$pol --out $WORK/score-$pol --time-limit $rl_s \
        --config configs/h200.yaml --backend cuda --levels 1,2 -n $n --jobs 1 --label "$label" \
        > $WORK/logs/score-$pol.txt 2>&1
      stamp "scoring $pol ended (exit $?) after ${SECONDS} s"
    done
    pack_results
    return
  fi
  # Side by side, both evaluators would be pinned to the same cores.
  common+=(--set launch.cpu_affinity=false)
  # Passes over the tasks: the default (room) schedule moves picks to the slower tasks as
  # others improve, and uniform picks give a minute's 4-6 groups a random task mix.
  [ -n "$focus" ] && common+=(--set "tasks.include=[$focus]" --set actors.schedule.policy=cycle)
  on_gpu 0 tools/launch configs/h200.yaml --name h200-contrast "${common[@]}" > $WORK/logs/launch-contrast.txt 2>&1 &
  local a=$!
  on_gpu 1 tools/launch configs/h200.yaml --name h200-noex "${common[@]}" --set actors.prompt.mode=no_exemplars \
    > $WORK/logs/launch-noex.txt 2>&1 &
  local b=$!
  local s2=
  if [ -n "$focus" ] && [ "${KF_SELFSUP:-0}" = 1 ]; then
    timeout $((run_s + 60)) tools/selfsup --model $WORK/policy --corpus corpus --out $WORK/policy-s2 --rounds 1 \
      --samples 16 --temperature 1.2 --max-new-tokens 2048 --exemplars 2 --steps 60 --batch 8 --backend cuda \
      --tasks "$KF_TASKS_DIR" --heldout tasks/heldout.txt --include "$focus" --device cuda --threads 4 \
      --time-limit $((run_s - 150)) \
      > $WORK/logs/selfsup.txt 2>&1 &
    s2=$!
  fi
  if [ -z "$focus" ]; then
    stamp "runs started; scoring the SFT policy (n=$n)"
    # --time-limit: no task starts after it, and the table is still written (a kill would lose it)
    timeout $((run_s + 120)) tools/score-policy --model $WORK/policy --out $WORK/score-sft --time-limit $((run_s - 60)) \
      --config configs/h200.yaml --backend cuda --levels 1,2 -n $n --jobs 2 --label "SFT (stage 1, train split)" \
      > $WORK/logs/score-sft.txt 2>&1
    stamp "SFT scoring ended (exit $?) after ${SECONDS} s"
  else
    stamp "runs started on $focus"
  fi
  wait $a; stamp "h200-contrast exit $?"
  wait $b; stamp "h200-noex exit $?"
  for r in h200-contrast h200-noex; do grep -E "status:" runs/$r/logs/launch-0.log | tail -1; done
  if [ -n "$s2" ]; then
    wait $s2; stamp "stage 2 exit $?: $(s2_totals)"
    cp $WORK/policy-s2/selfsup.jsonl $WORK/logs/ 2>/dev/null
  fi
  if [ -n "$focus" ] && [ "${KF_SCORE:-1}" = 0 ]; then
    stamp "no scoring (KF_SCORE=0)"
    pack_results
    return
  fi
  if [ -n "$focus" ]; then
    # Both policies at once, one task at a time each: the same load for both.
    local scored=$focus,$(grep -v '^#' tasks/heldout.txt | grep . | paste -sd, -) pids=()
    tools/export runs/h200-contrast $WORK/policy-rl > $WORK/logs/export.txt 2>&1 || stamp "tools/export failed"
    # The ablation's policy too: scoring prompts carry no exemplars, which is how h200-noex
    # trained and not how h200-contrast did (the contrast policy once scored worse than
    # its start; this tells a shift of prompts from harm done by the updates).
    tools/export runs/h200-noex $WORK/policy-rl-noex >> $WORK/logs/export.txt 2>&1 || stamp "tools/export (noex) failed"
    local pol label g=0
    # A pipeline that trained stage 1 scores the shipped policy too: whether to ship the
    # new one is decided on one scoring round.
    [ "$sft_s" -gt 0 ] && cp -r $SHIPPED $WORK/policy-shipped
    for pol in policy policy-s2 policy-rl policy-rl-noex policy-shipped; do
      [ -f $WORK/$pol/config.json ] || continue
      g=$((g + 1))
      case $pol in
        policy) label="start ($([ "$sft_s" -gt 0 ] && echo "stage 1: tools/sft for $sft_s s in this pipeline" || echo "shipped policy"))" ;;
        policy-s2) label="stage 2 (one round on the focus tasks)" ;;
        policy-rl) label="RL (h200-contrast final checkpoint, from $(basename $start_policy))" ;;
        policy-shipped) label="shipped policy ($SHIPPED)" ;;
        *) label="RL without exemplars (h200-noex final checkpoint, from $(basename $start_policy))" ;;
      esac
      on_gpu $((g % 2)) timeout $((rl_s + 120)) tools/score-policy --model $WORK/$pol --out $WORK/score-$pol \
        --time-limit $rl_s --config configs/h200.yaml --backend cuda --include "$scored" -n $n --jobs 1 \
        --label "$label" > $WORK/logs/score-$pol.txt 2>&1 &
      pids+=($!)
    done
    wait "${pids[@]}"
    stamp "both policies scored after ${SECONDS} s"
    corpus_recheck
    pack_results
    return
  fi

  # 4. the RL policy, scored the same way if there is time
  if [ $SECONDS -lt "$rl_by" ] && tools/export runs/h200-contrast $WORK/policy-rl > $WORK/logs/export.txt 2>&1; then
    stamp "scoring the RL policy"
    timeout $((rl_s + 120)) tools/score-policy --model $WORK/policy-rl --out $WORK/score-rl --time-limit $rl_s \
      --config configs/h200.yaml --backend cuda --levels 1,2 -n $n --jobs 3 --label "RL (h200-contrast final checkpoint)" \
      > $WORK/logs/score-rl.txt 2>&1
    stamp "RL scoring ended (exit $?)"
  else
    stamp "RL policy not scored (after ${SECONDS} s, limit $rl_by s)"
  fi

  pack_results
}

corpus_recheck() {  # KF_CORPUS_RECHECK=1: the CUDA corpus kernels not recorded ok, alone on
  # the GPU at the end (a verification round once left 17 "re-verify" entries), if the pipeline is not
  # past KF_CORPUS_BY_S; verify.py rewrites its file after each kernel, so the timeout
  # loses nothing measured
  [ "${KF_CORPUS_RECHECK:-0}" = 1 ] || return 0
  local by=${KF_CORPUS_BY_S:-1400}
  if [ $SECONDS -ge "$by" ]; then stamp "corpus re-check skipped (after ${SECONDS} s, limit $by s)"; return 0; fi
  on_gpu 0 timeout "${KF_CORPUS_S:-200}" "$PY" corpus/verify.py --backend cuda --jobs 1 --not-ok \
    --note "tools/eval on $GPU, one at a time, alone on the GPU" > $WORK/logs/verify_cuda.txt 2>&1
  stamp "corpus re-check exit $? after ${SECONDS} s: $(grep -c '^  ok ' $WORK/logs/verify_cuda.txt) ok"
  cp corpus/verified_cuda.json $WORK/logs/
}

verify_wait() {  # the corpus verification started beside stage 1, if any, has ended
  [ -n "${VERIFY_PID:-}" ] || return 0
  wait "$VERIFY_PID"
  VERIFY_PID=
  cp corpus/verified_cuda.json $WORK/logs/
  stamp "corpus verification ended after ${SECONDS} s: $(grep -c '^  ok ' $WORK/logs/verify_cuda.txt) ok"
}

s2_totals() {  # the stage-2 round's totals: its per-task array (logs/selfsup.txt prints it)
  # would fill the few kB of a call's output tail
  tail -1 $WORK/policy-s2/selfsup.jsonl 2>/dev/null | sed 's/,"per_task":\[[^]]*\]//'
}

on_gpu() {  # on_gpu N CMD...: CMD sees GPU N only (GPU 0 where the machine has one)
  local g=$(($1 % GPU_COUNT)); shift
  CUDA_VISIBLE_DEVICES=$g "$@"
}

pack_runs() {  # both run folders, without checkpoint weights, as DIR/<run>.tar
  local r
  for r in h200-contrast h200-noex; do
    [ -d runs/$r ] && gpu_pack_run runs/$r > "$1/$r.tar" 2>/dev/null
  done
}

pack_results() {  # 5. both run folders (without checkpoint weights), scores, logs -> $PACK
  mkdir -p $WORK/results
  [ -n "${GPU_MEM_PID:-}" ] && kill $GPU_MEM_PID 2>/dev/null
  local r s
  pack_runs $WORK/results
  tar -C $WORK -czf - results logs $(cd $WORK && ls -d score-* 2>/dev/null) | split -b 15M - "$PACK/results.tar.gz.part-"
  {
    echo "GPU: $GPU"
    tail -3 $WORK/logs/sft.txt
    for r in h200-contrast h200-noex; do [ -d runs/$r ] && { echo "$r:"; tail -1 runs/$r/metrics/run.jsonl; }; done
    for s in $WORK/score-*/table.md; do [ -f $s ] && cat $s; done
  } > "$PACK/summary.txt" 2>&1
  stamp "packed after ${SECONDS} s"
  touch "$PACK/DONE"
}

case "${1:-}" in
  start)
    rm -rf "$WORK"; mkdir -p "$PACK"
    setsid bash "$0" pipeline > "$WORK/pipeline.log" 2>&1 < /dev/null &
    sleep 2
    follow "${2:-570}"
    ;;
  wait) follow "${2:-570}" ;;
  pipeline) pipeline ;;
  *) echo "usage: $0 start|wait [SECONDS]" >&2; exit 2 ;;
esac

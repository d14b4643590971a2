#!/usr/bin/env bash
# On a GPU machine, in one remote session: configs/h200.yaml end to end.
#   dev/h200_run.sh [MINUTES] [extra tools/launch args, e.g. --set k=v]
#   KF_TRAIN_SECONDS=N dev/h200_run.sh ...   train the policy first (stage 1 on the GPU)
# 1. Builds the tree (build-gpu/) while the suite is imported for cpu,cuda.
# 2. With KF_TRAIN_SECONDS > 0: tools/sft --device cuda from scratch for that long into
#    $OUT/policy (the run then starts from it), while corpus/verify.py --backend cuda runs
#    for the same time (measured CUDA corpus verdicts; copy in $OUT/verified_cuda.json) and
#    the rest of the tree builds.
# 3. The GPU tests of the shared-GPU lock (GpuShareTest).
# 4. `tools/launch configs/h200.yaml` for MINUTES (default 5.0; launch.max_minutes, then
#    drain + final checkpoint) with stdout not a terminal, so the status comes as
#    `status:` log lines.
# The remote session returns at most 8 files of <= 16 MiB, so $OUT gets only packed files:
#   launch.txt (the launcher's log), logs.tar.gz (build/import/test/SFT/verify logs),
#   run.tar.gz.part-* (the run folder without checkpoint weights: metrics, logs, kernels,
#   best/, launch_state.json; `cat run.tar.gz.part-* | tar -xz -C runs` gives runs/<name>/,
#   then tools/report on it),
#   with KF_TRAIN_SECONDS also policy.tar.part-* and verified_cuda.json.
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${OUT:-$PWD/h200-run-out}; mkdir -p "$OUTDIR"
PY=${KF_PYTHON:-$(command -v python3)}
MIN=${1:-5.0}; shift || true
TRAIN=${KF_TRAIN_SECONDS:-0}
LOGS=/tmp/kf-h200-run   # everything unpacked stays here
. dev/gpu_session.sh
gpu_session_start $LOGS
POLICY=policies/h200   # configs/h200.yaml's policy
if [ "$TRAIN" -gt 0 ]; then
  gpu_build kf-sft kf-eval kf-sandbox-worker
  gpu_import_wait
  stamp "tools/sft on the GPU for $TRAIN s, CUDA corpus verification alongside (after ${SECONDS} s)"
  KF_BUILD_DIR=$BUILD timeout $((TRAIN + 60)) tools/sft --corpus corpus --tasks $BUILD/tasks --out $LOGS/policy \
    --shape small --vocab 4096 --steps 100000 --batch 8 --lr 1.5e-3 --warmup 30 --seed 0 --device cuda --threads 4 \
    --time-limit "$TRAIN" > $LOGS/sft.txt 2>&1 &
  sft=$!
  KF_BUILD_DIR="$PWD/$BUILD" KF_TASKS_DIR="$PWD/$BUILD/tasks" PYTHONUNBUFFERED=1 timeout "$TRAIN" \
    "$PY" corpus/verify.py --backend cuda --jobs 2 \
    --note "tools/eval on $GPU, 2 at once, while tools/sft trained on the same GPU and the tree built" \
    > $LOGS/verify_cuda.txt 2>&1 &
  ver=$!
fi
gpu_build kf-launch kf-actor kf-learner kf-evaluator kf-sandbox-worker kf-export actors_serial_test
gpu_import_wait
stamp "built after ${SECONDS} s"
$BUILD/tests/actors/actors_serial_test --gtest_filter='GpuShare*' > $LOGS/gpu_share_test.txt 2>&1
tail -4 $LOGS/gpu_share_test.txt
if [ "$TRAIN" -gt 0 ]; then
  wait $sft; rc=$?
  grep -E "examples|wrote|failed" $LOGS/sft.txt | tail -3
  if [ $rc -eq 0 ] && [ -f $LOGS/policy/model.safetensors ]; then
    POLICY=$LOGS/policy
    tar -C $LOGS -cf - policy | split -b 12M - "$OUTDIR/policy.tar.part-"
  else
    echo "tools/sft exit $rc: the run uses $POLICY"
  fi
  wait $ver 2>/dev/null
  cp corpus/verified_cuda.json "$OUTDIR/verified_cuda.json"
  "$PY" - "$OUTDIR/verified_cuda.json" <<'EOF'
import collections, json, sys
d = json.load(open(sys.argv[1]))
print("verified_cuda.json verdicts:", dict(collections.Counter(v["verdict"] for k, v in d.items() if k != "header")))
EOF
fi
NAME=h200-accept
stamp "tools/launch configs/h200.yaml for $MIN min, policy $POLICY (after ${SECONDS} s)"
KF_BUILD_DIR=$BUILD tools/launch configs/h200.yaml --name $NAME --set tasks.dir=$BUILD/tasks \
  --set learner.policy="$POLICY" --set launch.max_minutes="$MIN" "$@" > "$OUTDIR/launch.txt" 2>&1
echo "launch exit $?"
stamp "run ended after ${SECONDS} s"
grep -E "status:" "$OUTDIR/launch.txt" | tail -4
grep -E "launch:" "$OUTDIR/launch.txt" | tail -12
RUN=$(ls -d runs/$NAME* | tail -1)
gpu_pack_run "$RUN" | gzip | split -b 12M - "$OUTDIR/run.tar.gz.part-"
tar -C $LOGS --exclude=./policy -czf "$OUTDIR/logs.tar.gz" .
tail -1 "$RUN/metrics/run.jsonl"
ls -la "$OUTDIR"
stamp "done after ${SECONDS} s"

#!/usr/bin/env bash
# On the GPU machine (one `device` call): the issue-8 acceptance run of configs/h200.yaml.
#   bench/launch/h200_run.sh [MINUTES] [extra tools/launch args, e.g. --set k=v]
#   KF_TRAIN_SECONDS=N bench/launch/h200_run.sh ...   train the policy first (stage 1 on the GPU)
# 1. Builds the tree (build-gpu/) while the suite is imported for cpu,cuda.
# 2. With KF_TRAIN_SECONDS > 0: tools/sft --device cuda from scratch for that long into
#    $OUT/policy (the run then starts from it), while corpus/verify.py --backend cuda runs
#    for the same time (measured CUDA corpus verdicts; copy in $OUT/verified_cuda.json) and
#    the rest of the tree builds.
# 3. The GPU tests of the shared-GPU lock (GpuShareTest).
# 4. `tools/launch configs/h200.yaml` for MINUTES (default 5.0; launch.max_minutes, then
#    drain + final checkpoint) with stdout not a terminal, so the status comes as
#    `status:` log lines. The run folder without checkpoint weights goes to $OUT/run
#    (tools/report runs on it afterwards, here or on the CPU machine).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUTDIR=${OUT:-$PWD/h200-run-out}; mkdir -p "$OUTDIR"
PY=${KF_PYTHON:-$(command -v python3)}
MIN=${1:-5.0}; shift || true
TRAIN=${KF_TRAIN_SECONDS:-0}
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
BUILD=build-gpu
DEPS=(); [ -d .deps/usr ] && DEPS=(-DKF_DEPS_PREFIX="$PWD/.deps/usr") && export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUTDIR/gpu.txt" || exit 2
stamp() { echo "== $(date +%T) $*"; }
SECONDS=0
stamp "configure; import the suite (cpu,cuda) in parallel"
"$PY" tasks/importer/kf_import.py tasks/suite --out $BUILD/tasks --backends cpu,cuda > "$OUTDIR/import.log" 2>&1 &
imp=$!
cmake -S . -B $BUILD -G Ninja -DKF_PYTHON="$PY" -DCMAKE_CUDA_ARCHITECTURES=90 "${DEPS[@]}" > "$OUTDIR/configure.log" 2>&1 || { tail -30 "$OUTDIR/configure.log"; exit 1; }
build() { cmake --build $BUILD -j "$(nproc)" --target "$@" >> "$OUTDIR/build.log" 2>&1 || { grep -m20 -A5 "error" "$OUTDIR/build.log"; exit 1; }; }
POLICY=policies/default
if [ "$TRAIN" -gt 0 ]; then
  build kf-sft kf-eval kf-sandbox-worker
  wait $imp || { tail -20 "$OUTDIR/import.log"; exit 1; }
  stamp "tools/sft on the GPU for $TRAIN s, CUDA corpus verification alongside (after ${SECONDS} s)"
  KF_BUILD_DIR=$BUILD timeout $((TRAIN + 60)) tools/sft --corpus corpus --tasks $BUILD/tasks --out "$OUTDIR/policy" \
    --shape small --vocab 4096 --steps 100000 --batch 8 --lr 1.5e-3 --warmup 30 --seed 0 --device cuda --threads 4 \
    --time-limit "$TRAIN" > "$OUTDIR/sft.txt" 2>&1 &
  sft=$!
  KF_BUILD_DIR="$PWD/$BUILD" KF_TASKS_DIR="$PWD/$BUILD/tasks" PYTHONUNBUFFERED=1 timeout "$TRAIN" \
    "$PY" corpus/verify.py --backend cuda --jobs 6 \
    --note "tools/eval on $(tail -1 "$OUTDIR/gpu.txt"), 6 at once, while tools/sft trained on the same GPU and the tree built" \
    > "$OUTDIR/verify_cuda.txt" 2>&1 &
  ver=$!
fi
build kf-launch kf-actor kf-learner kf-evaluator kf-sandbox-worker kf-export actors_serial_test
wait $imp 2>/dev/null
stamp "built after ${SECONDS} s"
$BUILD/tests/actors/actors_serial_test --gtest_filter='GpuShare*' > "$OUTDIR/gpu_share_test.txt" 2>&1
tail -4 "$OUTDIR/gpu_share_test.txt"
if [ "$TRAIN" -gt 0 ]; then
  wait $sft; rc=$?
  grep -E "examples|wrote|failed" "$OUTDIR/sft.txt" | tail -3
  if [ $rc -eq 0 ] && [ -f "$OUTDIR/policy/model.safetensors" ]; then POLICY="$OUTDIR/policy"; else echo "tools/sft exit $rc: the run uses $POLICY"; fi
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
mkdir -p "$OUTDIR/run"
tar -C "$RUN" --exclude=./checkpoints -cf - . | tar -xf - -C "$OUTDIR/run"
ls -laR "$RUN/checkpoints" > "$OUTDIR/run/checkpoints.txt" 2>&1
cp "$RUN"/checkpoints/launch_state.json "$OUTDIR/run/" 2>/dev/null
tail -1 "$RUN/metrics/run.jsonl"
stamp "done after ${SECONDS} s"

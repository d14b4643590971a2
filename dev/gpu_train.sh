#!/usr/bin/env bash
# On the GPU machine (one `device` call): train the default policy (stage 1) on the GPU.
#   dev/gpu_train.sh [SFT_SECONDS]
# 1. builds kf-sft, kf-eval, kf-optimize (build-gpu/) while the suite is imported (cpu,cuda);
# 2. tools/sft --device cuda from scratch for SFT_SECONDS (default 110), while
#    corpus/verify.py --backend cuda runs 2 at a time for as long (6 at once ran out of
#    GPU memory: the tasks hold GiBs of tensors);
# 3. tools/optimize with the new policy on 001_relu (16 candidates, the actors' sampler on
#    the GPU, the real evaluator): a check of what it writes and how fast it samples.
# The device tool returns at most 8 files of <= 16 MiB, so $OUT gets: policy.tar.part-*
# (`cat policy.tar.part-* | tar -x` gives policy/), sft.txt, verify_cuda.txt,
# verified_cuda.json, optimize.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${OUT:-$PWD/gpu-train-out}; mkdir -p "$OUTDIR"
PY=${KF_PYTHON:-$(command -v python3)}
T1=${1:-110}
WORK=/tmp/kf-gpu-train
. dev/gpu_session.sh
gpu_session_start $WORK
gpu_build kf-eval kf-sandbox-worker kf-sft kf-optimize
gpu_import_wait
stamp "built + imported after ${SECONDS} s; SFT for $T1 s with the CUDA corpus verification alongside"
KF_BUILD_DIR="$PWD/$BUILD" KF_TASKS_DIR="$PWD/$BUILD/tasks" PYTHONUNBUFFERED=1 timeout "$T1" \
  "$PY" corpus/verify.py --backend cuda --jobs 2 \
  --note "tools/eval on $GPU, 2 at once, while tools/sft trained on the same GPU" > "$OUTDIR/verify_cuda.txt" 2>&1 &
ver=$!
KF_BUILD_DIR=$BUILD tools/sft --corpus corpus --tasks $BUILD/tasks --out $WORK/policy --shape small --vocab 4096 \
  --steps 100000 --batch 8 --lr 1.5e-3 --warmup 30 --seed 0 --device cuda --threads 4 --time-limit "$T1" \
  > "$OUTDIR/sft.txt" 2>&1 || { tail -20 "$OUTDIR/sft.txt"; exit 1; }
grep -E "examples|wrote" "$OUTDIR/sft.txt" | tail -2
tar -C $WORK -cf - policy | split -b 12M - "$OUTDIR/policy.tar.part-"
wait $ver 2>/dev/null
cp corpus/verified_cuda.json "$OUTDIR/verified_cuda.json"
stamp "optimize check (after ${SECONDS} s)"
KF_BUILD_DIR=$BUILD timeout 60 build-gpu/actors/kf-optimize --model $WORK/policy --task 001_relu --tasks-dir $BUILD/tasks \
  --backend cuda --device cuda -n 16 --max-new-tokens 2048 --config configs/h200.yaml --set tasks.dir=$BUILD/tasks \
  --out $WORK/opt > "$OUTDIR/optimize.txt" 2>&1
echo "optimize exit $?" | tee -a "$OUTDIR/optimize.txt"
cat $WORK/opt/report.txt >> "$OUTDIR/optimize.txt" 2>/dev/null
tail -25 "$OUTDIR/optimize.txt"
stamp "done after ${SECONDS} s"

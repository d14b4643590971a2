#!/usr/bin/env bash
# The learner's GPU-machine half, in one device call (docs/learner.md):
#   bench/learner/gpu_learner_bench.sh        logs to $OUT (or ./gpu-learner-out); ~4 min on one H200
# 1. builds only the learner targets (and bench_policy for the side-by-side train figure);
# 2. the 1-rank NCCL check: Learner steps through ncclAllReduce vs the local communicator
#    (bench_learner --nccl-check), and kf-learner itself with learner.dist.comm=nccl;
# 3. training throughput of a Qwen2.5-0.5B-shaped model in bf16 autocast (tokens/s, MFU,
#    snapshot publish stall), beside bench_policy's bare forward+backward figure.
# Env: KF_PYTHON (default /opt/torch/.venv/bin/python3), LEARNER_GROUPS (8), LEARNER_SEQ (512+512),
#      LEARNER_SKIP_POLICY=1 (no bench_policy train step beside it).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUTDIR=${OUT:-$PWD/gpu-learner-out}; mkdir -p "$OUTDIR"
PY=${KF_PYTHON:-/opt/torch/.venv/bin/python3}; [ -x "$PY" ] || PY=$(command -v python3)
export PATH=/usr/local/cuda/bin:$(dirname "$PY"):$PATH NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
B=build-gpu-learner
DEPS=(); [ -d .deps/usr ] && DEPS=(-DKF_DEPS_PREFIX="$PWD/.deps/usr") && export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
t0=$(date +%s); el() { echo "$(( $(date +%s) - t0 )) s"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUTDIR/learner_gpu.txt"
echo "== configure + build (bench_learner kf-learner kf-export bench_policy)"
timeout 120 cmake -S . -B $B -G Ninja -DKF_PYTHON="$PY" -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
  -DKF_BUILD_TESTS=OFF -DKF_SKIP_COMPONENTS="evaluator;actors" "${DEPS[@]}" > "$OUTDIR/learner_configure.log" 2>&1 \
  || { tail -30 "$OUTDIR/learner_configure.log"; exit 1; }
# bench_policy: reuse the one bench/policy/gpu_policy_bench.sh built, if this session has it.
BP=build-policy-gpu/bench_policy/bench_policy; BPT=(); [ -x "$BP" ] || { BP=$B/bench/policy/bench_policy; BPT=(bench_policy); }
[ "${LEARNER_SKIP_POLICY:-0}" = 1 ] && BPT=()   # the side-by-side policy figure is recorded already
timeout 300 cmake --build $B -j "$(nproc)" --target bench_learner kf-learner kf-export "${BPT[@]}" \
  > "$OUTDIR/learner_build.log" 2>&1 || { grep -m20 -B2 -A5 "error" "$OUTDIR/learner_build.log"; exit 1; }
echo "   built: $(el)"
rows="$OUTDIR/learner_rows.txt"; : > "$rows"
rc=0

echo "== 1-rank NCCL: Learner through ncclAllReduce vs the local communicator"
timeout 120 $B/bench/learner/bench_learner --nccl-check --device cuda 2> "$OUTDIR/nccl_check.log" | tee -a "$rows"
[ "${PIPESTATUS[0]}" -eq 0 ] || { rc=1; echo "nccl check failed:"; tail -20 "$OUTDIR/nccl_check.log"; }

echo "== 1-rank NCCL: kf-learner (learner.dist.comm=nccl, synthetic groups, tiny model)"
mkdir -p "$OUTDIR/nccl_run"
timeout 120 $B/learner/kf-learner configs/default.yaml --synthetic --device cuda:0 --steps 3 --print-steps \
  --run-dir "$OUTDIR/nccl_run" --final-checkpoint \
  --set learner.dist.comm=nccl --set learner.init_shape=tiny --set learner.schedule.warmup_steps=0 \
  > "$OUTDIR/nccl_kf_learner.log" 2>&1
krc=$?
grep -E "^STEP|WEIGHTS_CHECKSUM|NCCL" "$OUTDIR/nccl_kf_learner.log" | tail -6
if [ $krc -eq 0 ] && grep -q WEIGHTS_CHECKSUM "$OUTDIR/nccl_kf_learner.log"; then
  echo "BENCH|learner|nccl_1rank_kf_learner|result|PASS|-" | tee -a "$rows"
  timeout 60 $B/learner/kf-export "$OUTDIR/nccl_run" "$OUTDIR/nccl_export" > "$OUTDIR/export.log" 2>&1 \
    && echo "BENCH|learner|export_from_gpu_checkpoint|result|PASS|-" | tee -a "$rows" \
    || { echo "BENCH|learner|export_from_gpu_checkpoint|result|FAIL|-" | tee -a "$rows"; tail -5 "$OUTDIR/export.log"; }
else
  rc=1; echo "BENCH|learner|nccl_1rank_kf_learner|result|FAIL|-" | tee -a "$rows"; tail -20 "$OUTDIR/nccl_kf_learner.log"
fi
echo "   nccl: $(el)"

echo "== throughput: Qwen2.5-0.5B shape, bf16 autocast, ${LEARNER_GROUPS:-8} groups x 8, seq ${LEARNER_SEQ:-512+512}"
P=${LEARNER_SEQ:-512+512}
SNAP=(); shm_kb=$(df -k --output=avail /dev/shm 2>/dev/null | tail -1 | tr -d ' '); [ "${shm_kb:-0}" -gt 3000000 ] || { SNAP=(--no-snapshot); echo "   /dev/shm has ${shm_kb:-?} kB free: no snapshot publishing"; }
timeout 200 $B/bench/learner/bench_learner --device cuda "${SNAP[@]}" --groups "${LEARNER_GROUPS:-8}" \
  --prompt "${P%+*}" --completion "${P#*+}" --steps 3 2> "$OUTDIR/learner_bench.log" | tee -a "$rows"
[ "${PIPESTATUS[0]}" -eq 0 ] || { rc=1; echo "bench_learner failed:"; tail -20 "$OUTDIR/learner_bench.log"; }
echo "   throughput: $(el)"

if [ "${LEARNER_SKIP_POLICY:-0}" != 1 ]; then
  echo "== beside it: bench_policy train step (bare forward + backward of token_logprobs)"
  timeout 120 "$BP" --device cuda --mode train --train-batch 8 --train-seq 1024 \
    2> "$OUTDIR/policy_train.log" | tee -a "$rows" || true
fi

echo
echo "== learner on one H200 (same run, $(el))"
awk -F'|' '/^BENCH\|(learner|policy)\|/ { printf "%-8s %-44s %-28s %14s %s\n", $2, $3, $4, $5, $6 }' "$rows" \
  | tee "$OUTDIR/learner_table.txt"
exit $rc

#!/usr/bin/env bash
# The GPU figures of the evaluator and the policy in one device call (about 8 minutes):
# builds both in parallel on the machine's cores, then runs the benchmarks one after
# the other (never two GPU benchmarks at once). Logs and tables go to $OUT.
#   bench/gpu_figures.sh            (carry .deps for TBB/seccomp)
# Env: KF_SKIP_POLICY=1 (evaluator only), KF_EVAL_ROUNDS (2), KF_EVAL_REPRO=0 (skip the two-run check).
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${OUT:-$PWD/gpu-figures-out}; mkdir -p "$OUTDIR"
export KF_PYTHON=${KF_PYTHON:-/opt/torch/.venv/bin/python3} PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export PATH=/usr/local/cuda/bin:$(dirname "$KF_PYTHON"):$PATH
PY=$KF_PYTHON; B=build-gpu-eval; t0=$(date +%s); el() { echo "$(( $(date +%s) - t0 )) s"; }
DEPS=(); [ -d .deps/usr ] && DEPS=(-DKF_DEPS_PREFIX="$PWD/.deps/usr") && export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUTDIR/gpu.txt"
( cmake -S . -B $B -G Ninja -DKF_PYTHON="$PY" -DCMAKE_CUDA_ARCHITECTURES=90 -DKF_SKIP_COMPONENTS="policy;learner;actors" "${DEPS[@]}" \
  && cmake --build $B -j 8 --target bench_evaluator kf-eval kf-sandbox-worker ) > "$OUTDIR/eval_build.log" 2>&1 &
[ "${KF_SKIP_POLICY:-0}" = 1 ] || ( cmake -S bench/policy/standalone -B build-policy-gpu -G Ninja -DKF_PYTHON="$PY" -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
  && cmake --build build-policy-gpu --target bench_policy -j 8 ) > "$OUTDIR/policy_prebuild.log" 2>&1 &
mkdir -p $B/tasks
for t in 001_relu 002_gelu 021_softmax 030_matmul_square; do
  "$PY" tasks/importer/kf_import.py tasks/suite/level1/$t.py --out $B/tasks --backends cuda >> "$OUTDIR/import.log" 2>&1 &
done
wait; echo "builds + import: $(el)"; tail -2 "$OUTDIR/eval_build.log"
echo "== evaluator: throughput (production settings) and reproducibility"
timeout "${KF_EVAL_BENCH_TIMEOUT:-170}" $B/bench/evaluator/bench_evaluator --backend cuda --tasks $B/tasks --python "$PY" \
  --kf-eval $B/evaluator/kf-eval --compile-reps 5 --no-load-inline --throughput-rounds "${KF_EVAL_ROUNDS:-2}" $([ "${KF_EVAL_REPRO:-1}" = 1 ] || echo --no-repro) \
  > "$OUTDIR/bench_cuda.txt" 2> "$OUTDIR/bench_cuda_reports.txt"
grep -v '^BENCH' "$OUTDIR/bench_cuda.txt" | tail -20; grep '^BENCH' "$OUTDIR/bench_cuda.txt"
echo "evaluator: $(el)"
if [ "${KF_SKIP_POLICY:-0}" != 1 ]; then
  echo "== policy"
  bash bench/policy/gpu_policy_bench.sh 2>&1 | tail -30
fi
echo "total: $(el)"

#!/usr/bin/env bash
# The evaluator's (and replay's) GPU-machine half, in one device call (docs/evaluator.md):
#   bench/evaluator/gpu_eval_check.sh [--bench]     logs to $OUT (or ./gpu-eval-out)
# Builds only the evaluator and replay targets, imports the tasks the corpus uses
# (cpu + cuda), runs both evaluator test binaries (CUDA corpus included) and, with
# --bench, the evaluator benchmark and the replay benchmark on this machine's cores.
# Carried dependencies (TBB, seccomp.h) come from .deps/ when present.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUTDIR=${OUT:-$PWD/gpu-eval-out}; mkdir -p "$OUTDIR"
PY=${KF_PYTHON:-$(command -v python3)}
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
B=build-gpu-eval
DEPS=(); [ -d .deps/usr ] && DEPS=(-DKF_DEPS_PREFIX="$PWD/.deps/usr") && export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUTDIR/gpu.txt"
t0=$(date +%s); el() { echo "$(( $(date +%s) - t0 )) s"; }
cmake -S . -B $B -G Ninja -DKF_PYTHON="$PY" -DCMAKE_CUDA_ARCHITECTURES=90 -DKF_SKIP_COMPONENTS="${KF_SKIP_COMPONENTS:-}" "${DEPS[@]}" > "$OUTDIR/configure.log" 2>&1 || { tail -30 "$OUTDIR/configure.log"; exit 1; }
cmake --build $B -j "$(nproc)" --target evaluator_core_test evaluator_test kf-eval kf-sandbox-worker bench_evaluator bench_replay > "$OUTDIR/build.log" 2>&1 || { grep -m20 -B2 -A5 "error" "$OUTDIR/build.log"; exit 1; }
echo "build: $(el)"
mkdir -p $B/tasks
for t in 001_relu 002_gelu 021_softmax 024_layernorm 030_matmul_square; do
  "$PY" tasks/importer/kf_import.py tasks/suite/level1/$t.py --out $B/tasks --backends cpu,cuda >> "$OUTDIR/import.log" 2>&1 || tail -5 "$OUTDIR/import.log"
done
echo "import: $(el)"
export KF_BUILD_DIR=$PWD/$B KF_SOURCE_DIR=$PWD KF_PYTHON="$PY"
timeout 120 $B/tests/evaluator/evaluator_core_test > "$OUTDIR/core_test.log" 2>&1; rc1=$?
tail -3 "$OUTDIR/core_test.log"; grep -E "FAILED|nvcc " "$OUTDIR/core_test.log" | head -20
timeout "${KF_TEST_TIMEOUT:-300}" $B/tests/evaluator/evaluator_test --gtest_filter="${KF_EVAL_FILTER:-*cuda*:EvaluatorTest.*}" > "$OUTDIR/evaluator_test.log" 2>&1; rc2=$?
grep -E "^(cpu|cuda)/|FAILED|PASSED|Failure" "$OUTDIR/evaluator_test.log" | head -60
echo "tests (rc $rc1 $rc2): $(el)"
if [ "${1:-}" = "--bench" ]; then
  timeout 60 $B/bench/replay/bench_replay --seconds 2 --snapshot-mib 1024 > "$OUTDIR/bench_replay.txt" 2>&1
  grep -v '^BENCH' "$OUTDIR/bench_replay.txt" | tail -25
  echo "replay bench: $(el)"
  timeout "${KF_BENCH_TIMEOUT:-200}" $B/bench/evaluator/bench_evaluator --backend cuda --tasks $B/tasks --python "$PY" \
    --kf-eval $B/evaluator/kf-eval --compile-reps 7 --load-inline-reps 2 > "$OUTDIR/bench_cuda.txt" 2>&1
  tail -25 "$OUTDIR/bench_cuda.txt"
  echo "evaluator bench: $(el)"
fi
exit $(( rc1 || rc2 ))

#!/usr/bin/env bash
# The evaluator's GPU half, in one device call (see docs/evaluator.md):
#   bench/evaluator/gpu_eval_check.sh [--bench]     logs to $OUT (or ./gpu-eval-out)
# Builds only the evaluator targets, imports the tasks the corpus uses (cpu + cuda),
# runs both evaluator test binaries (CUDA corpus included) and optionally the benchmark.
# Carried dependencies (TBB, seccomp.h) come from .deps/ when present.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUTDIR=${OUT:-$PWD/gpu-eval-out}; mkdir -p "$OUTDIR"
PY=${KF_PYTHON:-$(command -v python3)}
export PATH=/usr/local/cuda/bin:$PATH
B=build-gpu-eval
DEPS=(); [ -d .deps/usr ] && DEPS=(-DKF_DEPS_PREFIX="$PWD/.deps/usr") && export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUTDIR/gpu.txt"
t0=$(date +%s)
cmake -S . -B $B -G Ninja -DKF_PYTHON="$PY" -DCMAKE_CUDA_ARCHITECTURES=90 "${DEPS[@]}" > "$OUTDIR/configure.log" 2>&1 || { tail -30 "$OUTDIR/configure.log"; exit 1; }
cmake --build $B -j "$(nproc)" --target evaluator_core_test evaluator_test kf-eval kf-sandbox-worker bench_evaluator > "$OUTDIR/build.log" 2>&1 || { grep -m20 -B2 -A5 "error" "$OUTDIR/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
mkdir -p $B/tasks
for t in 001_relu 002_gelu 021_softmax 024_layernorm 030_matmul_square; do
  "$PY" tasks/importer/kf_import.py tasks/suite/level1/$t.py --out $B/tasks --backends cpu,cuda >> "$OUTDIR/import.log" 2>&1 || tail -5 "$OUTDIR/import.log"
done
echo "import: $(( $(date +%s) - t0 )) s"
export KF_BUILD_DIR=$PWD/$B KF_SOURCE_DIR=$PWD KF_PYTHON="$PY"
$B/tests/evaluator/evaluator_core_test > "$OUTDIR/core_test.log" 2>&1; rc1=$?
tail -3 "$OUTDIR/core_test.log"; grep -E "FAILED|nvcc " "$OUTDIR/core_test.log" | head -20
$B/tests/evaluator/evaluator_test --gtest_filter="${KF_EVAL_FILTER:-*cuda*:EvaluatorTest.*}" > "$OUTDIR/evaluator_test.log" 2>&1; rc2=$?
grep -E "^(cpu|cuda)/|FAILED|PASSED" "$OUTDIR/evaluator_test.log" | head -40
echo "tests: $(( $(date +%s) - t0 )) s"
if [ "${1:-}" = "--bench" ]; then
  $B/bench/evaluator/bench_evaluator --backend cuda --tasks $B/tasks --python "$PY" --kf-eval $B/evaluator/kf-eval > "$OUTDIR/bench_cuda.txt" 2>&1
  cat "$OUTDIR/bench_cuda.txt" | tail -25
fi
exit $(( rc1 || rc2 ))

#!/usr/bin/env bash
# On the GPU machine: verify the CUDA half of the seed corpus with tools/eval.
#   dev/gpu_verify.sh [--tasks T ...] [--full]
# Builds kf-eval and the sandbox worker (build-gpu/, as tools/gpu-check does), imports the
# suite for both backends (CUDA artifacts are only made with --backends cpu,cuda), then
# runs corpus/verify.py --backend cuda, which writes corpus/verified_cuda.json (real
# verdicts and speedups replace the "compiled, not run" entries) and a copy under $OUT.
# Extra arguments go to verify.py (e.g. --tasks 001_relu 021_softmax, --full).
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${OUT:-$PWD/gpu-verify-out}; mkdir -p "$OUTDIR"
PY=${KF_PYTHON:-$(command -v python3)}
export PATH=/usr/local/cuda/bin:$PATH
BUILD=${KF_BUILD_DIR:-build-gpu}
DEPS=(); [ -d .deps/usr ] && DEPS=(-DKF_DEPS_PREFIX="$PWD/.deps/usr") && export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUTDIR/gpu.txt" || { echo "gpu_verify.sh: no GPU visible; nothing verified" >&2; exit 2; }
echo "== configure + build kf-eval"
if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DKF_PYTHON="$PY" -DCMAKE_CUDA_ARCHITECTURES=90 "${DEPS[@]}" > "$OUTDIR/configure.log" 2>&1 || { tail -30 "$OUTDIR/configure.log"; exit 1; }
fi
cmake --build "$BUILD" -j "$(nproc)" --target kf-eval kf-sandbox-worker > "$OUTDIR/build.log" 2>&1 || { grep -m20 -A5 "error" "$OUTDIR/build.log"; exit 1; }
echo "== import the suite (cpu, cuda)"
if [ ! -f "$BUILD/tasks/001_relu/task.json" ] || ! grep -q '"cuda"' "$BUILD/tasks/001_relu/task.json"; then
  "$PY" tasks/importer/kf_import.py tasks/suite --out "$BUILD/tasks" --backends cpu,cuda > "$OUTDIR/import.log" 2>&1 || { tail -20 "$OUTDIR/import.log"; exit 1; }
fi
echo "== verify the CUDA corpus"
KF_BUILD_DIR="$PWD/$BUILD" KF_TASKS_DIR="$PWD/$BUILD/tasks" PYTHONUNBUFFERED=1 \
  "$PY" corpus/verify.py --backend cuda --jobs 1 \
  --note "tools/eval on $(head -2 "$OUTDIR/gpu.txt" | tail -1)" "$@" | tee "$OUTDIR/verify_cuda.txt"
rc=${PIPESTATUS[0]}
cp corpus/verified_cuda.json "$OUTDIR/verified_cuda.json"
exit $rc

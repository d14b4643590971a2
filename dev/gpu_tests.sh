#!/usr/bin/env bash
# One device call: build the test binaries that hold CUDA tests and run those tests.
#   dev/gpu_tests.sh [CTEST_REGEX]   (default: the learner's and policy's Cuda* tests)
# From a tree carrying .deps/ (TBB, seccomp.h). Logs go to $OUT (tests.txt, build.log).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-tests-out}; mkdir -p "$OUT"
REGEX=${1:-'^(Learner|Engine|Policy)[A-Za-z0-9]*Test\.Cuda'}
PY=/opt/torch/.venv/bin/python3; [ -x "$PY" ] || PY=$(command -v python3)
export PATH=/usr/local/cuda/bin:$(dirname "$PY"):$PATH NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
B=build-gpu; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/tests.txt"
SECONDS=0
TARGETS=${KF_GPU_TEST_TARGETS:-learner_test policy_engine_test policy_model_test}
timeout 120 cmake -S . -B $B -G Ninja -DKF_PYTHON="$PY" -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
  -DKF_DEPS_PREFIX="$PWD/.deps/usr" > "$OUT/configure.log" 2>&1 || { tail -20 "$OUT/configure.log"; exit 1; }
timeout 420 cmake --build $B -j 16 --target $TARGETS > "$OUT/build.log" 2>&1 || { grep -m20 -A5 error "$OUT/build.log"; exit 1; }
echo "== built in ${SECONDS}s" | tee -a "$OUT/tests.txt"
# Through ctest, so fixtures (the policy's HF reference tensors) run first.
echo "== ctest -R '$REGEX' after ${SECONDS}s" | tee -a "$OUT/tests.txt"
timeout 400 ctest --test-dir $B -R "$REGEX" --output-on-failure --timeout 300 2>&1 | grep -v "^frame #" | tail -80 | tee -a "$OUT/tests.txt"
echo "== done ${SECONDS}s" | tee -a "$OUT/tests.txt"

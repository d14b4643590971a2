#!/usr/bin/env bash
# One device call for the learner at real shapes: the CUDA tests of the policy model and the
# learner (the lean layers, grouped K/V, chunked head, LoRA), then the learner-scale rows in
# the same build folder (no second compile of the libraries).
#   dev/gpu_learner_check.sh      env as bench/learner_scale/gpu_learner_scale.sh (CASES,
#                                 LEARNER_GIB, RECOMPUTE_LAYERS); logs to $OUT
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-learner-check-out}; mkdir -p "$OUT"
export OUT
SECONDS=0
KF_GPU_TEST_TARGETS="policy_model_test learner_test bench_learner_scale kf-learner" \
  bash dev/gpu_tests.sh '^((Policy|Learner)[A-Za-z0-9]*Test\.Cuda|LeanLayersTest\.)'
tests_rc=$?
echo "== tests done after ${SECONDS}s (rc $tests_rc); bench" | tee -a "$OUT/tests.txt"
KF_BENCH_BUILD_DIR=build-gpu bash bench/learner_scale/gpu_learner_scale.sh 2>&1 | tee "$OUT/bench.txt"
echo "== rows"; cat "$OUT/rows.txt" 2>/dev/null
# The device hands back few files: everything in one archive as well.
tar -czf /tmp/gpu-learner-check.tgz -C "$OUT" . && mv /tmp/gpu-learner-check.tgz "$OUT/all.tgz"
echo "== all done after ${SECONDS}s"

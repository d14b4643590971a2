#!/usr/bin/env bash
# One device call for the learner at real shapes: the CUDA tests of the policy model and the
# learner (the lean layers, grouped K/V, chunked head, LoRA), then the learner-scale rows in
# the same build folder (no second compile of the libraries).
#   dev/gpu_learner_check.sh      env as bench/learner_scale/gpu_learner_scale.sh (CASES,
#                                 LEARNER_GIB, RECOMPUTE_LAYERS)
# $OUT gets four files (the device hands back only a few): tests.txt, bench.txt, rows.txt and
# all.tgz with every log.
set -uo pipefail
cd "$(dirname "$0")/.."
DEST=${OUT:-$PWD/gpu-learner-check-out}; mkdir -p "$DEST"
export OUT=$(mktemp -d /tmp/gpu-learner-check.XXXXXX)
SECONDS=0
KF_GPU_TEST_TARGETS="policy_model_test learner_test bench_learner_scale kf-learner" \
  bash dev/gpu_tests.sh '^((Policy|Learner)[A-Za-z0-9]*Test\.Cuda|LeanLayersTest\.)'
tests_rc=$?
echo "== tests done after ${SECONDS}s (rc $tests_rc); bench" | tee -a "$OUT/tests.txt"
KF_BENCH_BUILD_DIR=build-gpu bash bench/learner_scale/gpu_learner_scale.sh 2>&1 | tee "$OUT/bench.txt"
echo "== rows"; cat "$OUT/rows.txt" 2>/dev/null
tar -czf "$DEST/all.tgz" -C "$OUT" .
cp "$OUT/tests.txt" "$OUT/bench.txt" "$DEST/"; cp "$OUT/rows.txt" "$DEST/" 2>/dev/null
echo "== all done after ${SECONDS}s"

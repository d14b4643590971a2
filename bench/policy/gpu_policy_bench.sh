#!/usr/bin/env bash
# On the GPU machine: build bench_policy (common + policy only, see standalone/), run it and
# HF transformers generate() on the same GPU, print one table. Logs go to $OUT.
#   bench/policy/gpu_policy_bench.sh          (about 3-4 minutes on one H200)
# Env: KF_PYTHON (default /opt/torch/.venv/bin/python3), BENCH_NEW (generated tokens, 256),
#      BENCH_PROMPT (128), BENCH_BATCHES (1,16,64), TRAIN_BATCH (8), TRAIN_SEQ (2048).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUTDIR=${OUT:-$PWD/gpu-policy-bench-out}; mkdir -p "$OUTDIR"
PY=${KF_PYTHON:-/opt/torch/.venv/bin/python3}; [ -x "$PY" ] || PY=$(command -v python3)
export PATH=/usr/local/cuda/bin:$(dirname "$PY"):$PATH
NEW=${BENCH_NEW:-256}; PROMPT=${BENCH_PROMPT:-128}; BATCHES=${BENCH_BATCHES:-1,16,64}
BUILD=build-policy-gpu
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUTDIR/policy_gpu.txt"
echo "== configure + build bench_policy"
t0=$(date +%s)
cmake -S bench/policy/standalone -B $BUILD -G Ninja -DKF_PYTHON="$PY" -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_BUILD_TYPE=Release > "$OUTDIR/policy_configure.log" 2>&1 || { tail -30 "$OUTDIR/policy_configure.log"; exit 1; }
cmake --build $BUILD --target bench_policy -j "$(nproc)" > "$OUTDIR/policy_build.log" 2>&1 \
  || { grep -m20 -A5 "error" "$OUTDIR/policy_build.log"; exit 1; }
echo "   built in $(( $(date +%s) - t0 )) s"
rows="$OUTDIR/policy_bench_rows.txt"; : > "$rows"
echo "== ours: decode (batches $BATCHES, prompt $PROMPT, new $NEW) and train step"
timeout 200 $BUILD/bench_policy/bench_policy --device cuda --batches "$BATCHES" --prompt "$PROMPT" --new "$NEW" \
  --train-batch "${TRAIN_BATCH:-8}" --train-seq "${TRAIN_SEQ:-2048}" 2> "$OUTDIR/policy_bench_ours.log" | tee -a "$rows"
rc1=${PIPESTATUS[0]}
echo "== ours, eager decode steps (no CUDA graph)"
timeout 120 $BUILD/bench_policy/bench_policy --device cuda --mode decode --no-cuda-graph --batches "$BATCHES" \
  --prompt "$PROMPT" --new "$NEW" 2> "$OUTDIR/policy_bench_ours_eager.log" | tee -a "$rows"
echo "== HF transformers generate()"
timeout 200 "$PY" bench/policy/hf_policy_bench.py --batches "$BATCHES" --prompt "$PROMPT" --new "$NEW" \
  2> "$OUTDIR/policy_bench_hf.log" | tee -a "$rows"
rc2=${PIPESTATUS[0]}
[ $rc1 -eq 0 ] || { echo "bench_policy failed ($rc1):"; tail -20 "$OUTDIR/policy_bench_ours.log"; }
[ $rc2 -eq 0 ] || { echo "hf_policy_bench failed ($rc2):"; tail -20 "$OUTDIR/policy_bench_hf.log"; }
echo
echo "== policy benchmark (one H200, same run)"
printf '%-6s %14s %14s %14s %8s\n' batch ours_graph ours_eager hf_generate ratio | tee "$OUTDIR/policy_table.txt"
IFS=, read -ra BS <<< "$BATCHES"
for b in "${BS[@]}"; do
  ours=$(grep "^BENCH|policy|decode_qwen2.5-0.5b_bf16_b${b}_p" "$rows" | cut -d'|' -f5)
  eager=$(grep "^BENCH|policy|decode_qwen2.5-0.5b_bf16_eager_b${b}_p" "$rows" | cut -d'|' -f5)
  hf=$(grep "^BENCH|policy_hf|decode_.*_b${b}_p" "$rows" | cut -d'|' -f5)
  best=$(awk -v a="${ours:-0}" -v b="${eager:-0}" 'BEGIN { print (a > b ? a : b) }')
  ratio=$(awk -v o="$best" -v h="${hf:-0}" 'BEGIN { if (h > 0) printf "%.2fx", o / h; else print "-" }')
  printf '%-6s %14s %14s %14s %8s\n' "$b" "${ours:--}" "${eager:--}" "${hf:--}" "$ratio" | tee -a "$OUTDIR/policy_table.txt"
done
grep "^BENCH|policy|train" "$rows" | awk -F'|' '{ printf "%-40s %-10s %10s %s\n", $3, $4, $5, $6 }' | tee -a "$OUTDIR/policy_table.txt"
exit $(( rc1 != 0 || rc2 != 0 ))

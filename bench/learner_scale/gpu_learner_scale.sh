#!/usr/bin/env bash
# Real-shape learner steps and the sharded path on the GPU machine, in one device call:
#   bench/learner_scale/gpu_learner_scale.sh     logs and rows to $OUT (or ./gpu-learner-scale-out)
# 1. builds bench_learner_scale and kf-learner only (own build folder, tests off);
# 2. Qwen2.5-Coder-1.5B shape, full fine-tuning, prompt 2k + completion 4k, bf16 autocast:
#    phase split, tokens/s, MFU against PEAK_TFLOPS, peak memory; with and without
#    recomputation; then the sharded optimizer at one rank (fp32 weights; bf16 weights with
#    the fp32 master) and through a 1-rank NCCL communicator (reduce-scatter/all-gather run),
#    and sharded gradients and sharded parameters (ZeRO-3, per-layer gathers) through it;
# 3. with 2 or more GPUs: kf-learner over NCCL on 2 ranks, learner.dist.shard none against
#    optimizer, gradients and params on the same synthetic data (3 steps): every rank's checksum must agree within a
#    run, and the two runs' weights within 2e-4 absolute, under a tenth of the 3-step update
#    (NCCL's reduce-scatter and all-reduce may sum in different orders, and Adam enlarges that
#    for near-zero gradients, so not bitwise on GPU).
# 4. 7B shape with LoRA (rank 16 and 64, bare forward+backward beside it, with and without recomputation).
# 5. with LEARNER_GIB set: the 7B LoRA rows again while two other processes (standing in for
#    two evaluators at their worst: every claim of the shared budget held at once) hold all of
#    the card but LEARNER_GIB, and selective recomputation (RECOMPUTE_LAYERS, a list).
# Env: PEAK_TFLOPS (default: measured here with an 8192^3 bf16 matmul), SEQS (2), KF_PYTHON,
#      CASES (names of the rows to run, default all), LEARNER_GIB, RECOMPUTE_LAYERS ("8 12 16"),
#      KF_BENCH_BUILD_DIR.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUTDIR=${OUT:-$PWD/gpu-learner-scale-out}; mkdir -p "$OUTDIR"
PY=${KF_PYTHON:-/opt/torch/.venv/bin/python3}; [ -x "$PY" ] || PY=$(command -v python3)
export PATH=/usr/local/cuda/bin:$(dirname "$PY"):$PATH NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
# KF_BENCH_BUILD_DIR: an existing build folder with the bench's targets (dev/gpu_tests.sh's
# build-gpu, say) is built in as configured, which saves compiling the libraries twice.
B=${KF_BENCH_BUILD_DIR:-build-gpu-learner-scale}
SEQS=${SEQS:-2}
DEPS=(); [ -d .deps/usr ] && DEPS=(-DKF_DEPS_PREFIX="$PWD/.deps/usr") && export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUTDIR/gpus.txt"
NGPU=$(nvidia-smi -L | wc -l)
echo "== configure + build (bench_learner_scale kf-learner)"
[ -n "${KF_BENCH_BUILD_DIR:-}" ] && [ -f "$B/build.ninja" ] || \
timeout 120 cmake -S . -B $B -G Ninja -DKF_PYTHON="$PY" -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
  -DKF_BUILD_TESTS=OFF -DKF_SKIP_COMPONENTS="evaluator;actors" "${DEPS[@]}" > "$OUTDIR/configure.log" 2>&1 \
  || { tail -30 "$OUTDIR/configure.log"; exit 1; }
timeout 400 cmake --build $B -j "$(nproc)" --target bench_learner_scale kf-learner > "$OUTDIR/build.log" 2>&1 \
  || { grep -m20 -B2 -A5 "error" "$OUTDIR/build.log"; exit 1; }
BENCH=$B/bench/learner_scale/bench_learner_scale
# MFU is against the card's measured dense bf16 peak (PEAK_TFLOPS overrides): the median of
# 20 timed 8192^3 bf16 matmuls after a warm-up, through torch.
if [ -z "${PEAK_TFLOPS:-}" ]; then
  PEAK=$("$PY" - <<'PYEOF' 2>"$OUTDIR/peak.log"
import torch, statistics
n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16); b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(10): a @ b
torch.cuda.synchronize()
ts = []
for _ in range(20):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); [a @ b for _ in range(10)]; e.record(); torch.cuda.synchronize()
    ts.append(s.elapsed_time(e) / 10 / 1e3)
print(f"{2 * n**3 / statistics.median(ts) / 1e12:.1f}")
PYEOF
)
  [ -n "$PEAK" ] || { echo "peak measurement failed:"; tail -5 "$OUTDIR/peak.log"; PEAK=989; }
  echo "== measured dense bf16 peak: $PEAK TFLOP/s (8192^3 matmul, median of 20)" | tee "$OUTDIR/peak.txt"
else
  PEAK=$PEAK_TFLOPS
fi
rows="$OUTDIR/rows.txt"; : > "$rows"
rc=0
run() {  # name, args...
  local name=$1; shift
  [ -z "${CASES:-}" ] || [[ $name == *beside* || " $CASES " == *" $name "* ]] || return 0
  echo "== $name: $*"
  timeout 300 $BENCH "$@" --peak-tflops "$PEAK" > "$OUTDIR/$name.txt" 2> "$OUTDIR/$name.log"
  local r=$?
  grep -v '^BENCH' "$OUTDIR/$name.txt"; grep '^BENCH' "$OUTDIR/$name.txt" >> "$rows"
  [ $r -eq 0 ] || { rc=1; echo "   failed ($r):"; tail -5 "$OUTDIR/$name.log"; }
}
S15=configs/shapes/qwen2.5-coder-1.5b.json
S7=configs/shapes/qwen2.5-coder-7b.json
L="--prompt 2048 --completion 4096 --seqs $SEQS --steps 3 --warmup 1"
# The bars first (1.5B full fine-tuning and 7B LoRA, each beside a bare forward+backward of
# its shape), then the variants: recomputation, dense log-probs, the sharded paths, rank 64.
run 1p5b_bare            --shape $S15 $L --bare
run 1p5b_full            --shape $S15 $L
run 7b_lora16_bare       --shape $S7 $L --lora-rank 16 --checkpointing --bare
run 7b_lora16            --shape $S7 $L --lora-rank 16 --checkpointing
run 1p5b_full_recompute  --shape $S15 $L --checkpointing
run 1p5b_full_dense      --shape $S15 $L --logprobs dense
run 7b_lora64            --shape $S7 $L --lora-rank 64 --checkpointing
run 1p5b_shard_bf16      --shape $S15 $L --shard --weights bf16
run 1p5b_shard_nccl      --shape $S15 $L --shard --comm nccl
run 1p5b_shardgrads_nccl --shape $S15 $L --shard-grads --comm nccl
run 1p5b_shardparams_nccl --shape $S15 $L --shard-params --weights bf16 --comm nccl
run 1p5b_shardparams_recompute_nccl --shape $S15 $L --shard-params --weights bf16 --checkpointing --comm nccl
run 1p5b_full_packed     --shape $S15 $L --pack --micro-seqs 2
run 7b_lora16_norecompute --shape $S7 $L --lora-rank 16
if [ -n "${LEARNER_GIB:-}" ]; then
  # Two holders take the card's free memory but LEARNER_GIB, half each, in their own CUDA
  # contexts (as two evaluator processes would), and keep it until killed.
  free_gib=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits -i 0 | awk '{print $1/1024}')
  hold=$(awk -v f="$free_gib" -v l="$LEARNER_GIB" 'BEGIN{h=(f-l)/2; print (h>0?h:0)}')
  echo "== beside two evaluators: $free_gib GiB free; two processes hold $hold GiB each; the learner gets the rest"
  holders=()
  for i in 1 2; do
    "$PY" -c "
import torch, time, sys
x = torch.empty(int($hold * 2**30), dtype=torch.uint8, device='cuda')
print('holding', x.numel() / 2**30, 'GiB', flush=True)
time.sleep(3600)" > "$OUTDIR/holder$i.log" 2>&1 &
    holders+=($!)
  done
  sleep 15
  nvidia-smi --query-gpu=memory.used,memory.free --format=csv | tee "$OUTDIR/beside_mem.txt"
  for k in ${RECOMPUTE_LAYERS:-8 12 16}; do
    run 7b_lora16_beside_recompute$k --shape $S7 $L --lora-rank 16 --checkpointing --recompute-layers "$k"
  done
  run 7b_lora16_beside_recompute_all --shape $S7 $L --lora-rank 16 --checkpointing
  run 7b_lora16_beside_bare --shape $S7 $L --lora-rank 16 --checkpointing --recompute-layers "${BARE_RECOMPUTE:-8}" --bare
  kill "${holders[@]}" 2>/dev/null; wait "${holders[@]}" 2>/dev/null
fi
if [ "$NGPU" -ge 2 ]; then
  echo "== 2 ranks over NCCL: learner.dist.shard none vs optimizer vs gradients vs params (kf-learner, synthetic, 3 steps)"
  for mode in none optimizer gradients params; do
    d="$OUTDIR/shard_$mode"; rm -rf "$d"; mkdir -p "$d"
    printf 'run:\n  name: shard-%s\n  root: %s\n  seed: 5\nlearner:\n  groups_per_step: 8\n  micro_batch_tokens: 96\n  optim:\n    lr: 1.0e-3\n  schedule:\n    warmup_steps: 0\n  snapshot:\n    every: 0\n  checkpoint:\n    every: 0\n  dist:\n    ranks: 2\n    comm: nccl\n    shard: %s\n' \
      "$mode" "$d" "$mode" > "$d/c.yaml"
    timeout 180 $B/learner/kf-learner "$d/c.yaml" --synthetic --device cuda:1 --rank 1 --steps 3 --run-dir "$d/run" > "$d/rank1.log" 2>&1 &
    timeout 180 $B/learner/kf-learner "$d/c.yaml" --synthetic --device cuda:0 --rank 0 --steps 3 --run-dir "$d/run" \
      --print-steps --dump-weights "$d/weights.safetensors" > "$d/rank0.log" 2>&1
    r0=$?; wait $!; r1=$?
    [ $r0 -eq 0 ] && [ $r1 -eq 0 ] || { rc=1; echo "   $mode failed (rank0 $r0, rank1 $r1)"; tail -5 "$d/rank0.log" "$d/rank1.log"; }
    c0=$(grep -o 'WEIGHTS_CHECKSUM [0-9a-f]*' "$d/rank0.log"); c1=$(grep -o 'WEIGHTS_CHECKSUM [0-9a-f]*' "$d/rank1.log")
    echo "   $mode: rank0 $c0, rank1 $c1; $(grep -o 'AdamW state [^;]*' "$d/rank0.log" | head -1)"
    [ -n "$c0" ] && [ "$c0" = "$c1" ] || { rc=1; echo "   $mode: ranks disagree"; }
  done
  for mode in optimizer gradients params; do
  "$PY" - "$OUTDIR/shard_none/weights.safetensors" "$OUTDIR/shard_$mode/weights.safetensors" "$mode" <<'PYEOF' || rc=1
import sys
from safetensors.torch import load_file
a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
assert a.keys() == b.keys(), "tensor names differ"
worst = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
bitwise = all(a[k].equal(b[k]) for k in a)
print(f"   shard {sys.argv[3]} vs none over NCCL: max |difference| {worst:.3g} (3 steps of lr 1e-3 move weights ~3e-3; bitwise: {bitwise})")
sys.exit(0 if worst < 2e-4 else 1)
PYEOF
  done
else
  echo "== one GPU: the 2-rank NCCL comparison needs 2 GPUs (skipped)"
fi
echo "rows: $rows"
# One archive of every log (a device call returns only a few files), beside rows and peak.
tar -czf "$OUTDIR/logs.tgz" -C "$OUTDIR" --exclude logs.tgz --exclude rows.txt --exclude peak.txt . 2>/dev/null &&
  find "$OUTDIR" -type f ! -name logs.tgz ! -name rows.txt ! -name peak.txt ! -name gpus.txt -delete
exit $rc

#!/usr/bin/env bash
# One device call (experiment choreography): the 1.5B engine rows (engine, group-at-a-time,
# HF generate() at 128) and the 1.5B learner step (fp32; bf16 + sharded optimizer; bare),
# MFU against the bf16 peak measured here. From a tree carrying .deps/ (TBB, seccomp.h).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-engine-learner-out}; mkdir -p "$OUT"
PY=/opt/torch/.venv/bin/python3; [ -x "$PY" ] || PY=$(command -v python3)
export PATH=/usr/local/cuda/bin:$(dirname "$PY"):$PATH PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
B=build-gpu; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
SECONDS=0
timeout 100 cmake -S . -B $B -G Ninja -DKF_PYTHON="$PY" -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
  -DKF_BUILD_TESTS=OFF -DKF_SKIP_COMPONENTS="evaluator;actors" -DKF_DEPS_PREFIX="$PWD/.deps/usr" > $OUT/configure.log 2>&1 || { tail -20 $OUT/configure.log; exit 1; }
timeout 200 cmake --build $B -j 16 --target bench_rollout_engine bench_learner_scale > $OUT/build.log 2>&1 || { grep -m20 -A5 error $OUT/build.log; exit 1; }
echo "== built in ${SECONDS}s"
S15=configs/shapes/qwen2.5-coder-1.5b.json
echo "== engine 1.5B"; timeout 120 $B/bench/rollout_engine/bench_rollout_engine --shape $S15 --device cuda --prompt 2048 --completion 1024 --concurrency 64,128,256 --baseline-groups 2 2>&1 | grep -v "^frame" | tail -40
echo "== ${SECONDS}s; HF 1.5B at 128"; timeout 110 "$PY" bench/rollout_engine/hf_generate_bench.py --shape $S15 --prompt 2048 --completion 1024 --concurrency 128 2>&1 | tail -8
PEAK=$("$PY" -c "
import torch, statistics
n=8192; a=torch.randn(n,n,device='cuda',dtype=torch.bfloat16); b=torch.randn(n,n,device='cuda',dtype=torch.bfloat16)
for _ in range(10): a@b
torch.cuda.synchronize(); ts=[]
for _ in range(20):
    s,e=torch.cuda.Event(enable_timing=True),torch.cuda.Event(enable_timing=True); s.record(); [a@b for _ in range(10)]; e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e)/10/1e3)
print(f'{2*n**3/statistics.median(ts)/1e12:.1f}')" 2>/dev/null); PEAK=${PEAK:-739.3}; echo "== measured bf16 peak $PEAK TFLOP/s"
L="--shape $S15 --prompt 2048 --completion 4096 --seqs 2 --steps 3 --warmup 1 --peak-tflops $PEAK"
for a in "" "--shard --weights bf16" "--bare"; do echo "== ${SECONDS}s; learner 1.5B $a"; timeout 70 $B/bench/learner_scale/bench_learner_scale $L $a 2>/dev/null | grep -v BENCH; done
echo "== done ${SECONDS}s"

#!/usr/bin/env bash
# The rollout engine against group-at-a-time decoding and HF generate() on one GPU, in one
# device call:  bench/rollout_engine/gpu_rollout_engine.sh   (logs and rows to $OUT or
# ./gpu-rollout-engine-out)
# 1. builds bench_rollout_engine only (own build folder, tests off, kf_policy and its deps);
# 2. Qwen2.5-Coder-1.5B and -7B shapes (random init, bf16), prompt 2048, at 64/128/256
#    concurrent sequences: the engine (all groups of 8 submitted at once) and HF generate()
#    on the same batch; group-at-a-time timed on BASE_GROUPS groups.
# Completion lengths are chosen so that the runs (build excluded) finish in < 500 s on one
# H200: C15 (default 1024) tokens for the 1.5B shape, C7 (default 512) for the 7B; plus one
# engine-only run of the 1.5B shape at 128 sequences to the full 4096 (LONG=0 skips it).
# Each run has a time limit (100+140+100+100+60 = 500 s), so a slow one cannot overrun.
# Memory: the 7B shape at 256 sequences needs about 100 GB (KV pool, the engine's working
# copy, weights): an H200. On an 80 GB card set CONC7=64,128.
# The build (first call only; the build folder is reused) can take minutes: BUILD_ONLY=1
# stops after it, so the timed runs get a device call of their own.
# Env: C15, C7, CONC7 (64,128,256), LONG, BASE_GROUPS (2), BUILD_ONLY, KF_PYTHON.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUTDIR=${OUT:-$PWD/gpu-rollout-engine-out}; mkdir -p "$OUTDIR"
PY=${KF_PYTHON:-/opt/torch/.venv/bin/python3}; [ -x "$PY" ] || PY=$(command -v python3)
export PATH=/usr/local/cuda/bin:$(dirname "$PY"):$PATH PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error
B=build-gpu-rollout-engine
C15=${C15:-1024}; C7=${C7:-512}; CONC7=${CONC7:-64,128,256}; LONG=${LONG:-1}; BG=${BASE_GROUPS:-2}
DEPS=(); [ -d .deps/usr ] && DEPS=(-DKF_DEPS_PREFIX="$PWD/.deps/usr") && export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUTDIR/gpus.txt"
echo "== configure + build (bench_rollout_engine)"
timeout 120 cmake -S . -B $B -G Ninja -DKF_PYTHON="$PY" -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
  -DKF_BUILD_TESTS=OFF -DKF_SKIP_COMPONENTS="evaluator;actors" "${DEPS[@]}" > "$OUTDIR/configure.log" 2>&1 \
  || { tail -30 "$OUTDIR/configure.log"; exit 1; }
timeout 400 cmake --build $B -j "$(nproc)" --target bench_rollout_engine > "$OUTDIR/build.log" 2>&1 \
  || { grep -m20 -B2 -A5 "error" "$OUTDIR/build.log"; exit 1; }
BENCH=$B/bench/rollout_engine/bench_rollout_engine
[ "${BUILD_ONLY:-0}" = 1 ] && { echo "== built $BENCH"; exit 0; }
rows="$OUTDIR/rows.txt"; : > "$rows"
rc=0
T0=$(date +%s)
run() {  # name, limit seconds, command...
  local name=$1 limit=$2; shift 2
  echo "== $name: $*"
  timeout "$limit" "$@" > "$OUTDIR/$name.txt" 2> "$OUTDIR/$name.log"
  local r=$?
  grep -v '^BENCH' "$OUTDIR/$name.txt"; grep '^BENCH' "$OUTDIR/$name.txt" >> "$rows"
  [ $r -eq 0 ] || { rc=1; echo "   failed ($r):"; tail -5 "$OUTDIR/$name.log"; }
}
S15=configs/shapes/qwen2.5-coder-1.5b.json
S7=configs/shapes/qwen2.5-coder-7b.json
run engine_1p5b 100 $BENCH --shape $S15 --device cuda --prompt 2048 --completion "$C15" --concurrency 64,128,256 --baseline-groups "$BG"
run hf_1p5b     140 "$PY" bench/rollout_engine/hf_generate_bench.py --shape $S15 --prompt 2048 --completion "$C15" --concurrency 64,128,256
run engine_7b   100 $BENCH --shape $S7 --device cuda --prompt 2048 --completion "$C7" --concurrency "$CONC7" --baseline-groups "$BG"
run hf_7b       100 "$PY" bench/rollout_engine/hf_generate_bench.py --shape $S7 --prompt 2048 --completion "$C7" --concurrency "$CONC7"
if [ "$LONG" = 1 ]; then
  run engine_1p5b_4k 60 $BENCH --shape $S15 --device cuda --prompt 2048 --completion 4096 --concurrency 128 --no-baseline --name qwen2.5-coder-1.5b-4k
fi
echo "== runs took $(( $(date +%s) - T0 )) s"
echo "== speedups at equal completion length (tokens/s ratios)"
"$PY" - "$rows" <<'PYEOF'
import sys, collections
v = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    _, _, case, metric, value, _ = line.strip().split("|")
    v[case][metric] = float(value)
for shape in ("qwen2.5-coder-1.5b", "qwen2.5-coder-7b"):
    g = v.get(f"{shape}_group", {}).get("tokens_per_s")
    for n in (64, 128, 256):
        e = v.get(f"{shape}_c{n}_engine", {}).get("tokens_per_s")
        h = v.get(f"{shape}_c{n}_hf", {}).get("tokens_per_s")
        if e:
            print(f"  {shape} {n:4d} seqs: engine {e:9.0f} tok/s"
                  + (f", {e / g:5.1f}x group-at-a-time ({g:.0f})" if g else "")
                  + (f", {e / h:5.1f}x HF generate() ({h:.0f})" if h else ""))
PYEOF
exit $rc

#!/usr/bin/env bash
# On the GPU machine (one `device` call): verify the CUDA half of the corpus, train the
# default policy (stage 1) on the GPU, and check what it writes with one self-supervised
# round on CUDA tasks.
#   stages/gpu_train.sh [SFT_SECONDS] [SFT2_SECONDS]
# Phases (each bounded, so the call's outputs always come back):
#   1. build the tools (build-gpu/) while the suite is imported for cpu,cuda;
#   2. at the same time: corpus/verify.py --backend cuda (measured speedups, so CUDA
#      prompts get exemplars) and tools/sft from scratch for SFT_SECONDS (default 200);
#      the SFT shares the GPU with the timed trials, so those speedups are coarse;
#   3. tools/sft --init (phase 2's policy) for SFT2_SECONDS (default 60) on the examples
#      rebuilt with the measured CUDA exemplars;
#   4. tools/selfsup --backend cuda, 1 round, 8 tasks x 4 samples: extraction/correct rates.
# Everything goes to $OUT: policy/ (the trained folder), verified_cuda.json, logs.
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${OUT:-$PWD/gpu-train-out}; mkdir -p "$OUTDIR"
PY=${KF_PYTHON:-$(command -v python3)}
T1=${1:-200}; T2=${2:-60}
export PATH=/usr/local/cuda/bin:$PATH
BUILD=build-gpu
DEPS=(); [ -d .deps/usr ] && DEPS=(-DKF_DEPS_PREFIX="$PWD/.deps/usr") && export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUTDIR/gpu.txt" || exit 2
stamp() { echo "== $(date +%T) $*"; }
SECONDS=0

stamp "configure + build, import in parallel"
"$PY" tasks/importer/kf_import.py tasks/suite --out $BUILD/tasks --backends cpu,cuda > "$OUTDIR/import.log" 2>&1 &
imp=$!
cmake -S . -B $BUILD -G Ninja -DKF_PYTHON="$PY" -DCMAKE_CUDA_ARCHITECTURES=90 "${DEPS[@]}" > "$OUTDIR/configure.log" 2>&1 || { tail -30 "$OUTDIR/configure.log"; exit 1; }
cmake --build $BUILD -j "$(nproc)" --target kf-eval kf-sandbox-worker kf-sft kf-selfsup > "$OUTDIR/build.log" 2>&1 || { grep -m20 -A5 "error" "$OUTDIR/build.log"; exit 1; }
wait $imp || { tail -20 "$OUTDIR/import.log"; exit 1; }
tail -1 "$OUTDIR/import.log"
stamp "build + import done after ${SECONDS} s"

stamp "verify the CUDA corpus (background) + SFT phase 1 (${T1} s)"
KF_BUILD_DIR="$PWD/$BUILD" KF_TASKS_DIR="$PWD/$BUILD/tasks" PYTHONUNBUFFERED=1 timeout $((T1 + 20)) \
  "$PY" corpus/verify.py --backend cuda --jobs 8 \
  --note "tools/eval on $(tail -1 "$OUTDIR/gpu.txt"), 8 at once, while tools/sft trained on the same GPU" \
  > "$OUTDIR/verify_cuda.txt" 2>&1 &
ver=$!
SFT=(--corpus corpus --tasks $BUILD/tasks --vocab 4096 --batch 8 --lr 1.5e-3 --seed 0 --device cuda --threads 4)
KF_BUILD_DIR=$BUILD tools/sft "${SFT[@]}" --out "$OUTDIR/sft1" --shape small --steps 100000 --warmup 30 \
  --time-limit "$T1" > "$OUTDIR/sft1.txt" 2>&1 || { tail -20 "$OUTDIR/sft1.txt"; exit 1; }
grep -E "examples|wrote" "$OUTDIR/sft1.txt" | tail -3
wait $ver; echo "verify exit $?"
cp corpus/verified_cuda.json "$OUTDIR/verified_cuda.json"
"$PY" - "$OUTDIR/verified_cuda.json" <<'EOF'
import collections, json, sys
d = json.load(open(sys.argv[1])); c = collections.Counter(v["verdict"] for k, v in d.items() if k != "header")
print("verified_cuda.json verdicts:", dict(c))
EOF
stamp "SFT phase 2 (${T2} s, --init, with the CUDA exemplars)"
KF_BUILD_DIR=$BUILD tools/sft "${SFT[@]}" --out "$OUTDIR/policy" --init "$OUTDIR/sft1" --steps 100000 --warmup 5 \
  --lr 5e-4 --time-limit "$T2" > "$OUTDIR/sft2.txt" 2>&1 || { tail -20 "$OUTDIR/sft2.txt"; exit 1; }
grep -E "examples|wrote" "$OUTDIR/sft2.txt" | tail -3
rm -f "$OUTDIR/sft1/model.safetensors"  # phase 1 weights: only its logs come back

stamp "self-supervised check round on CUDA (after ${SECONDS} s)"
KF_BUILD_DIR=$BUILD timeout 150 tools/selfsup --model "$OUTDIR/policy" --corpus corpus --out "$OUTDIR/selfsup" \
  --tasks $BUILD/tasks --backend cuda --device cuda --rounds 1 --samples 4 --max-tasks 8 --max-new-tokens 1536 \
  --steps 10 --batch 4 --seed 0 > "$OUTDIR/selfsup.txt" 2>&1
echo "selfsup exit $?"; cat "$OUTDIR/selfsup/selfsup.jsonl" 2>/dev/null
rm -f "$OUTDIR/selfsup/model.safetensors"
stamp "done after ${SECONDS} s"

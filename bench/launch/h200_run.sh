#!/usr/bin/env bash
# On the GPU machine (one `device` call): the issue-8 acceptance run of configs/h200.yaml.
#   bench/launch/h200_run.sh [MINUTES] [extra tools/launch args, e.g. --set k=v]
# Builds the tree (build-gpu/) while the suite is imported for cpu,cuda, runs the GPU
# tests of the shared-GPU lock, then `tools/launch configs/h200.yaml` for MINUTES
# (default 5.2; launch.max_minutes, then drain + final checkpoint), with stdout not a
# terminal (so the status comes as `status:` log lines) plus one `script` capture of the
# terminal status. Copies the run folder without its checkpoint weights to $OUT/run
# (tools/report runs on it afterwards, here or on the CPU machine).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUTDIR=${OUT:-$PWD/h200-run-out}; mkdir -p "$OUTDIR"
PY=${KF_PYTHON:-$(command -v python3)}
MIN=${1:-5.2}; shift || true
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
BUILD=build-gpu
DEPS=(); [ -d .deps/usr ] && DEPS=(-DKF_DEPS_PREFIX="$PWD/.deps/usr") && export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUTDIR/gpu.txt" || exit 2
stamp() { echo "== $(date +%T) $*"; }
SECONDS=0
stamp "configure + build, import in parallel"
if [ ! -f $BUILD/tasks/001_relu/task.json ] || ! grep -q '"cuda"' $BUILD/tasks/001_relu/task.json; then
  "$PY" tasks/importer/kf_import.py tasks/suite --out $BUILD/tasks --backends cpu,cuda > "$OUTDIR/import.log" 2>&1 &
fi
imp=$!
cmake -S . -B $BUILD -G Ninja -DKF_PYTHON="$PY" -DCMAKE_CUDA_ARCHITECTURES=90 "${DEPS[@]}" > "$OUTDIR/configure.log" 2>&1 || { tail -30 "$OUTDIR/configure.log"; exit 1; }
cmake --build $BUILD -j "$(nproc)" --target kf-launch kf-actor kf-learner kf-evaluator kf-sandbox-worker kf-export actors_serial_test \
  > "$OUTDIR/build.log" 2>&1 || { grep -m20 -A5 "error" "$OUTDIR/build.log"; exit 1; }
wait $imp 2>/dev/null
stamp "built after ${SECONDS} s"
$BUILD/tests/actors/actors_serial_test --gtest_filter='GpuShare*' 2>&1 | tail -8 | tee "$OUTDIR/gpu_share_test.txt"
NAME=h200-accept
stamp "tools/launch configs/h200.yaml for $MIN min"
KF_BUILD_DIR=$BUILD tools/launch configs/h200.yaml --name $NAME --set tasks.dir=$BUILD/tasks \
  --set launch.max_minutes="$MIN" "$@" > "$OUTDIR/launch.txt" 2>&1
echo "launch exit $?"
stamp "run ended after ${SECONDS} s"
grep -E "status:|launch:" "$OUTDIR/launch.txt" | tail -40
RUN=$(ls -d runs/$NAME* | tail -1)
mkdir -p "$OUTDIR/run"
tar -C "$RUN" --exclude=./checkpoints -cf - . | tar -xf - -C "$OUTDIR/run"
ls -la "$RUN/checkpoints" > "$OUTDIR/run/checkpoints.txt" 2>&1
cp "$RUN"/checkpoints/launch_state.json "$OUTDIR/run/" 2>/dev/null
tail -1 "$RUN/metrics/run.jsonl"
stamp "done after ${SECONDS} s"

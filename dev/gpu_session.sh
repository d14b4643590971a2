# Sourced by the one-call GPU scripts (dev/gpu_train.sh, dev/h200_evidence.sh, dev/h200_run.sh): the
# environment of the GPU machine and the common start of a call.
#   gpu_session_start LOGDIR   CUDA on PATH, carried .deps used, GPU named in $GPU (and
#                              their number in $GPU_COUNT), logs in
#                              LOGDIR (created empty), a timer and `stamp`; configures
#                              build-gpu/ ($BUILD) and starts the suite import (cpu,cuda)
#                              in the background (wait for it with gpu_import_wait).
#   gpu_build TARGET...        builds targets into $BUILD (log: LOGDIR/build.log)
#   gpu_pack_run RUN_DIR       a tar of the run folder on stdout, checkpoint weights left out
#                              (their listing and launch_state.json kept), named <run>/...
# Needs $PY (python with torch) set by the caller; exits the script on failure.
gpu_session_start() {
  LOGDIR=$1
  rm -rf "$LOGDIR"; mkdir -p "$LOGDIR"
  # NVLink multicast off (device README: it can take a shared host's GPUs out of service)
  export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  BUILD=build-gpu
  DEPS=()
  if [ -d .deps/usr ]; then  # Debian TBB/seccomp trees carried to a machine without them
    DEPS=(-DKF_DEPS_PREFIX="$PWD/.deps/usr")
    export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
  fi
  GPU=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)
  GPU_COUNT=$(nvidia-smi -L | grep -c '^GPU ')
  [ -n "$GPU" ] && [ "$GPU_COUNT" -gt 0 ] || { echo "no GPU visible" >&2; exit 2; }
  [ "$GPU_COUNT" -gt 1 ] && GPU="$GPU, x$GPU_COUNT"
  echo "$GPU" > "$LOGDIR/gpu.txt"
  SECONDS=0
  stamp "$GPU: configure; import the suite (cpu,cuda) in parallel"
  "$PY" tasks/importer/kf_import.py tasks/suite --out $BUILD/tasks --backends cpu,cuda > "$LOGDIR/import.log" 2>&1 &
  GPU_IMPORT_PID=$!
  cmake -S . -B $BUILD -G Ninja -DKF_PYTHON="$PY" -DCMAKE_CUDA_ARCHITECTURES=90 "${DEPS[@]}" > "$LOGDIR/configure.log" 2>&1 ||
    { tail -30 "$LOGDIR/configure.log"; exit 1; }
}
stamp() { echo "== $(date +%T) $*"; }
gpu_build() {
  cmake --build $BUILD -j "$(nproc)" --target "$@" >> "$LOGDIR/build.log" 2>&1 ||
    { grep -m20 -A5 "error" "$LOGDIR/build.log"; exit 1; }
}
gpu_import_wait() {
  [ -n "${GPU_IMPORT_PID:-}" ] || return 0
  wait "$GPU_IMPORT_PID" || { tail -20 "$LOGDIR/import.log"; exit 1; }
  GPU_IMPORT_PID=
}
gpu_pack_run() {
  local dir=${1%/}
  ls -laR "$dir/checkpoints" > "$dir/checkpoints.txt" 2>&1
  cp "$dir/checkpoints/launch_state.json" "$dir/" 2>/dev/null
  tar -C "$(dirname "$dir")" --exclude="$(basename "$dir")/checkpoints" -cf - "$(basename "$dir")"
}

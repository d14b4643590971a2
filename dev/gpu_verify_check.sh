#!/usr/bin/env bash
# The verifier's GPU half, in `device` calls (experiment choreography, not a product tool).
#   dev/gpu_verify_check.sh tests   build this tree's evaluator tests; run the sandbox and
#                                   compile tests and the CUDA corpus (every cheat kernel)
#   dev/gpu_verify_check.sh all     tests, then cost (one device call)
#   dev/gpu_verify_check.sh cost    build this tree and the base tree in .base/ (a `git archive`
#                                   of the commit to compare with, carried), import the cost
#                                   tasks into each, then run kf-eval of both builds on the same
#                                   kernels, alternating, and print the median verify time of each
# Carry [".deps", ".base"] (TBB and seccomp.h for the GPU machine; the base tree).
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${OUT:-$PWD/gpu-out}; mkdir -p "$OUTDIR"
PY=${KF_PYTHON:-$(command -v python3)}
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
DEPS=()
if [ -d .deps/usr ]; then
  DEPS=(-DKF_DEPS_PREFIX="$PWD/.deps/usr")
  export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi
SECONDS=0
stamp() { echo "== ${SECONDS}s $*"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUTDIR/gpu.txt"
# build SRC BUILD TARGET...
build() {
  local src=$1 b=$2 tag; tag=$(basename "$2"); shift 2
  cmake -S "$src" -B "$b" -G Ninja -DKF_PYTHON="$PY" -DCMAKE_CUDA_ARCHITECTURES=90 -DKF_BUILD_BENCH=OFF "${DEPS[@]}" \
    > "$OUTDIR/configure-$tag.log" 2>&1 || { tail -20 "$OUTDIR/configure-$tag.log"; return 1; }
  cmake --build "$b" -j "${J:-$(nproc)}" --target "$@" > "$OUTDIR/build-$tag.log" 2>&1 ||
    { grep -m20 -B2 -A5 "error" "$OUTDIR/build-$tag.log"; return 1; }
}
import() {  # import SRC BUILD TASK...
  local src=$1 b=$2; shift 2
  mkdir -p "$b/tasks"
  for t in "$@"; do
    f=$(ls "$src"/tasks/suite/level*/"$t".py | head -1)
    "$PY" "$src/tasks/importer/kf_import.py" "$f" --out "$b/tasks" --backends cpu,cuda >> "$OUTDIR/import-$(basename "$b").log" 2>&1 ||
      tail -3 "$OUTDIR/import-$(basename "$b").log"
  done
}

mode=${1:-}
if [ "$mode" = all ]; then
  # tests, then cost; the base tree builds meanwhile (the tests that time CPU work run after it)
  [ -d .base ] || { echo "no .base/ tree (carry it)"; exit 2; }
  J=6 build .base build-base kf-eval kf-sandbox-worker > "$OUTDIR/b2.txt" 2>&1 &
  pb=$!
  "$0" tests-only-build || exit 1
  wait $pb || { cat "$OUTDIR/b2.txt"; exit 1; }
  "$0" tests; rt=$?
  "$0" cost; rc=$?
  exit $(( rt || rc ))
fi
case "$mode" in
tests-only-build)
  build . build-gpu evaluator_core_test evaluator_test kf-eval kf-sandbox-worker
  ;;
tests)
  tasks=$("$PY" -c "import json;print(' '.join(sorted({k['task'] for k in json.load(open('tests/evaluator/kernels/corpus.json'))['kernels']})))")
  import . build-gpu $tasks &
  ip=$!
  build . build-gpu evaluator_core_test evaluator_test kf-eval kf-sandbox-worker || exit 1
  stamp built
  wait $ip
  stamp imported
  export KF_BUILD_DIR=$PWD/build-gpu KF_SOURCE_DIR=$PWD KF_PYTHON="$PY"
  timeout 200 build-gpu/tests/evaluator/evaluator_core_test --gtest_filter="${KF_CORE_FILTER:-Sandbox*:Compile*}" > "$OUTDIR/core_test.log" 2>&1; rc1=$?
  grep -E "FAILED|PASSED|ms of CPU|call [0-9]|Failure|Which is" "$OUTDIR/core_test.log" | head -60
  stamp "core tests rc $rc1"
  timeout "${KF_TEST_TIMEOUT:-300}" build-gpu/tests/evaluator/evaluator_test --gtest_filter="${KF_EVAL_FILTER:-*cuda*:*Cuda*}" > "$OUTDIR/evaluator_test.log" 2>&1; rc2=$?
  grep -E "^(cpu|cuda)/|FAILED|PASSED|Failure|verdict|reason" "$OUTDIR/evaluator_test.log" | head -80
  stamp "evaluator tests rc $rc2"
  exit $(( rc1 || rc2 ))
  ;;
cost)
  [ -d .base ] || { echo "no .base/ tree (carry it)"; exit 2; }
  J=8 build . build-gpu kf-eval kf-sandbox-worker > "$OUTDIR/b1.txt" 2>&1 &
  p1=$!
  J=8 build .base build-base kf-eval kf-sandbox-worker > "$OUTDIR/b2.txt" 2>&1 &
  p2=$!
  TASKS="001_relu 002_gelu 021_softmax 030_matmul_square"
  wait $p1 || { cat "$OUTDIR/b1.txt"; exit 1; }
  wait $p2 || { cat "$OUTDIR/b2.txt"; exit 1; }
  stamp built
  import . build-gpu $TASKS & import .base build-base $TASKS & wait
  stamp imported
  ROUNDS=${ROUNDS:-3}
  : > "$OUTDIR/cost.jsonl"
  for r in $(seq 1 "$ROUNDS"); do
    for t in $TASKS; do
      k=tests/evaluator/kernels/cuda/good_${t#*_}.cu
      [ "$t" = 030_matmul_square ] && k=tests/evaluator/kernels/cuda/good_matmul_cublas.cu
      for side in base new; do
        b=build-gpu; [ $side = base ] && b=build-base
        # a fresh compile cache per run: the compile is not what is compared
        j=$(KF_TASKS_DIR=$b/tasks timeout 120 $b/evaluator/kf-eval "$t" "$k" --json --seed $r --cache "/tmp/kfc-$side-$r-$t" 2>>"$OUTDIR/eval-$side.log")
        echo "$j" | "$PY" -c "import json,sys;d=json.loads(sys.stdin.read());print(json.dumps({'side':'$side','task':'$t','round':$r,'verdict':d['verdict'],'verify_s':d['verify_s'],'speedup':d.get('speedup'),'reason':d.get('reason','')[:200]}))" >> "$OUTDIR/cost.jsonl" 2>>"$OUTDIR/eval-$side.log" ||
          echo "{\"side\":\"$side\",\"task\":\"$t\",\"round\":$r,\"verdict\":\"parse_error\"}" >> "$OUTDIR/cost.jsonl"
      done
    done
  done
  stamp measured
  "$PY" - "$OUTDIR/cost.jsonl" <<'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| task | base verify s (median) | new verify s (median) | new/base | base verdicts | new verdicts | new speedup |")
print("|---|---|---|---|---|---|---|")
allb, alln = [], []
for t in sorted({r['task'] for r in rows}):
    b = [r['verify_s'] for r in rows if r['task'] == t and r['side'] == 'base' and 'verify_s' in r]
    n = [r['verify_s'] for r in rows if r['task'] == t and r['side'] == 'new' and 'verify_s' in r]
    vb = ",".join(r['verdict'] for r in rows if r['task'] == t and r['side'] == 'base')
    vn = ",".join(r['verdict'] for r in rows if r['task'] == t and r['side'] == 'new')
    sp = ",".join("%.3f" % r['speedup'] for r in rows if r['task'] == t and r['side'] == 'new' and r.get('speedup'))
    allb += b; alln += n
    if b and n:
        print(f"| {t} | {statistics.median(b):.2f} | {statistics.median(n):.2f} | {statistics.median(n)/statistics.median(b):.3f} | {vb} | {vn} | {sp} |")
if allb and alln:
    print(f"| all | {statistics.median(allb):.2f} | {statistics.median(alln):.2f} | {statistics.median(alln)/statistics.median(allb):.3f} | | | |")
for r in rows:
    if r['verdict'] != 'ok': print("not ok:", r)
PYEOF
  ;;
*) echo "usage: dev/gpu_verify_check.sh tests|cost"; exit 2 ;;
esac

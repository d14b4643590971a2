#!/usr/bin/env bash
# GPU memory of one verification, per task, against its claim (GpuMemoryBudget,
# verify_gpu_bytes): on the GPU machine, after bench/evaluator/gpu_eval_check.sh has built
# $B (default build-gpu-eval) with kf-eval and the worker.
#   bench/evaluator/peak_memory.sh            the focus tasks of issue 9's H200 runs
# Per task, one corpus kernel (the ok path) and, on the tasks with one float input and one
# float output of the same size, bench/evaluator/kernels/wrong_half_map.cu (the failure
# path, which runs the candidate and the reference again with the failing call's tensors
# alive). Prints a table of verdict, claim, peak (allocator peak plus the sandbox's device
# arena; Result::gpu_peak_gb) and seconds; exits 1 when a peak exceeds its claim.
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${B:-build-gpu-eval}
PY=${KF_PYTHON:-$(command -v python3)}
TASKS=${KF_PEAK_TASKS:-"level1/003_gelu_tanh level1/004_sigmoid level1/010_log1p_abs level1/011_silu level1/016_max_dim level1/028_instancenorm level1/033_matvec level2/116_hardswish_clamp_mul"}
WRONG_ON=" 003_gelu_tanh 004_sigmoid 010_log1p_abs 011_silu "  # one float in, one float out, same size
mkdir -p $B/tasks
for t in $TASKS; do
  [ -d $B/tasks/${t#*/} ] || "$PY" tasks/importer/kf_import.py tasks/suite/$t.py --out $B/tasks --backends cpu,cuda > /dev/null 2>&1 ||
    echo "import of $t failed"
done
status=0
printf '| task | kernel | verdict | claim GiB | peak GiB | verify s |\n|---|---|---|---|---|---|\n'
for t in $TASKS; do
  name=${t#*/}
  kernels=("$(ls corpus/kernels/cuda/$name/*.cu | tail -1)")
  [[ "$WRONG_ON" == *" $name "* ]] && kernels+=(bench/evaluator/kernels/wrong_half_map.cu)
  for k in "${kernels[@]}"; do
    json=$($B/evaluator/kf-eval "$name" "$k" --tasks $B/tasks --backend cuda --json 2>/dev/null)
    line=$(printf '%s' "$json" | "$PY" -c '
import json, sys
try:
    r = json.load(sys.stdin)
except Exception as e:
    print("no report (%s)" % e); sys.exit(2)
print("%s | %.2f | %.2f | %.1f" % (r["verdict"], r["gpu_claim_gb"], r["gpu_peak_gb"], r["verify_s"]))
sys.exit(1 if r["gpu_claim_gb"] > 0 and r["gpu_peak_gb"] > r["gpu_claim_gb"] else 0)')
    rc=$?
    [ $rc -ne 0 ] && status=1
    printf '| %s | %s | %s |\n' "$name" "$(basename "$k")" "$line"
  done
done
exit $status

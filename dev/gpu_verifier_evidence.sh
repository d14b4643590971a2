#!/usr/bin/env bash
# On the GPU machine, in one `device` call: the verifier's GPU evidence, as far as a deadline
# allows. Builds kf-eval and the sandbox worker once (KF_BUILD, default /tmp/kfb: outside
# the carried paths, so a second call on the warm machine reuses it), then, each stage
# writing its table into $OUT as it goes:
#   corpus     every CUDA kernel of tests/evaluator/kernels/corpus.json through kf-eval with
#              its default settings (as an attacker would run it): verdict and reason against
#              the corpus's expectation -> corpus_cuda.md, corpus_cuda.jsonl
#   corpus_pp  the same with --private-proc-cuda (CUDA workers with a private /proc and a
#              user of their own) -> corpus_cuda_pp.md: whether that can be the CUDA default
#   modelnew   the CUDA ModelNew candidates of tests/evaluator/modelnew/cuda/ through tools/eval,
#              with the confined load_inline compile time cold and cached -> modelnew_cuda.md
#   cudal1     CUDA-L1's published H100 kernels (KF_KB/h100.json.gz) through
#              tools/verify-kernelbench --backend cuda on the imported KernelBench levels
#              (KF_LEVELS, default 1), KF_JOBS at once, until the deadline -> cudal1/
#   dev/gpu_verifier_evidence.sh [STAGE...]          (default: corpus modelnew corpus_pp cudal1)
# Carry [".deps", ".kb"]: the Debian TBB/seccomp trees, and .kb/ holding KernelBench/level{1,2,3}
# (ScalingIntelligence/KernelBench) and h100.json.gz (CUDA-L1's optimized_cuda_code/h100.json).
# KF_REUSE_BUILD=1: skip the build when $BUILD already holds kf-eval (a second call).
# KF_DEADLINE_S (default 270): no new work starts after this many seconds of the call; work
# under way is given KF_DEADLINE_S + 20 s at most. A missing GPU exits 2 before any build.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUTDIR=${OUT:-$PWD/gpu-evidence-out}; mkdir -p "$OUTDIR"
PY=${KF_PYTHON:-$(command -v python3)}
BUILD=${KF_BUILD:-/tmp/kfb}
KB=${KF_KB:-$ROOT/.kb}
DEADLINE=${KF_DEADLINE_S:-270}
JOBS=${KF_JOBS:-8}
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
DEPS=()
if [ -d .deps/usr ]; then
  DEPS=(-DKF_DEPS_PREFIX="$PWD/.deps/usr")
  export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi
SECONDS=0
stamp() { echo "== ${SECONDS}s $*" | tee -a "$OUTDIR/log.txt"; }
left() { echo $((DEADLINE - SECONDS)); }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUTDIR/gpu.txt" 2>&1 ||
  { echo "gpu_verifier_evidence.sh: no GPU visible; nothing run" >&2; exit 2; }
GPU=$(head -1 "$OUTDIR/gpu.txt")
stamp "$GPU"
STAGES=("$@"); [ ${#STAGES[@]} -eq 0 ] && STAGES=(corpus modelnew corpus_pp cudal1)
want() { local s; for s in "${STAGES[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

# --- tasks, imported while the build runs
mkdir -p "$BUILD"
corpus_tasks=$("$PY" -c "import json;print(' '.join(sorted({k['task'] for k in json.load(open('tests/evaluator/kernels/corpus.json'))['kernels'] if k['file'].startswith('cuda/')})))")
suite_files=""
for t in $corpus_tasks; do suite_files="$suite_files $(ls tasks/suite/level*/"$t".py | head -1)"; done
suite_pid=
if [ ! -f "$BUILD/tasks/.imported" ]; then
  ( "$PY" tasks/importer/kf_import.py $suite_files --out "$BUILD/tasks" --backends cpu,cuda > "$OUTDIR/import_suite.log" 2>&1 &&
    touch "$BUILD/tasks/.imported" ) &
  suite_pid=$!
fi
kb_pid=
if want cudal1; then
  levels=${KF_LEVELS:-1}
  dirs=""; for l in ${levels//,/ }; do dirs="$dirs $KB/KernelBench/level$l"; done
  if [ ! -f "$BUILD/kb-tasks/.imported-$levels" ]; then
    ( "$PY" tasks/importer/kf_import.py $dirs --out "$BUILD/kb-tasks" --backends cuda --mode eval --jobs 8 > "$OUTDIR/import_kb.log" 2>&1;
      touch "$BUILD/kb-tasks/.imported-$levels" ) &
    kb_pid=$!
  fi
fi

# --- build
stamp "configure + build kf-eval, kf-sandbox-worker in $BUILD"
if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DKF_PYTHON="$PY" -DCMAKE_CUDA_ARCHITECTURES=90 -DKF_BUILD_BENCH=OFF "${DEPS[@]}" \
    > "$OUTDIR/configure.log" 2>&1 || { tail -30 "$OUTDIR/configure.log"; exit 1; }
fi
# KF_REUSE_BUILD=1 keeps the binaries of an earlier call on the warm machine (a later call's
# tree may differ from the one measured)
if [ "${KF_REUSE_BUILD:-0}" = 1 ] && [ -x "$BUILD/evaluator/kf-eval" ]; then
  stamp "reusing the build in $BUILD"
else
  cmake --build "$BUILD" -j "$(nproc)" --target kf-eval kf-sandbox-worker > "$OUTDIR/build.log" 2>&1 ||
    { grep -m20 -B2 -A5 "error" "$OUTDIR/build.log"; exit 1; }
fi
[ -z "$suite_pid" ] || wait "$suite_pid" || { echo "suite import failed:"; tail -20 "$OUTDIR/import_suite.log"; }
stamp "built; suite tasks imported ($corpus_tasks)"
export KF_BUILD_DIR=$BUILD KF_TASKS_DIR=$BUILD/tasks

# --- corpus: every CUDA kernel, default settings, JOBS at once (the GPU timing lock keeps
# each timed trial alone on the device)
corpus_stage() {  # corpus_stage NAME [kf-eval flag ...]
  local name=$1; shift
  stamp "$name: CUDA kernels of tests/evaluator/kernels/corpus.json $*"
  "$PY" - "$BUILD" "$OUTDIR" "$JOBS" "$(( $(left) + 20 ))" "$name" "$@" <<'PYEOF'
import concurrent.futures, json, subprocess, sys, time
build, out, jobs, budget, name = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
extra = sys.argv[6:]
t_end = time.time() + budget
ks = [k for k in json.load(open("tests/evaluator/kernels/corpus.json"))["kernels"] if k["file"].startswith("cuda/")]
def one(k):
    left = t_end - time.time()
    if left < 10:
        return dict(k, verdict="not_run", reason="deadline")
    cmd = [build + "/evaluator/kf-eval", k["task"], "tests/evaluator/kernels/" + k["file"], "--json", "--backend", "cuda"] + extra
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=left)
    except subprocess.TimeoutExpired:
        return dict(k, verdict="not_run", reason="deadline during the run")
    try:
        j = json.loads(p.stdout)
    except ValueError:
        return dict(k, verdict="evaluator_error", reason="exit %d: %s" % (p.returncode, (p.stderr.strip().splitlines() or [""])[-1][:300]))
    return dict(k, verdict=j.get("verdict"), reason=(j.get("reason") or "")[:400], speedup=j.get("speedup"),
                verify_s=j.get("verify_s"), seconds=round(time.time() - t0, 1))
with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
    rows = list(pool.map(one, ks))
good = 0
lines = ["| kernel | task | expected | verdict | reason | verify s | as expected |", "|---|---|---|---|---|---:|---|"]
with open(out + "/" + name + ".jsonl", "w") as f:
    for r in rows:
        e = r["expect"]
        named = not e.get("reason") or any(s in r["reason"] for s in e["reason"])
        r["as_expected"] = r["verdict"] == e["verdict"] and named
        good += r["as_expected"]
        f.write(json.dumps(r) + "\n")
        lines.append("| %s | %s | %s | %s | %s | %s | %s |" % (r["file"], r["task"], e["verdict"], r["verdict"],
                     r["reason"].replace("|", "/")[:160], r.get("verify_s") and "%.1f" % r["verify_s"] or "-",
                     "yes" if r["as_expected"] else "**no**"))
lines.append("")
lines.append("%d of %d CUDA corpus kernels as expected" % (good, len(rows)))
open(out + "/" + name + ".md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines[-1:]))
for r in rows:
    if not r["as_expected"]:
        print("  not as expected: %s: %s (%s)" % (r["file"], r["verdict"], r["reason"][:200]))
PYEOF
  stamp "$name done"
}

# --- ModelNew CUDA candidates: verdicts, and load_inline's confined compile cold then cached
modelnew_stage() {
  stamp "modelnew: tests/evaluator/modelnew/cuda/*.py"
  local f cache=/tmp/kf-mn-cache
  rm -rf "$cache"
  {
    echo "| candidate | run | verdict | reason | compile s | verify s | speedup | torch only |"
    echo "|---|---|---|---|---:|---:|---:|---|"
  } > "$OUTDIR/modelnew_cuda.md"
  for run in cold cached; do
    for f in tests/evaluator/modelnew/cuda/*.py; do
      [ "$(left)" -gt 15 ] || { echo "| $(basename "$f") | $run | not run (deadline) | | | | | |" >> "$OUTDIR/modelnew_cuda.md"; continue; }
      timeout "$(( $(left) + 20 ))" tools/eval 001_relu "$f" --json --backend cuda --cache "$cache" \
        > "$OUTDIR/mn_${run}_$(basename "$f" .py).json" 2>> "$OUTDIR/modelnew.log"
      "$PY" - "$OUTDIR/mn_${run}_$(basename "$f" .py).json" "$(basename "$f")" "$run" >> "$OUTDIR/modelnew_cuda.md" <<'PYEOF'
import json, sys
try:
    j = json.load(open(sys.argv[1]))
except Exception as e:
    print("| %s | %s | no JSON (%s) | | | | | |" % (sys.argv[2], sys.argv[3], str(e)[:80])); sys.exit()
print("| %s | %s | %s | %s | %.1f | %.1f | %s | %s |" % (sys.argv[2], sys.argv[3], j.get("verdict"), (j.get("reason") or "").replace("|", "/")[:200],
      j.get("compile_s") or 0, j.get("verify_s") or 0, "%.3f" % j["speedup"] if j.get("speedup") else "-", j.get("torch_only")))
PYEOF
    done
  done
  cat "$OUTDIR/modelnew_cuda.md"
  stamp "modelnew done"
}

# --- CUDA-L1's published H100 kernels, until the deadline (rows kept in $BUILD/cudal1/rows,
# so a second call goes on where this one stopped)
cudal1_stage() {
  [ -n "$kb_pid" ] && { wait "$kb_pid"; stamp "KernelBench imported: $(ls "$BUILD/kb-tasks" | wc -l) tasks"; tail -3 "$OUTDIR/import_kb.log"; }
  [ -f "$KB/h100.json.gz" ] || { echo "no $KB/h100.json.gz (carry .kb)"; return 1; }
  zcat "$KB/h100.json.gz" > /tmp/kf-h100.jsonl
  stamp "cudal1: CUDA-L1 h100.json, levels ${KF_LEVELS:-1}, $JOBS at once, $(left) s left"
  timeout "$(( $(left) + 20 ))" tools/verify-kernelbench /tmp/kf-h100.jsonl --tasks "$BUILD/kb-tasks" --backend cuda \
    --out "$BUILD/cudal1" --levels "${KF_LEVELS:-1}" --jobs "$JOBS" --timeout 240 --cache /tmp/kf-kb-cache \
    > "$OUTDIR/cudal1_table.md" 2> "$OUTDIR/cudal1.log"
  local rc=$?
  stamp "cudal1 exit $rc; $(ls "$BUILD/cudal1/rows" 2>/dev/null | wc -l) problems verified so far"
  # the rows verified so far, whether or not the batch finished
  tar -C "$BUILD/cudal1" -czf "$OUTDIR/cudal1_rows.tgz" rows candidates 2>/dev/null
  grep -E "^\[" "$OUTDIR/cudal1.log" | tail -40
}

want corpus && corpus_stage corpus_cuda &
cpid=$!
want modelnew && modelnew_stage
wait $cpid
want corpus_pp && corpus_stage corpus_cuda_pp --private-proc-cuda
want cudal1 && cudal1_stage
stamp "all stages done"
cat "$OUTDIR/corpus_cuda.md" 2>/dev/null | tail -3

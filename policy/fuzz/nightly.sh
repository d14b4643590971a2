#!/usr/bin/env bash
# Nightly-style fuzzing: builds every policy parser fuzzer and runs each for a fixed time,
# then prints one table (fuzzer, executions, crashes, seconds). Exit 0 only if every
# fuzzer ran and none crashed.
#   policy/fuzz/nightly.sh [SECONDS]     default 180 s per fuzzer
# Needs clang 14 with libFuzzer: on Debian 12, apt-get install clang-14 libclang-rt-14-dev
# (not in setup.sh: CI does not fuzz). Seeds: see run_fuzz.sh (KF_BUILD_DIR, KF_POLICY_REFS).
# The table is also written to build-fuzz/nightly-<UTC time>.txt; crash inputs stay in
# build-fuzz/crash_<fuzzer>_*.
set -uo pipefail
cd "$(dirname "$0")/../.."
SECS=${1:-180}
[[ "$SECS" =~ ^[0-9]+$ ]] && [ "$SECS" -gt 0 ] || { echo "nightly.sh: SECONDS must be a positive integer, got '$SECS'" >&2; exit 2; }
FUZZERS=(fuzz_safetensors fuzz_tokenizer fuzz_encode)
OUT=build-fuzz; mkdir -p "$OUT"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
TABLE="$OUT/nightly-$STAMP.txt"
status=0
rows=()
for t in "${FUZZERS[@]}"; do
  before=$(ls "$OUT"/crash_"${t}"_* 2>/dev/null | wc -l)
  rm -f "$OUT/$t.log"
  t0=$(date +%s)
  bash policy/fuzz/run_fuzz.sh "$SECS" "$t"
  rc=$?
  secs=$(( $(date +%s) - t0 ))
  after=$(ls "$OUT"/crash_"${t}"_* 2>/dev/null | wc -l)
  execs=$(grep -oE "stat::number_of_executed_units: [0-9]+" "$OUT/$t.log" 2>/dev/null | tail -1 | awk '{print $2}')
  crashes=$(( after - before ))
  if [ -z "$execs" ]; then
    echo "nightly.sh: $t did not run (run_fuzz.sh exit $rc; see $OUT/$t.log)" >&2
    execs="-"; status=1
  fi
  [ "$crashes" -eq 0 ] || status=1
  # Fuzzing time only: the build is in the run_fuzz.sh output above.
  fsecs=$(grep -oE "Done [0-9]+ runs in [0-9]+ second" "$OUT/$t.log" 2>/dev/null | awk '{print $5}')
  rows+=("$(printf "%-18s %12s %8s %8s" "$t" "$execs" "$crashes" "${fsecs:-$secs}")")
done
{
  echo "policy fuzzers, $SECS s each, $(date -u +%Y-%m-%dT%H:%MZ), $(${CXX:-clang++-14} --version | head -1)"
  printf "%-18s %12s %8s %8s\n" fuzzer executions crashes seconds
  for r in "${rows[@]}"; do echo "$r"; done
} | tee "$TABLE"
exit $status

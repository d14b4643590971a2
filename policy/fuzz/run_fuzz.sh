#!/usr/bin/env bash
# Builds and runs the policy parser fuzzers (libFuzzer + ASan + UBSan, clang 14; needs
# libclang-rt-14-dev). Not part of CI: run by hand, results go in docs/policy.md.
#   policy/fuzz/run_fuzz.sh [SECONDS] [TARGET...]   default 600 s each; targets:
#   fuzz_safetensors fuzz_tokenizer fuzz_encode
# Corpora and crash files live under build-fuzz/ (ignored by git).
set -uo pipefail
cd "$(dirname "$0")/../.."
SECS=${1:-600}; shift || true
TARGETS=("$@"); [ ${#TARGETS[@]} -gt 0 ] || TARGETS=(fuzz_safetensors fuzz_tokenizer fuzz_encode)
OUT=build-fuzz; mkdir -p "$OUT"
CXX=${CXX:-clang++-14}
SRC="policy/src/safetensors_format.cpp policy/src/tokenizer.cpp policy/src/pretokenize.cpp policy/src/unicode.cpp policy/src/config.cpp"
FLAGS="-std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Ipolicy/include -Icommon/include -Ipolicy/src"
REFS=${KF_POLICY_REFS:-build-policy/policy_refs}
for t in "${TARGETS[@]}"; do
  echo "== build $t"
  $CXX $FLAGS "policy/fuzz/$t.cpp" $SRC -o "$OUT/$t" || exit 1
  corpus="$OUT/corpus_$t"; mkdir -p "$corpus"
  # Seeds: real files of the kind each target parses.
  case $t in
    fuzz_safetensors) for f in "$REFS"/*/model*.safetensors; do [ -f "$f" ] && cp -n "$f" "$corpus/" ; done ;;
    fuzz_tokenizer) for f in "$REFS"/tokenizer_*.json; do [ -f "$f" ] && cp -n "$f" "$corpus/"; done ;;
    fuzz_encode) printf "def f(x):\n    return x  # caf\xc3\xa9 \xf0\x9f\x9a\x80\n" > "$corpus/seed.txt" ;;
  esac
  echo "== run $t for $SECS s"
  KF_FUZZ_TOKENIZER="$REFS/tokenizer_qwen2.json" "$OUT/$t" "$corpus" -max_total_time="$SECS" -max_len=65536 \
    -rss_limit_mb=4096 -timeout=20 -artifact_prefix="$OUT/crash_${t}_" -print_final_stats=1 > "$OUT/$t.log" 2>&1
  rc=$?
  grep -E "stat::number_of_executed_units|stat::peak_rss|Done|ERROR|SUMMARY" "$OUT/$t.log" | tail -6
  echo "== $t exit $rc; crashes: $(ls "$OUT"/crash_"${t}"_* 2>/dev/null | wc -l)"
done

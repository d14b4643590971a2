#!/usr/bin/env bash
# Builds and runs the policy parser fuzzers (libFuzzer + ASan + UBSan, clang 14; needs the
# Debian 12 package libclang-rt-14-dev). Not part of CI: run by hand or by nightly.sh.
#   policy/fuzz/run_fuzz.sh [SECONDS] [TARGET...]   default 600 s each; targets:
#   fuzz_safetensors fuzz_tokenizer fuzz_encode
# Seeds are the policy test references (tiny HF checkpoints and trained tokenizers) that
# the CTest fixture PolicyHfReferences writes to <build>/policy_refs; when they are
# missing this script runs that fixture first, and stops if they still are.
#   KF_BUILD_DIR   the CMake build folder (default: build)
#   KF_POLICY_REFS the reference folder (default: $KF_BUILD_DIR/policy_refs)
# Corpora, logs and crash files live under build-fuzz/ (ignored by git).
set -uo pipefail
cd "$(dirname "$0")/../.."
SECS=${1:-600}; shift || true
TARGETS=("$@"); [ ${#TARGETS[@]} -gt 0 ] || TARGETS=(fuzz_safetensors fuzz_tokenizer fuzz_encode)
OUT=build-fuzz; mkdir -p "$OUT"
CXX=${CXX:-clang++-14}
BUILD=${KF_BUILD_DIR:-build}
REFS=${KF_POLICY_REFS:-$BUILD/policy_refs}
SRC="policy/src/safetensors_format.cpp policy/src/tokenizer.cpp policy/src/pretokenize.cpp policy/src/unicode.cpp policy/src/config.cpp"
FLAGS="-std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -DKF_POLICY_TEXT_ONLY -Ipolicy/include -Icommon/include -Ipolicy/src"

have_refs() { [ -f "$REFS/tokenizer_qwen2.json" ] && compgen -G "$REFS/*/model*.safetensors" > /dev/null; }
if ! have_refs; then
  echo "== seeds: $REFS has no references; making them (ctest -R PolicyHfReferences in $BUILD)"
  if [ -z "${KF_POLICY_REFS:-}" ] && [ -f "$BUILD/CTestTestfile.cmake" ]; then
    ctest --test-dir "$BUILD" -R '^PolicyHfReferences$' --output-on-failure > "$OUT/policy_refs.log" 2>&1 ||
      { tail -20 "$OUT/policy_refs.log"; }
  fi
  if ! have_refs; then
    echo "run_fuzz.sh: seed folder $REFS lacks tokenizer_qwen2.json and */model*.safetensors;" \
         "make it with 'ctest --test-dir $BUILD -R PolicyHfReferences' or set KF_POLICY_REFS" >&2
    exit 2
  fi
fi

for t in "${TARGETS[@]}"; do
  [ -f "policy/fuzz/$t.cpp" ] || { echo "run_fuzz.sh: unknown target $t (no policy/fuzz/$t.cpp)" >&2; exit 2; }
  echo "== build $t"
  $CXX $FLAGS "policy/fuzz/$t.cpp" $SRC -o "$OUT/$t" || { echo "run_fuzz.sh: building $t failed" >&2; exit 1; }
  corpus="$OUT/corpus_$t"; mkdir -p "$corpus"
  # Seeds: real files of the kind each target parses.
  case $t in
    fuzz_safetensors) for f in "$REFS"/*/*.safetensors; do [ -f "$f" ] && cp -n "$f" "$corpus/$(basename "$(dirname "$f")")_$(basename "$f")"; done ;;
    fuzz_tokenizer) for f in "$REFS"/tokenizer_*.json; do [ -f "$f" ] && cp -n "$f" "$corpus/"; done ;;
    fuzz_encode) printf "def f(x):\n    return x  # caf\xc3\xa9 \xf0\x9f\x9a\x80\n" > "$corpus/seed.txt" ;;
  esac
  nseeds=$(ls "$corpus" | wc -l)
  [ "$nseeds" -gt 0 ] || { echo "run_fuzz.sh: no seeds for $t in $corpus" >&2; exit 2; }
  echo "== run $t for $SECS s ($nseeds files in the corpus)"
  KF_FUZZ_TOKENIZER="$REFS/tokenizer_qwen2.json" "$OUT/$t" "$corpus" -max_total_time="$SECS" -max_len=65536 \
    -rss_limit_mb=4096 -timeout=20 -artifact_prefix="$OUT/crash_${t}_" -print_final_stats=1 > "$OUT/$t.log" 2>&1
  rc=$?
  grep -E "stat::number_of_executed_units|stat::peak_rss|Done|ERROR|SUMMARY" "$OUT/$t.log" | tail -6
  echo "== $t exit $rc; crashes: $(ls "$OUT"/crash_"${t}"_* 2>/dev/null | wc -l)"
done

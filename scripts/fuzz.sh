#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz; clang, ASan+UBSan, -DFT_FUZZ=ON) and runs each for
# SECONDS (default 60) from its seed corpus tests/fuzz/corpus/<target> (read only; what a run
# finds goes to BUILD/fuzz-corpus/<target> and is reused by the next run). A crash, a leak, a
# sanitizer report or a failed check leaves the input in BUILD/fuzz-crashes/ and fails the script:
# reproduce it with `BUILD/tests/fuzz/<target> FILE`, then make it a regression test in tests/unit.
#
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]
# Env:   FUZZ_BUILD_DIR (default build-fuzz), FUZZ_BUILD_TYPE (default RelWithDebInfo; CI: Debug,
#        the ASan build it shares), FT_SHARED_DIR (the tokenizer vocabularies; default ../shared).
set -euo pipefail
cd "$(dirname "$0")/.."

SECS=${1:-60}
[ $# -gt 0 ] && shift
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=(fuzz_gguf fuzz_tokenizer fuzz_api fuzz_chat_template fuzz_binary_frame)
B=${FUZZ_BUILD_DIR:-build-fuzz}
SHARED=${FT_SHARED_DIR:-$(pwd)/../shared}

if [ ! -f "$B/CMakeCache.txt" ]; then
  CC=clang CXX=clang++ cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE="${FUZZ_BUILD_TYPE:-RelWithDebInfo}" \
    -DFT_FUZZ=ON -DFT_SHARED_DIR="$SHARED"
fi
cmake --build "$B" -j"$(nproc)" --target "${TARGETS[@]}"

# Each target's input size cap: whole files for the GGUF reader, request-sized elsewhere.
declare -A MAX_LEN=([fuzz_gguf]=65536 [fuzz_tokenizer]=2048 [fuzz_api]=4096 [fuzz_chat_template]=4096
                    [fuzz_binary_frame]=4096)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export FT_SHARED_DIR="$SHARED"
mkdir -p "$B/fuzz-crashes"
# The targets run side by side, as many at a time as there are cores (each is one process).
run_target() {  # t -> its log, and its exit status in $B/fuzz-$t.rc
  local t=$1 corpus="$B/fuzz-corpus/$1" rc=0
  mkdir -p "$corpus"
  local args=(-max_total_time="$SECS" -timeout=20 -rss_limit_mb=2560 -max_len="${MAX_LEN[$t]:-4096}"
              -print_final_stats=1 -artifact_prefix="$B/fuzz-crashes/$t-")
  [ -f "tests/fuzz/dict/$t.dict" ] && args+=(-dict="tests/fuzz/dict/$t.dict")
  "$B/tests/fuzz/$t" "${args[@]}" "$corpus" "tests/fuzz/corpus/$t" >"$B/fuzz-$t.log" 2>&1 || rc=$?
  echo $rc > "$B/fuzz-$t.rc"
}
JOBS=$(nproc)
ran=()
summary=()
for t in "${TARGETS[@]}"; do
  if [ "$t" = fuzz_tokenizer ] && ! ls "$SHARED"/tokenizer/*.gguf >/dev/null 2>&1; then
    summary+=("$t: skipped (no vocabularies in $SHARED/tokenizer)")
    continue
  fi
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
  echo "== $t: ${SECS} s"
  rm -f "$B/fuzz-$t.rc"
  run_target "$t" &
  ran+=("$t")
done
wait
failed=()
for t in "${ran[@]}"; do
  log="$B/fuzz-$t.log"
  rc=$(cat "$B/fuzz-$t.rc" 2>/dev/null || echo 1)
  corpus="$B/fuzz-corpus/$t"
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
  line="$t: ${runs:-0} runs in ${SECS} s ($(( ${runs:-0} / (SECS > 0 ? SECS : 1) ))/s), ${cov:-cov: ?}, corpus $(ls "$corpus" | wc -l)"
  if [ "$rc" -ne 0 ]; then
    failed+=("$t")
    line+=" -- FAILED (exit $rc; log $log)"
    grep -E "ERROR|runtime error|check failed|SUMMARY|Test unit written" "$log" | head -20 || true
  fi
  summary+=("$line")
done
printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]} (inputs in $B/fuzz-crashes/)"
  exit 1
fi
echo "fuzz: OK"

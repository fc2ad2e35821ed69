#!/usr/bin/env bash
# The stress check: the whole test suite run several times at once, beside CPU hogs, to find the tests that
# depend on timing or on the machine being idle (docs/architecture.md, "Tests under load"). A test that fails
# in any copy is one to fix: it must drive time itself (the injected clock) or wait for the event it needs,
# and accept every correct outcome of a race it cannot control.
#
# Usage: tools/stress_tests.sh [--build-dir DIR] [--copies N] [--hogs N] [--rounds N] [--out DIR] [-- CTEST ARGS]
#   --build-dir  a configured and built tree (default build/release)
#   --copies     suites run at the same time (default 2), each `ctest -j2`
#   --hogs       busy-looping processes beside them (default: the number of cores)
#   --rounds     how many times to repeat the whole thing (default 1)
#   --out        where the logs go (default out/stress)
#   CTEST ARGS   passed to every copy (e.g. -L fast)
# Exit status: 0 when every test passed in every copy and round, 1 otherwise; the last lines list each test
# that failed with the copies it failed in.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."

BUILD_DIR=build/release
COPIES=2
HOGS="$(nproc)"
ROUNDS=1
OUT=out/stress
CTEST_ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) BUILD_DIR="$2"; shift 2 ;;
    --copies) COPIES="$2"; shift 2 ;;
    --hogs) HOGS="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --) shift; CTEST_ARGS=("$@"); break ;;
    *) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  esac
done
[[ -f "$BUILD_DIR/CTestTestfile.cmake" ]] || { echo "stress_tests: $BUILD_DIR is not a built tree; build first (./fl.sh test builds build/release)" >&2; exit 2; }
mkdir -p "$OUT"

hog_pids=()
stop_hogs() { for p in "${hog_pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap stop_hogs EXIT
for ((h = 0; h < HOGS; h++)); do
  ( while :; do :; done ) &
  hog_pids+=($!)
done

failed=0
start=$(date +%s)
for ((r = 1; r <= ROUNDS; r++)); do
  pids=()
  for ((c = 1; c <= COPIES; c++)); do
    log="$OUT/round-$r-copy-$c.log"
    # Each copy in its own TMPDIR, as two developers' runs on one machine would be.
    tmp="$(mktemp -d)"
    ( TMPDIR="$tmp" ctest --test-dir "$BUILD_DIR" -j2 --output-on-failure "${CTEST_ARGS[@]}" > "$log" 2>&1; rm -rf "$tmp" ) &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
done
stop_hogs
end=$(date +%s)

echo "stress_tests: $ROUNDS round(s) of $COPIES copies beside $HOGS hog(s) in $((end - start)) s; logs in $OUT"
for log in "$OUT"/round-*-copy-*.log; do
  summary="$(grep -E 'tests passed|tests failed' "$log" | tail -1 || true)"
  echo "  $(basename "$log" .log): ${summary:-no summary (see the log)}"
done
# Every failed test, with the logs it failed in.
grep -HE '^\s*[0-9]+ - .* \((Failed|Timeout|SEGFAULT|Subprocess aborted|Child aborted|Exception)' "$OUT"/round-*-copy-*.log \
  | sed -E 's|^.*/(round-[0-9]+-copy-[0-9]+)\.log:\s*[0-9]+ - (\S+) \((.*)\)|\2 \3 \1|' | sort | \
  awk '{ key = $1 " (" $2 ")"; runs[key] = runs[key] " " $3 } END { for (k in runs) print "  FAILED " k ":" runs[k] }'
exit "$failed"

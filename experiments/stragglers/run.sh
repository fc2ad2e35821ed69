#!/usr/bin/env bash
# Runs the straggler-mitigation study (docs/stragglers.md "Results"): the same 12 emulated clients over mixed 5G /
# WiFi / Ethernet links, CNN on Fashion-MNIST, once per remedy, each into its own records database, then
# fl-report --compare over all of them (accuracy against wall time, time to 85% test accuracy, bytes moved).
#
# Usage: experiments/stragglers/run.sh [BUILD_DIR] [OUT_DIR] [RUN...]   (defaults: build/release, out/stragglers,
#        every run: sync overcommit deadline-fold fedbuff link-aware combined)
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/../.."
BUILD_DIR="${1:-build/release}"
OUT="${2:-out/stragglers}"
shift $(( $# > 2 ? 2 : $# ))
RUNS=("$@")
[ ${#RUNS[@]} -gt 0 ] || RUNS=(sync overcommit deadline-fold fedbuff link-aware combined)
mkdir -p "$OUT"
DBS=()
for run in "${RUNS[@]}"; do
  # fl-experiment prints a progress line per round (or aggregation step) while it runs.
  "$BUILD_DIR/experiments/fl-experiment" run "experiments/stragglers/$run.yaml" --db "$OUT/$run.db" \
    --out "$OUT/$run" 2>&1 | tee "$OUT/$run.txt" || { echo "run $run failed: $OUT/$run.txt" >&2; exit 1; }
  DBS+=("$OUT/$run.db")
done
mkdir -p "$OUT/compare"
"$BUILD_DIR/report/fl-report" --compare "${DBS[@]}" --target-accuracy 0.85 --out "$OUT/compare"
cat "$OUT/compare/compare.md"
echo "plot: $OUT/compare/compare.svg; page: $OUT/compare/compare.html"

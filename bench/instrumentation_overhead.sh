#!/usr/bin/env bash
# What instrumentation costs a quickstart round (docs/performance.md, "Instrumentation overhead").
#
#   1. A/B: the quickstart experiment (experiments/quickstart.yaml through fl-experiment), alternately with
#      instrumentation on (records database, checkpoints, Prometheus /metrics scraped every second) and off
#      (fl-experiment run --no-records, no /metrics), PAIRS times each; round times come from fl-server's own
#      round table (round_time_s), which it prints either way.
#   2. Direct: bench/instrumentation_bench times exactly the per-round instrumentation work (records rows
#      committed, Prometheus observations, clock exchanges) and states it as a share of the median quickstart
#      round of the first "on" run's records, measured in this same invocation.
# The A/B difference is within the run-to-run noise of 15 s training rounds on a shared machine; (2) is the
# figure with resolution, (1) shows that nothing larger hides elsewhere.
#
# Usage: bench/instrumentation_overhead.sh [BUILD_DIR] [PAIRS]   (defaults: build/release, 2)
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
BUILD_DIR="${1:-build/release}"
PAIRS="${2:-2}"
EXPERIMENT="$BUILD_DIR/experiments/fl-experiment"
OUT=$(mktemp -d /tmp/fl_instr_overhead.XXXXXX)
scraper=""
trap '[[ -n "$scraper" ]] && kill "$scraper" 2>/dev/null; rm -rf "$OUT"' EXIT

run() {  # run NAME on|off -> prints the round times (s) of that run, one per line
  local name=$1 mode=$2 manifest=experiments/quickstart.yaml
  if [[ $mode == on ]]; then
    local mport
    mport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    # The quickstart with fl-server's /metrics on, scraped every second as Prometheus would.
    sed "s/^  round_deadline_s: 120$/  round_deadline_s: 120\n  metrics_addr: 127.0.0.1:$mport/" "$manifest" >"$OUT/on.yaml"
    manifest="$OUT/on.yaml"
    ( while sleep 1; do curl -s "http://127.0.0.1:$mport/metrics" >/dev/null 2>&1 || true; done ) >/dev/null 2>&1 &
    scraper=$!
    "$EXPERIMENT" run "$manifest" --profiles-dir experiments/profiles --out "$OUT/$name" >"$OUT/$name.log" 2>&1 ||
      echo "instrumentation_overhead: the 'on' run failed, see $OUT/$name.log" >&2
    kill "$scraper" 2>/dev/null || true
    scraper=""
  else
    "$EXPERIMENT" run "$manifest" --out "$OUT/$name" --no-records >"$OUT/$name.log" 2>&1 ||
      echo "instrumentation_overhead: the 'off' run failed, see $OUT/$name.log" >&2
  fi
  awk '$1 ~ /^[0-9]+$/ && NF == 6 {print $6}' "$OUT/$name/server.log" 2>/dev/null || true
}

declare -a on_times off_times
for p in $(seq "$PAIRS"); do
  mapfile -t t < <(run "on$p" on); on_times+=("${t[@]}")
  mapfile -t t < <(run "off$p" off); off_times+=("${t[@]}")
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
on_med=$(median "${on_times[@]}")
off_med=$(median "${off_times[@]}")
echo "A/B over $PAIRS pairs of quickstart runs (round times in s)"
echo "  on : ${on_times[*]}  median $on_med"
echo "  off: ${off_times[*]}  median $off_med"
awk -v a="$on_med" -v b="$off_med" 'BEGIN {printf "  on/off median ratio %.4f (difference %+.2f%%)\n", a/b, 100*(a-b)/b}'
echo
"$BUILD_DIR/bench/instrumentation_bench" --benchmark_min_time=0.5 --quickstart_db="$OUT/on1/records.db"

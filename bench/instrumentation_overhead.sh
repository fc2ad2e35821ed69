#!/usr/bin/env bash
# What instrumentation costs a quickstart round (docs/performance.md, "Instrumentation overhead").
#
#   1. A/B: the quickstart experiment, alternately with instrumentation on (records database, checkpoints,
#      Prometheus /metrics scraped every second) and off (none of them), PAIRS times each; the per-round
#      times come from fl-server's own round table (round_time_s), which it prints either way.
#   2. Direct: bench/instrumentation_bench times exactly the per-round instrumentation work (records rows
#      committed, Prometheus observations, clock exchanges) and states it as a share of the median quickstart
#      round of the "on" run's records database, measured in this same invocation.
# The A/B difference is within the run-to-run noise of 15 s training rounds on a shared machine; (2) is the
# figure with resolution, (1) shows nothing larger hides elsewhere.
#
# Usage: bench/instrumentation_overhead.sh [BUILD_DIR] [PAIRS]   (defaults: build/release, 2)
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
BUILD_DIR="${1:-build/release}"
PAIRS="${2:-2}"
OUT=$(mktemp -d /tmp/fl_instr_overhead.XXXXXX)
scraper=""
trap '[[ -n "$scraper" ]] && kill "$scraper" 2>/dev/null; rm -rf "$OUT"' EXIT

run() {  # run NAME on|off -> prints the round times (s) of that run, one per line
  local name=$1 mode=$2 port_args=""
  if [[ $mode == on ]]; then
    local mport
    mport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    port_args="--metrics-addr 127.0.0.1:$mport"
    ( while sleep 1; do curl -s "http://127.0.0.1:$mport/metrics" >/dev/null 2>&1 || true; done ) &
    scraper=$!
  fi
  FL_QUICKSTART_INSTRUMENTATION=$mode FL_QUICKSTART_SERVER_ARGS="$port_args" \
    experiments/quickstart.sh "$BUILD_DIR" "$OUT/$name" >"$OUT/$name.log" 2>&1
  [[ -n "$scraper" ]] && { kill "$scraper" 2>/dev/null || true; scraper=""; }
  awk '$1 ~ /^[0-9]+$/ && NF == 6 {print $6}' "$OUT/$name.log"
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

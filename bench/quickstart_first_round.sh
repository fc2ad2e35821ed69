#!/usr/bin/env bash
# The quickstart's first round against its later ones (docs/performance.md, "First round", issue 32 item 5).
#
# Runs experiments/quickstart.yaml through fl-experiment as shipped (its 4 clients as virtual clients, one
# fl-client --instances 4 process) and with emulation.virtual_clients: false (4 fl-client processes), each with
# fl-client's allocator setting (default) and with --keep-freed-memory=false (glibc's defaults: a wrapper in a
# --bin-dir adds the flag), REPS times each, and reports per run the first and the median round (fl-server's
# round table, round_time_s) as ratios to the round's compute bound measured in the same run:
#
#   bound = steps per round (all clients) x time per step on one core / cores
#
# The time per step on one core comes from the run's own records (client_rounds.train_ms / num_steps): the
# fastest client-round, scaled by how many trainers shared the cores (virtual clients train min(4, cores) at once,
# processes all 4): t1 = fastest step x cores / concurrent. So bound = steps x fastest step / concurrent. The
# round also evaluates and exchanges the model, so the ratio is above 1; the goal is first/median <= 1.2.
# Each run also reports the fl-client processes' peak resident memory (GNU time's %M): the largest and the sum.
#
# Usage: bench/quickstart_first_round.sh [BUILD_DIR] [REPS]   (defaults: build/release, 1)
# ALLOCS="keep" runs only the shipped allocator setting (default: "default keep")
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
BUILD_DIR="$(readlink -f "${1:-build/release}")"
REPS="${2:-1}"
EXPERIMENT="$BUILD_DIR/experiments/fl-experiment"
CLIENT="$BUILD_DIR/client/fl-client"
SERVER="$BUILD_DIR/server/fl-server"
for b in "$EXPERIMENT" "$CLIENT" "$SERVER"; do
  [[ -x $b ]] || { echo "quickstart_first_round: $b missing: build fl-experiment, fl-client, fl-server" >&2; exit 2; }
done
OUT=$(mktemp -d /tmp/fl_first_round.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
CORES=$(nproc)

# The two bin dirs: the allocator setting as shipped, and glibc's defaults.
mkdir -p "$OUT/bin-keep" "$OUT/bin-default"
# Each fl-client runs under GNU time, which appends its peak resident memory (KiB) to $FL_BENCH_RSS: the price
# of keeping freed memory is resident memory, so it is reported beside the rounds.
[[ -x /usr/bin/time ]] || { echo "quickstart_first_round: /usr/bin/time missing: apt-get install time" >&2; exit 2; }
ln -s "$SERVER" "$OUT/bin-keep/fl-server"
ln -s "$SERVER" "$OUT/bin-default/fl-server"
printf '#!/bin/sh\nexec /usr/bin/time -a -o "$FL_BENCH_RSS" -f %%M "%s" "$@"%s\n' "$CLIENT" "" >"$OUT/bin-keep/fl-client"
printf '#!/bin/sh\nexec /usr/bin/time -a -o "$FL_BENCH_RSS" -f %%M "%s" "$@"%s\n' "$CLIENT" " --keep-freed-memory=false" \
  >"$OUT/bin-default/fl-client"
chmod +x "$OUT/bin-keep/fl-client" "$OUT/bin-default/fl-client"
cp experiments/quickstart.yaml "$OUT/virtual.yaml"
sed 's/^emulation: {backend: userspace}$/emulation: {backend: userspace, virtual_clients: false}/' \
  experiments/quickstart.yaml >"$OUT/processes.yaml"
grep -q 'virtual_clients: false' "$OUT/processes.yaml" ||
  { echo "quickstart_first_round: experiments/quickstart.yaml's emulation line changed; update this script" >&2; exit 2; }

median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

run() {  # run MODE(virtual|processes) ALLOC(keep|default) REP
  local mode=$1 alloc=$2 rep=$3 name="$1-$2-$3" concurrent
  if ! FL_BENCH_RSS="$OUT/$name.rss" "$EXPERIMENT" --bin-dir "$OUT/bin-$alloc" run "$OUT/$mode.yaml" --profiles-dir experiments/profiles \
    --out "$OUT/$name" >"$OUT/$name.log" 2>&1; then
    echo "quickstart_first_round: run $name failed:" >&2
    tail -20 "$OUT/$name.log" >&2
    return 1
  fi
  mapfile -t rounds < <(awk '$1 ~ /^[0-9]+$/ && NF == 6 {print $6}' "$OUT/$name/server.log")
  local steps fastest
  steps=$(sqlite3 "$OUT/$name/records.db" \
    "SELECT SUM(num_steps) / COUNT(DISTINCT round) FROM client_rounds WHERE outcome = 'ok'")
  fastest=$(sqlite3 "$OUT/$name/records.db" \
    "SELECT MIN(train_ms / num_steps) / 1000.0 FROM client_rounds WHERE outcome = 'ok' AND num_steps > 0")
  if [[ $mode == virtual ]]; then concurrent=$((CORES < 4 ? CORES : 4)); else concurrent=4; fi
  local first=${rounds[0]} med
  med=$(median "${rounds[@]:1}")
  # Peak RSS of the fl-client processes: the largest one and their sum (one process for virtual clients).
  local rss_max rss_sum
  read -r rss_max rss_sum < <(awk '$1 ~ /^[0-9]+$/ {s += $1; if ($1 > m) m = $1} END {printf "%.0f %.0f\n", m / 1024, s / 1024}' "$OUT/$name.rss")
  awk -v n="$name" -v f="$first" -v m="$med" -v s="$steps" -v t="$fastest" -v c="$concurrent" -v r="${rounds[*]}" \
    -v rm="$rss_max" -v rs="$rss_sum" \
    'BEGIN {b = s * t / c; printf "%-22s rounds %-20s bound %6.2f s  first/bound %5.2f  median(2..)/bound %5.2f  first/median %5.2f  client peak RSS MiB max %d sum %d\n", n, r, b, f / b, m / b, f / m, rm, rs}'
}

echo "quickstart first round: $CORES cores, $REPS repetition(s); rounds in s (fl-server round_time_s)"
for rep in $(seq "$REPS"); do
  for mode in virtual processes; do
    for alloc in ${ALLOCS:-default keep}; do run "$mode" "$alloc" "$rep"; done
  done
done

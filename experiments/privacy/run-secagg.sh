#!/usr/bin/env bash
# Issue 29, item 3: what SecAgg+ costs per round over each link kind, and its recovery from dropouts
# (docs/privacy.md, "Secure aggregation: what it costs per link kind"). For K in $KS (default 10 50 100), links in
# $LINKS (default none ethernet wifi 5g-sa; none = loopback) and modes plain and secagg (secure_aggregation.mode off
# and secagg+), it writes experiments/privacy/secagg-cost.yaml with that K, link and mode into $OUT/manifests and
# runs it (6 rounds, every client selected) into one records database; then the recovery runs of
# secagg-recovery.yaml (K = $RECOVERY_K, default 50, loopback) with 0%, 10% and 30% of the clients dropping after
# sharing their keys, with the default SecAgg+ graph and the full graph ($GRAPHS). Each run is mutual TLS with its own throwaway CA, as every fl-experiment run.
# Prints the table (secagg_table.py) and fl-report's rounds and secagg tables of the recovery runs.
#
# Usage: experiments/privacy/run-secagg.sh [BUILD_DIR] [OUT_DIR]   (defaults: build/release, out/privacy-secagg)
#        KS="10 50" LINKS="none 5g-sa" MODES="plain secagg" DROPS="0 10 30" to run a part (KS="" none); a run already in the
#        database (finished) is skipped, so that the script can be stopped and started again.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/../.."
BUILD_DIR="${1:-build/release}"
OUT="${2:-out/privacy-secagg}"
DB="$OUT/records.db"
KS="${KS-10 50 100}"
LINKS="${LINKS-none ethernet wifi 5g-sa}"
MODES="${MODES-plain secagg}"
DROPS="${DROPS-0 10 30}"
RECOVERY_K="${RECOVERY_K:-50}"
# Recovery graphs: "none" = the default SecAgg+ graph (k = odd >= 3 log2 K, threshold floor(k/2) + 1); "full" =
# every pair (secure_aggregation.full_graph_max raised to K: plain SecAgg, threshold floor(K/2) + 1).
GRAPHS="${GRAPHS-none full}"
mkdir -p "$OUT/manifests"

done_before() {  # a finished experiment of this name is in the database
  [ -f "$DB" ] && [ -n "$(sqlite3 "$DB" "SELECT 1 FROM experiments WHERE name = '$1' AND status = 'finished' LIMIT 1")" ]
}
run() {  # name manifest
  if done_before "$1"; then echo "run $1: already in $DB"; return; fi
  local t0=$SECONDS
  "$BUILD_DIR/experiments/fl-experiment" run "$2" --profiles-dir experiments/profiles --db "$DB" --out "$OUT/$1" >"$OUT/$1.txt" 2>&1 ||
    { echo "run $1 failed: $OUT/$1.txt" >&2; return 1; }
  echo "run $1 done ($((SECONDS - t0)) s)"
}

for k in $KS; do
  for link in $LINKS; do
    for mode in $MODES; do
      name="secagg-cost-k$k-$link-$mode"
      m="$OUT/manifests/$name.yaml"
      sed -e "s/^name: secagg-cost$/name: $name/" \
          -e "s/^description: .*/description: \"SecAgg+ cost: K = $k over $link, $mode\"/" \
          -e "s/min_fit_clients: 10, min_available_clients: 10/min_fit_clients: $k, min_available_clients: $k/" \
          -e "s/upload_slots: 10 /upload_slots: $k /" \
          -e "s/^    count: 10$/    count: $k/" \
          -e "s/^    link: ethernet$/    link: $link/" \
          experiments/privacy/secagg-cost.yaml >"$m"
      [ "$mode" = plain ] && sed -i -e 's/^    mode: secagg+$/    mode: "off"/' "$m"
      run "$name" "$m" || true
    done
  done
done

for graph in $GRAPHS; do
for drop in $DROPS; do
  name="secagg-rec-k$RECOVERY_K-$graph-secagg-drop$drop"
  m="$OUT/manifests/$name.yaml"
  # The survivors, K - ceil(drop% x K) (as fl-client counts its dropping instances): the updates a round needs.
  survivors=$(awk "BEGIN{d = $drop * $RECOVERY_K / 100; c = int(d); if (c < d - 1e-9) c++; print $RECOVERY_K - c}")
  sed -e "s/^name: secagg-recovery$/name: $name/" \
      -e "s/^description: .*/description: \"SecAgg+ recovery: K = $RECOVERY_K over loopback, $drop% dropping after the shares\"/" \
      -e "s/min_fit_clients: 35, min_available_clients: 50}  # 35: the survivors commit/min_fit_clients: $survivors, min_available_clients: $RECOVERY_K}  # the survivors commit/" \
      -e "s/upload_slots: 50/upload_slots: $RECOVERY_K/" \
      -e "s/^    count: 50$/    count: $RECOVERY_K/" \
      -e "s/secagg_drop_after_shares: 0.3/secagg_drop_after_shares: $(awk "BEGIN{print $drop/100}")/" \
      experiments/privacy/secagg-recovery.yaml >"$m"
  [ "$graph" = full ] && sed -i -e "s/^    stage_deadline_s: 60$/    stage_deadline_s: 60\n    full_graph_max: $RECOVERY_K/" "$m"
  run "$name" "$m" || true
done
done

echo; echo "== cost per round (experiments/privacy/secagg_table.py $DB)"
python3 experiments/privacy/secagg_table.py "$DB" secagg-cost-
echo; echo "== recovery"
python3 experiments/privacy/secagg_table.py "$DB" secagg-rec-
for graph in $GRAPHS; do
for drop in $DROPS; do
  name="secagg-rec-k$RECOVERY_K-$graph-secagg-drop$drop"
  id=$(sqlite3 "$DB" "SELECT id FROM experiments WHERE name = '$name' ORDER BY started_unix_ms DESC LIMIT 1")
  [ -n "$id" ] || continue
  echo; echo "== $name ($id)"
  "$BUILD_DIR/report/fl-report" "$DB" --experiment "$id" --table rounds
  "$BUILD_DIR/report/fl-report" "$DB" --experiment "$id" --table secagg
done
done

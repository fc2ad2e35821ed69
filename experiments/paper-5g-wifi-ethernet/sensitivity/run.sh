#!/usr/bin/env bash
# The reproduction's sensitivity runs (docs/reproduction.md, "Sensitivity"): the mixed federation (1 Ethernet, 1
# WiFi, 2 x 5G SA on the SDR cell's profile) with one assumption changed per manifest, into one records database,
# then each run's link-kind table (5G uplink / Ethernet uplink, 5G / WiFi, the 5G uplink's share of a round).
# Run as root (packet backend, cpu quotas). cap-sdr-100ft reads the measured trace from ../shared/traces/.
#
# Usage: experiments/paper-5g-wifi-ethernet/sensitivity/run.sh [BUILD_DIR|BIN_DIR] [OUT_DIR]
#        (defaults: build/release, out/paper-sensitivity)
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/../../.."
BUILD_DIR="${1:-build/release}"
OUT="${2:-out/paper-sensitivity}"
. experiments/paper-5g-wifi-ethernet/binaries.sh "$BUILD_DIR"
DB="$OUT/records.db"
mkdir -p "$OUT"
RUNS="cap-5g-sa-fixed15 cap-sdr-100ft cap-5g-edge loss-0 loss-1pct cc-reno cc-reno-loss-1pct model-cnn fixed-cost-duty-cycle wifi-300mbit"
for run in $RUNS; do
  "$EXP" run "experiments/paper-5g-wifi-ethernet/sensitivity/$run.yaml" --db "$DB" --out "$OUT/$run" \
    >"$OUT/$run.txt" 2>&1 || { echo "run $run failed: $OUT/$run.txt" >&2; exit 1; }
  echo "run $run done"
done
for run in $RUNS; do
  id=$(sqlite3 "$DB" "SELECT id FROM experiments WHERE name = 'sens-$run' ORDER BY started_unix_ms DESC LIMIT 1")
  echo; echo "== sens-$run ($id)"
  "$REPORT" "$DB" --experiment "$id" --table links
done

#!/usr/bin/env bash
# Runs the reproduction of "Federated Learning over 5G, WiFi, and Ethernet" (docs/reproduction.md): the same
# four emulated Raspberry Pi 4 clients over Ethernet, WiFi and 5G SA, then a mixed federation, into one records
# database, and prints fl-report's link and straggler tables of each run (the figures of docs/reproduction.md).
# Each run is mutual TLS with its own throwaway CA in $OUT/<run>/pki, as every fl-experiment run is unless its
# manifest says `security: {mode: insecure}` (docs/manifests.md).
#
# The runs use the packet backend and cpu quotas: run as root (each is refused before it starts otherwise, saying
# what is missing).
#
# Usage: experiments/paper-5g-wifi-ethernet/run.sh [BUILD_DIR|BIN_DIR] [OUT_DIR]   (defaults: build/release, out/paper)
# BIN_DIR: a folder holding fl-experiment, fl-server, fl-client and fl-report side by side (e.g. an installed copy).
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/../.."
BUILD_DIR="${1:-build/release}"
OUT="${2:-out/paper}"
. experiments/paper-5g-wifi-ethernet/binaries.sh "$BUILD_DIR"
DB="$OUT/records.db"
mkdir -p "$OUT"
for run in ethernet wifi 5g mixed; do
  "$EXP" run "experiments/paper-5g-wifi-ethernet/$run.yaml" --db "$DB" \
    --out "$OUT/$run" >"$OUT/$run.txt" 2>&1 || { echo "run $run failed: $OUT/$run.txt" >&2; exit 1; }
  echo "run $run done"
done
"$REPORT" "$DB" --list
for run in ethernet wifi 5g mixed; do
  id=$(sqlite3 "$DB" "SELECT id FROM experiments WHERE name = 'paper-$run' ORDER BY started_unix_ms DESC LIMIT 1")
  echo; echo "== paper-$run ($id)"
  "$REPORT" "$DB" --experiment "$id" --table links
  "$REPORT" "$DB" --experiment "$id" --table stragglers
  "$REPORT" "$DB" --experiment "$id" --format html --out "$OUT/$run.html"
done

#!/usr/bin/env bash
# The quickstart experiment: fl-server and 4 fl-client processes on this machine, FedAvg on Fashion-MNIST
# (a small CNN, IID shards, one local epoch per round), over loopback. Prints the per-round table and
# leaves the records database behind.
#
# Usage: experiments/quickstart.sh [BUILD_DIR] [OUT_DIR]   (defaults: build/release, out/quickstart)
# Every process it starts is stopped when it exits, also on Ctrl-C or when one of them fails.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."

BUILD_DIR="${1:-build/release}"
OUT_DIR="${2:-out/quickstart}"
SERVER="$BUILD_DIR/server/fl-server"
CLIENT="$BUILD_DIR/client/fl-client"
NUM_CLIENTS=4
ROUNDS="${FL_QUICKSTART_ROUNDS:-3}"

for bin in "$SERVER" "$CLIENT"; do
  [[ -x "$bin" ]] || { echo "quickstart: $bin is missing; build first (./fl.sh demo does)" >&2; exit 2; }
done
mkdir -p "$OUT_DIR"
DB="$OUT_DIR/records.db"
PORT_FILE="$OUT_DIR/port"
rm -f "$DB" "$DB-wal" "$DB-shm" "$PORT_FILE"
rm -rf "$OUT_DIR/checkpoints"

pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  sleep 0.5
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'echo "quickstart: interrupted" >&2; exit 130' INT TERM

# FL_QUICKSTART_INSTRUMENTATION=off runs without records and checkpoints (the "off" side of
# bench/instrumentation_overhead.sh); FL_QUICKSTART_SERVER_ARGS adds server flags (e.g. --metrics-addr).
instrumentation=(--db "$DB" --checkpoint-dir "$OUT_DIR/checkpoints")
[[ "${FL_QUICKSTART_INSTRUMENTATION:-on}" == off ]] && instrumentation=()
read -r -a extra_server_args <<<"${FL_QUICKSTART_SERVER_ARGS:-}"

start=$(date +%s)
"$SERVER" --listen 127.0.0.1:0 --port-file "$PORT_FILE" "${instrumentation[@]}" "${extra_server_args[@]}" \
  --experiment-name quickstart --rounds "$ROUNDS" --strategy fedavg \
  --min-fit-clients "$NUM_CLIENTS" --min-available-clients "$NUM_CLIENTS" \
  --local-epochs 1 --batch-size 32 --lr 0.02 --momentum 0.9 --client-optimizer sgd \
  --round-deadline-ms 120000 --seed 1 --log-level warn &
server_pid=$!
pids+=("$server_pid")

for _ in $(seq 100); do [[ -s "$PORT_FILE" ]] && break; sleep 0.1; done
[[ -s "$PORT_FILE" ]] || { echo "quickstart: fl-server did not start" >&2; exit 1; }
port=$(cat "$PORT_FILE")

for i in $(seq 0 $((NUM_CLIENTS - 1))); do
  # One training thread each: 4 clients share this machine's cores.
  "$CLIENT" --server "127.0.0.1:$port" --name "client-$i" --model cnn --partition iid \
    --client-index "$i" --num-clients "$NUM_CLIENTS" --partition-seed 1 --init-seed 1 --threads 1 \
    --device cpu --link-kind ethernet --log-level warn &
  pids+=("$!")
done

status=0
wait "$server_pid" || status=$?
for pid in "${pids[@]:1}"; do wait "$pid" || status=$((status == 0 ? $? : status)); done
pids=()
echo "quickstart: $(( $(date +%s) - start )) s; records in $DB"
exit "$status"

#!/usr/bin/env bash
# 1-bit Adam with churn on the char LM (docs/diloco.md, "Churn in 1-bit Adam"): fl-coordinator --sync-mode
# onebit-adam and three fl-island processes over mutual TLS and CurveZMQ, the manifests' model (d_model 64,
# 3 blocks, 4 heads, context 64, batch 16, lr 3e-3). Two runs of T steps, W exact steps, windows of K:
#   steady: the three islands from start to end;
#   churn:  island-2 SIGKILLed once island-0 committed KILL_AFTER windows, island-3 started late once it committed
#           JOIN_AFTER, and the other two to the end.
# Prints each island's summary line (eval loss, state hash, steps, bytes, the joiner's state copy in bytes and ms).
# Usage: experiments/diloco/onebit_churn.sh BUILD_DIR OUT_DIR   (env: T W K KILL_AFTER JOIN_AFTER RUNS)
set -euo pipefail
build=${1:?build dir, e.g. build/release}
out=${2:?output dir}
T=${T:-300} W=${W:-50} K=${K:-50} KILL_AFTER=${KILL_AFTER:-2} JOIN_AFTER=${JOIN_AFTER:-3}
island_bin=$build/diloco/island/fl-island
coord_bin=$build/diloco/coord/fl-coordinator
provision=$build/pki/fl-provision
for b in "$island_bin" "$coord_bin" "$provision"; do [[ -x $b ]] || { echo "missing $b" >&2; exit 2; }; done

windows() {  # committed windows in an island's metrics file (0 before it exists)
  local n
  n=$(grep -c '"event":"sync"' "$1" 2>/dev/null) || true
  echo "${n:-0}"
}
wait_windows() {  # file n
  while (($(windows "$1") < $2)); do sleep 0.2; done
}

run() {  # name churn(0|1)
  local dir=$out/$1 churn=$2
  rm -rf "$dir" && mkdir -p "$dir"
  "$provision" init --dir "$dir/pki" >/dev/null
  "$provision" add-server coordinator --dir "$dir/pki" --ip 127.0.0.1 >/dev/null
  for i in 0 1 2 3; do "$provision" add-island "island-$i" --dir "$dir/pki" >/dev/null; done
  "$coord_bin" --listen 127.0.0.1:0 --port-file "$dir/port" --db "$dir/records.db" --sync-mode onebit-adam \
    --inner-steps "$K" --outer-steps $((T / K)) --min-islands 3 --codec fp32 --error-feedback \
    --heartbeat-timeout-ms 10000 --exchange-timeout-ms 30000 \
    --tls-cert "$dir/pki/server/coordinator.crt" --tls-key "$dir/pki/server/coordinator.key" \
    --tls-client-ca "$dir/pki/ca/ca.crt" >"$dir/coordinator.log" 2>&1 &
  local coord=$!
  while [[ ! -s $dir/port ]]; do sleep 0.1; done
  local address=127.0.0.1:$(cat "$dir/port")
  local -a pids=()
  start() {  # i
    local id=island-$1
    # island-3 replaces island-2: it trains on island-2's shard
    "$island_bin" --island-id "$id" --shard $(($1 == 3 ? 2 : $1)) --num-shards 3 --coordinator "$address" \
      --data-endpoint "tcp://127.0.0.1:$((20000 + RANDOM % 20000))" --summary "$dir/$id.json" --metrics "$dir/$id.jsonl" \
      --tls-ca "$dir/pki/ca/ca.crt" --tls-cert "$dir/pki/islands/$id.crt" --tls-key "$dir/pki/islands/$id.key" \
      --mode onebit-adam --onebit-warmup-steps "$W" --onebit-chunk 256 --model char-lm --d-model 64 --layers 3 \
      --heads 4 --context 64 --batch-size 16 --seed 1 --threads 1 --inner-lr 3e-3 --warmup-steps 50 \
      >"$dir/$id.log" 2>&1 &
    pids[$1]=$!
  }
  for i in 0 1 2; do start "$i"; done
  if ((churn)); then
    wait_windows "$dir/island-0.jsonl" "$KILL_AFTER"
    kill -KILL "${pids[2]}"
    wait "${pids[2]}" || true
    wait_windows "$dir/island-0.jsonl" "$JOIN_AFTER"
    start 3
  fi
  for i in 0 1 3 2; do
    if ((i == 2 && churn)) || ((i == 3 && !churn)); then continue; fi
    wait "${pids[$i]}"
  done
  kill -TERM "$coord" 2>/dev/null || true
  wait "$coord" || true
  for f in "$dir"/island-*.json; do echo "$1 $(basename "$f" .json) $(cat "$f")"; done
}

mkdir -p "$out"
echo "load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in ${RUNS:-steady churn}; do run "$r" $([[ $r == churn ]] && echo 1 || echo 0); done
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"

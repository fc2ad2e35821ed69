#!/bin/bash
# Peak RSS of one fl-client --instances N (docs/performance.md, "Virtual clients"): a plaintext fl-server on
# loopback, one round of 2 local steps, every instance selected, N shards; the client's peak RSS from
# /usr/bin/time. Usage: experiments/virtual-clients/rss.sh BUILD_DIR N MODEL   (MODEL: cnn, synthetic:100000, ...)
# Prints: N MODEL peak_rss_kB wall_s rc=EXIT and fl-client's own memory estimate.
set -u
B=$1; N=$2; MODEL=$3
D=$(mktemp -d /tmp/fl-virtual-rss.XXXX)
"$B/server/fl-server" --listen 127.0.0.1:0 --port-file "$D/port" --db "" --rounds 1 --min-fit-clients "$N" \
  --min-available-clients "$N" --evaluate-every 0 --round-deadline-ms 600000 --linger-s 0 --log-level warn \
  --local-steps 2 --insecure > "$D/server.log" 2>&1 &
SP=$!
for _ in $(seq 600); do [ -s "$D/port" ] && break; sleep 0.05; done
PORT=$(cat "$D/port")
/usr/bin/time -f "%M %e" -o "$D/time" "$B/client/fl-client" --server "127.0.0.1:$PORT" --name v --instances "$N" \
  --num-clients "$N" --model "$MODEL" --threads 1 --give-up-after-s 120 --insecure > "$D/client.log" 2>&1
RC=$?
wait $SP
echo "$N $MODEL $(cat "$D/time") rc=$RC $(grep -o 'memory .*' "$D/client.log" | head -1)"
rm -rf "$D"

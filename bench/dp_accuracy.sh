#!/bin/bash
# The CNN on Fashion-MNIST under central differential privacy at several epsilon, against no DP (docs/privacy.md,
# "Accuracy at epsilon 1, 4 and 8"): fl-server on loopback, one fl-client hosting N virtual clients (N IID shards),
# K of them sampled per round (q = K/N), T rounds, adaptive clipping (C starts at 0.1 and follows the median update
# norm). For each target epsilon, sigma comes from `fl-privacy noise` for (q, T, delta). Writes DIR/<label>.csv
# (round, accuracy, epsilon) from the records, for bench/dp_accuracy_plot.py.
# Usage: bench/dp_accuracy.sh BIN_DIR OUT_DIR [N K T]   (BIN_DIR holds fl-server, fl-client, fl-privacy, fl-report)
set -eu
B=$1; OUT=$2; N=${3:-1000}; K=${4:-100}; T=${5:-50}
DELTA=1e-5
mkdir -p "$OUT"
Q=$(python3 -c "print($K/$N)")
run() {  # label, extra server flags...
  local label=$1; shift
  local D="$OUT/$label"; rm -rf "$D"; mkdir -p "$D"
  nice -n 10 "$B/fl-server" --listen 127.0.0.1:0 --port-file "$D/port" --db "$D/records.db" --rounds "$T" \
    --min-fit-clients "$K" --min-available-clients "$N" --fraction-fit "$Q" --fraction-evaluate 0.2 \
    --evaluate-every 2 --local-steps 5 --batch-size 32 --lr 0.05 --round-deadline-ms 600000 --linger-s 0 \
    --seed 1 --insecure "$@" > "$D/server.log" 2>&1 &
  local sp=$!
  for _ in $(seq 600); do [ -s "$D/port" ] && break; sleep 0.05; done
  local start=$(date +%s)
  nice -n 10 "$B/fl-client" --server "127.0.0.1:$(cat "$D/port")" --name v --instances "$N" --num-clients "$N" \
    --model cnn --threads 1 --give-up-after-s 120 --insecure > "$D/client.log" 2>&1
  wait $sp
  echo "$label: $(( $(date +%s) - start )) s; $(grep -o 'finished: .*' "$D/server.log" | tail -1)"
  "$B/fl-report" "$D/records.db" --table rounds --format csv > "$D/rounds.csv"
  python3 - "$D/rounds.csv" "$D/server.log" > "$OUT/$label.csv" <<'PY'
import csv, re, sys
eps = {}
for line in open(sys.argv[2]):
    m = re.search(r"round (\d+): epsilon ([0-9.e+]+)", line)
    if m: eps[int(m.group(1))] = m.group(2)
print("round,accuracy,epsilon")
for r in csv.DictReader(open(sys.argv[1])):
    if r["status"] == "committed" and r["eval_accuracy"]:
        print(f'{r["round"]},{r["eval_accuracy"]},{eps.get(int(r["round"]), "")}')
PY
}
run nodp
for e in 8 4 1; do
  SIGMA=$("$B/fl-privacy" noise --target-epsilon "$e" --sampling-rate "$Q" --steps "$T" --delta "$DELTA" |
          sed -n 's/^noise_multiplier: //p')
  echo "epsilon $e: sigma $SIGMA"
  run "eps$e" --dp-noise-multiplier "$SIGMA" --dp-population "$N" --dp-delta "$DELTA" --dp-clipping adaptive \
    --dp-clip-norm 0.1 --dp-target-quantile 0.5 --dp-clip-learning-rate 0.2 \
    --dp-clipped-count-stddev "$(python3 -c "print($K/20)")"
done

#!/usr/bin/env bash
# Issue 34: fl-client and fl-island on a GPU, run for real, in one go on a lent GPU machine (docs/diloco-gpu.md).
#
#   tools/gpu/run_on_device.sh                  # on the GPU machine: --device cuda, then the CPU reference runs
#   FL_GPU_DEVICES=cpu FL_GPU_TORCH_LIB= tools/gpu/run_on_device.sh   # rehearsal on a machine without a GPU
#
# What it needs (tools/gpu/make_bundle.sh puts it in .gpu/, git-ignored, carried to the device):
#   .gpu/bundle.tar.xz   bin/ (fl-server, fl-client, fl-island, fl-coordinator, fl-provision, built against the
#                        device's CUDA LibTorch) and lib/ (the Debian libraries they need that Ubuntu lacks)
#   .gpu/fmnist/         Fashion-MNIST IDX files (the training set shortened, its header count fixed)
#   .gpu/fortunes/       the char-lm corpus (Debian's fortunes-min)
#   .gpu/models/         TorchScript models exported by examples/bring-your-own-model/export_models.py
# LibTorch, CUDA and NCCL come from the device's PyTorch (python3 -c 'import torch'): torch/lib and the
# nvidia/*/lib folders beside it go on LD_LIBRARY_PATH of our binaries only.
#
# Steps (each under its own `timeout`; a failing step is reported and the next one runs):
#   probe       nvidia-smi, torch, ldd of every binary, fl-island --show-device (auto, cuda)
#   fed-*       fl-server (CPU, mutual TLS) + 2 fl-clients --device D: the built-in CNN, then cnn_bn.pt
#   nccl1       one fl-island in the data-parallel baseline over one c10d group: NCCL with 1 rank on CUDA
#   isl-*       fl-coordinator + 2 fl-islands (1 rank each) --device D over the mutual-TLS/CurveZMQ ring:
#               char-lm (the default transformer) and the CNN
# nvidia-smi samples utilisation every 200 ms in the background; phases.txt has each step's start and end.
# Everything lands in $OUT: run.log and results.tgz (logs, summaries, metrics, SQLite records, smi.csv).
set -u
OUT=${OUT:-/tmp/fl-gpu-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
G=${FL_GPU_BUNDLE:-$ROOT/.gpu}
W=${FL_GPU_WORK:-/tmp/fl-gpu}
DEVICES=${FL_GPU_DEVICES:-cuda cpu}
SCALE=${FL_GPU_SCALE:-1}  # rehearsal: fewer steps
rm -rf "$W" && mkdir -p "$W/res"
R=$W/res
now() { date +%s.%N; }
save() { tar -C "$W" -czf "$OUT/results.tgz.tmp" res 2> /dev/null && mv "$OUT/results.tgz.tmp" "$OUT/results.tgz"; }
phase() { echo "$1 $2 $(now)" >> "$R/phases.txt"; echo "=== $(date -u +%T) $1 $2"; }

# ---- our binaries and their libraries
if [ -f "$G/bundle.tar.xz" ]; then tar -C "$W" -xJf "$G/bundle.tar.xz"; else cp -r "$G/bin" "$G/lib" "$W/"; fi
BIN=$W/bin
export FL_DATA=${FL_GPU_DATA:-$G/fmnist}
FORTUNES=${FL_GPU_FORTUNES:-$G/fortunes}
MODELS=${FL_GPU_MODELS:-$G/models}

phase probe start
uname -a; grep PRETTY /etc/os-release; nproc
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 || echo "no nvidia-smi"
if [ -z "${FL_GPU_TORCH_LIB+x}" ]; then
  TORCH_DIR=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))' 2>/dev/null)
  python3 -c 'import torch; print("torch", torch.__version__, torch.__file__, "cuda", torch.version.cuda, torch.cuda.is_available())'
  FL_GPU_TORCH_LIB=$TORCH_DIR/lib
  for d in "$TORCH_DIR"/../nvidia/*/lib; do [ -d "$d" ] && FL_GPU_TORCH_LIB=$FL_GPU_TORCH_LIB:$(cd "$d" && pwd); done
fi
LDP=$W/lib${FL_GPU_TORCH_LIB:+:$FL_GPU_TORCH_LIB}
echo "LD_LIBRARY_PATH for our binaries: $LDP"
fl() { LD_LIBRARY_PATH=$LDP "$@"; }
for b in "$BIN"/*; do
  missing=$(LD_LIBRARY_PATH=$LDP ldd "$b" | grep "not found")
  echo "ldd $(basename "$b"): ${missing:-all found}"
  LD_LIBRARY_PATH=$LDP ldd "$b" | grep -E "torch|c10|cudart|nccl|nvrtc" | sed 's/^/    /'
done
for d in auto cuda cpu; do
  echo "-- fl-island --show-device --device $d"
  fl timeout 60 "$BIN/fl-island" --show-device --device "$d"; echo "rc=$?"
done
echo "-- fl-island --show-device --device cuda --cuda-device 3 (one GPU: a usage error naming 0..0)"
fl timeout 60 "$BIN/fl-island" --show-device --device cuda --cuda-device 3; echo "rc=$?"
phase probe end

# ---- utilisation sampler
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=timestamp,utilization.gpu,utilization.memory,memory.used,power.draw,clocks.sm \
    --format=csv,noheader,nounits -lms 200 > "$R/smi.csv" 2> "$R/smi.err" &
  SMI=$!
fi

# ---- certificates (mutual TLS, as fl-experiment and the launcher use them)
PKI=$W/pki
fl "$BIN/fl-provision" init --dir "$PKI" --server-ip 127.0.0.1 > "$R/pki.log" 2>&1 || echo "fl-provision init failed"
for c in c0 c1; do fl "$BIN/fl-provision" add-client --dir "$PKI" "$c" >> "$R/pki.log" 2>&1; done
for i in island-0 island-1; do fl "$BIN/fl-provision" add-island --dir "$PKI" "$i" >> "$R/pki.log" 2>&1; done

PORTS=31000
wait_port() {  # file, seconds
  for _ in $(seq 1 $(($2 * 10))); do [ -s "$1" ] && { cat "$1"; return 0; }; sleep 0.1; done
  return 1
}

# fed NAME DEVICE ROUNDS STEPS MODEL [client args...]: fl-server on the CPU + 2 fl-clients on DEVICE
skip() { [ -n "${FL_GPU_SKIP:-}" ] && [[ $1 =~ $FL_GPU_SKIP ]]; }  # rehearsal: FL_GPU_SKIP=REGEX of step names

fed() {
  local name=$1 dev=$2 rounds=$3 steps=$4 model=$5; shift 5
  FED_RC=0
  skip "$name" && return
  local d=$R/$name; mkdir -p "$d"
  phase "$name" start
  fl timeout 150 "$BIN/fl-server" --listen 127.0.0.1:0 --port-file "$d/port" --db "$d/records.db" \
    --experiment-name "$name" --rounds "$rounds" --local-steps "$steps" --batch-size 32 --lr 0.05 \
    --min-fit-clients 2 --min-available-clients 2 --linger-s 1 \
    --tls-cert "$PKI/server/server.crt" --tls-key "$PKI/server/server.key" --tls-client-ca "$PKI/ca/ca.crt" \
    > "$d/server.log" 2>&1 &
  local srv=$!
  local port; port=$(wait_port "$d/port" 30) || { echo "$name: fl-server did not listen"; tail "$d/server.log"; }
  local pids=()
  for i in 0 1; do
    fl timeout 140 "$BIN/fl-client" --server "127.0.0.1:$port" --name "c$i" --client-index "$i" --num-clients 2 \
      --device "$dev" --model "$model" --data-dir "$FL_DATA" "$@" \
      --tls-ca "$PKI/ca/ca.crt" --tls-cert "$PKI/clients/c$i.crt" --tls-key "$PKI/clients/c$i.key" \
      > "$d/client$i.log" 2>&1 &
    pids+=($!)
  done
  FED_RC=0
  for i in 0 1; do wait "${pids[$i]}"; local rc=$?; echo "$name: client$i rc=$rc"; [ $rc = 0 ] || FED_RC=$rc; done
  wait $srv; echo "$name: fl-server rc=$?"
  phase "$name" end
  grep -h -i -m3 "device\|cuda" "$d/client0.log" | cut -c1-300
  tail -n 3 "$d/server.log" | cut -c1-300
  sqlite3_summary "$d/records.db"
}

sqlite3_summary() {
  python3 - "$1" <<'EOF' || true
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
try:
    for r in db.execute("SELECT client_name, device_class, accelerator FROM clients"): print("  client", r)
    for r in db.execute("SELECT round, client_id, num_steps, train_ms, eval_ms FROM client_rounds WHERE train_ms > 0 ORDER BY round, client_id"):
        print("  round %s client %s: %s steps in %.0f ms = %.1f steps/s (eval %.0f ms)" % (r[0], r[1], r[2], r[3], r[2] / r[3] * 1000 if r[3] else 0, r[4] or 0))
    for r in db.execute("SELECT round, status, duration_ms, train_loss, eval_loss, eval_accuracy FROM rounds ORDER BY round"):
        print("  round %s %s: %.0f ms, train loss %.4f, eval loss %s, accuracy %s" % r)
except Exception as e:
    print("  (records:", e, ")")
EOF
}

# isl NAME DEVICE INNER OUTER [island args...]: fl-coordinator + 2 fl-islands of 1 rank on DEVICE
isl() {
  local name=$1 dev=$2 inner=$3 outer=$4; shift 4
  skip "$name" && return
  local d=$R/$name; mkdir -p "$d"
  phase "$name" start
  fl timeout 150 "$BIN/fl-coordinator" --listen 127.0.0.1:0 --port-file "$d/port" --db "$d/records.db" \
    --experiment-name "$name" --inner-steps "$inner" --outer-steps "$outer" --min-islands 2 \
    --tls-cert "$PKI/server/server.crt" --tls-key "$PKI/server/server.key" --tls-client-ca "$PKI/ca/ca.crt" \
    > "$d/coordinator.log" 2>&1 &
  local co=$!
  PORTS=$((PORTS + 10))  # fresh ring and store ports for every run
  local port; port=$(wait_port "$d/port" 30) || { echo "$name: fl-coordinator did not listen"; tail "$d/coordinator.log"; }
  local pids=()
  for i in 0 1; do
    fl timeout 140 "$BIN/fl-island" --island-id "island-$i" --shard "$i" --num-shards 2 --device "$dev" \
      --coordinator "127.0.0.1:$port" --data-endpoint "tcp://127.0.0.1:$((PORTS + i))" \
      --pg-store "127.0.0.1:$((PORTS + 2 + i))" \
      --summary "$d/island-$i.json" --metrics "$d/island-$i.jsonl" \
      --tls-ca "$PKI/ca/ca.crt" --tls-cert "$PKI/islands/island-$i.crt" --tls-key "$PKI/islands/island-$i.key" \
      "$@" > "$d/island-$i.log" 2>&1 &
    pids+=($!)
  done
  for i in 0 1; do wait "${pids[$i]}"; echo "$name: island-$i rc=$?"; done
  kill -TERM $co 2> /dev/null; wait $co
  phase "$name" end
  python3 -c 'import sqlite3,sys; [print("  joined", r) for r in sqlite3.connect(sys.argv[1]).execute("SELECT island_id, num_ranks, device_class, accelerator FROM islands")]' "$d/records.db" 2>&1
  grep -h -m1 "device" "$d/island-0.log" | cut -c1-300
  for i in 0 1; do
    python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print(" ", s["island_id"], "steps", s["steps"], "compute_s %.2f" % s["compute_s"], "wall_s %.2f" % s["wall_s"], "steps/s %.1f" % (s["steps"] / s["compute_s"]), "outer", s["outer_steps"], "eval %.4f" % s["final_eval_loss"], "state", s["state_hash"], "local", s["local_model_hash"])' "$d/island-$i.json" 2>&1 || tail -n 5 "$d/island-$i.log"
  done
}

# nccl1 DEVICE: one island, data-parallel baseline over one c10d group of 1 rank (NCCL on CUDA, Gloo on CPU)
nccl1() {
  skip "nccl1-$1" && return
  local d=$R/nccl1-$1; mkdir -p "$d"
  phase "nccl1-$1" start
  NCCL_DEBUG=INFO fl timeout 120 "$BIN/fl-island" --insecure --island-id island-0 --device "$1" --mode data-parallel \
    --dp-transport gloo --model cnn --data-dir "$FL_DATA" --total-steps $((200 / SCALE)) --pg-store 127.0.0.1:29600 \
    --summary "$d/island-0.json" > "$d/island-0.log" 2>&1
  echo "nccl1-$1: rc=$?"
  phase "nccl1-$1" end
  grep -h -m3 "device\|NCCL INFO comm\|NCCL version" "$d/island-0.log" | cut -c1-300
  python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print(" ", s)' "$d/island-0.json" 2>&1 | cut -c1-600
}

LM=(--model char-lm --data-dir "$FORTUNES")
# A wider char-lm (3.2 M parameters, 64 x 128 tokens a step) that gives the GPU work; its CPU reference uses 8
# threads per island (the device has 16 cores) and only a few steps.
LMBIG=(--model char-lm --data-dir "$FORTUNES" --d-model 256 --layers 4 --heads 4 --context 128 --batch-size 64)
CNN=(--model cnn --data-dir "$FL_DATA")
for dev in $DEVICES; do
  # Steps per client round / per island sync. The GPU gets more, so that its rate is not start-up; the CPU
  # runs fewer of the same steps (the char-lm's take ~0.3-1 s each on one core).
  if [ "$dev" = cuda ]; then fed_steps=400 lm_inner=200 cnn_inner=200; else fed_steps=100 lm_inner=10 cnn_inner=50; fi
  fed_steps=$((fed_steps / SCALE)) lm_inner=$((lm_inner / SCALE > 0 ? lm_inner / SCALE : 1)) cnn_inner=$((cnn_inner / SCALE))
  fed "fed-cnn-$dev" "$dev" 3 $fed_steps cnn
  save
  fed "fed-script-$dev" "$dev" 3 $fed_steps "$MODELS/cnn_bn.pt" --data "$FL_DATA"
  if [ "$FED_RC" != 0 ] && python3 -c 'import torch' 2> /dev/null; then
    # The carried model was exported by Debian's torch 1.13; export it again with this machine's torch.
    python3 "$ROOT/examples/bring-your-own-model/export_models.py" --out "$W/models" > "$R/export.log" 2>&1
    fed "fed-script2-$dev" "$dev" 3 $fed_steps "$W/models/cnn_bn.pt" --data "$FL_DATA"
  fi
  save
  nccl1 "$dev"
  isl "isl-lm-$dev" "$dev" $lm_inner 5 "${LM[@]}"
  save
  isl "isl-cnn-$dev" "$dev" $cnn_inner 5 "${CNN[@]}"
  save
  if [ "$dev" = cuda ]; then
    isl "isl-lmbig-$dev" "$dev" $((100 / SCALE)) 5 "${LMBIG[@]}"
  else
    isl "isl-lmbig-$dev" "$dev" 2 5 "${LMBIG[@]}" --threads "${FL_GPU_CPU_THREADS:-8}"
  fi
  save
done

[ -n "${SMI:-}" ] && kill "$SMI" 2> /dev/null
python3 - "$R" <<'EOF' || true
# Mean GPU utilisation per phase from smi.csv (timestamps in local time, "YYYY/MM/DD HH:MM:SS.mmm").
import sys, os, datetime
r = sys.argv[1]
if os.path.exists(os.path.join(r, "smi.csv")):
    samples = []
    for line in open(os.path.join(r, "smi.csv")):
        f = [x.strip() for x in line.split(",")]
        try:
            t = datetime.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            samples.append((t, float(f[1]), float(f[3]), float(f[4])))
        except Exception:
            pass
    ph = {}
    for line in open(os.path.join(r, "phases.txt")):
        n, k, t = line.split()
        ph.setdefault(n, {})[k] = float(t)
    for n, v in ph.items():
        if "end" not in v: continue
        s = [x for x in samples if v["start"] <= x[0] <= v["end"]]
        if s:
            busy = [x for x in s if x[1] > 0]
            print("util %-18s %5.1f s  %3d samples  mean util %5.1f %%  busy-sample mean %5.1f %%  peak mem %6.0f MiB  mean power %5.0f W"
                  % (n, v["end"] - v["start"], len(s), sum(x[1] for x in s) / len(s),
                     sum(x[1] for x in busy) / len(busy) if busy else 0, max(x[2] for x in s), sum(x[3] for x in s) / len(s)))
EOF
save
ls -la "$OUT"
echo "=== done $(date -u +%T)"

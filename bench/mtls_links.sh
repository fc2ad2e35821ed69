#!/usr/bin/env bash
# What mutual TLS costs per emulated link (docs/security.md, "What security costs", "Per link"): runs
# experiments/security/links-<link>.yaml (4 clients, synthetic 1M-parameter model, 12 rounds) for each link kind,
# alternating plaintext (`security: {mode: insecure}`) and mutual TLS (the manifest as shipped, a throwaway CA
# per run) REPEATS times, so that drift of this shared machine's load hits both modes alike, then prints per link
# the median round time of each mode (rounds 2..12 of every run, round 1 left out: connections and handshakes),
# the ratio, the spread and the CPU seconds fl-server and the four fl-clients used.
#
# CPU: fl-server's and the clients' utime+stime from /proc/<pid>/stat, read every 0.2 s while the run lasts (the
# last reading before each process exits; a whole run, round 1 included). The kernel backend's shaping (HTB on the
# veths) runs in softirq and is in no process's figure.
#
# Usage: bench/mtls_links.sh [BUILD_DIR] [OUT_DIR]   (defaults: build/release, out/mtls-links)
#   env REPEATS=3 (plaintext/mTLS pairs per link), LINKS="ethernet wifi 5g",
#       BACKEND=auto|kernel|userspace (emulation.backend; auto = kernel as root, else the userspace relay)
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
BUILD_DIR="${1:-build/release}"
OUT="$(readlink -f "${2:-out/mtls-links}")"
REPEATS="${REPEATS:-3}"
LINKS="${LINKS:-ethernet wifi 5g}"
BACKEND="${BACKEND:-auto}"
PY=/usr/bin/python3
EXP="$BUILD_DIR/experiments/fl-experiment"
[[ -x "$EXP" ]] || { echo "no $EXP: cmake --build $BUILD_DIR --target fl-experiment fl-server fl-client" >&2; exit 2; }
mkdir -p "$OUT"
RESULTS="$OUT/results.tsv"   # link mode rep round duration_ms   and   link mode rep cpu comm seconds
: >"$RESULTS"

# Prints "comm cpu_seconds" for every fl-server/fl-client below PID, the last reading of each, when PID is gone.
poll_cpu() {
  "$PY" - "$1" <<'EOF'
import os, sys, time
root = int(sys.argv[1]); tick = os.sysconf("SC_CLK_TCK"); last = {}
def stat(pid):
    with open(f"/proc/{pid}/stat") as f: s = f.read()
    comm = s[s.index("(") + 1:s.rindex(")")]; rest = s[s.rindex(")") + 2:].split()
    return comm, int(rest[1]), (int(rest[11]) + int(rest[12])) / tick   # ppid, utime+stime
while os.path.exists(f"/proc/{root}"):
    procs = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try: procs[int(d)] = stat(d)
            except (OSError, ValueError): pass
    for pid, (comm, ppid, cpu) in procs.items():
        p, depth = ppid, 0
        while p in procs and p != root and depth < 8: p, depth = procs[p][1], depth + 1
        if p == root and comm in ("fl-server", "fl-client"): last[pid] = (comm, cpu)
    time.sleep(0.2)
for comm, cpu in last.values(): print(comm, cpu)
EOF
}

run_one() {  # link mode rep
  local link=$1 mode=$2 rep=$3 dir="$OUT/$1-$2-$3"
  local manifest="experiments/security/links-$link.yaml" m="$OUT/$1-$2.yaml"
  sed -e "s/^security: .*/security: {mode: $([[ $mode == plaintext ]] && echo insecure || echo mtls)}/" \
      -e "s/^name: links-$link-mtls/name: links-$link-$mode/" \
      -e "s/^emulation: {backend: auto,/emulation: {backend: $BACKEND,/" "$manifest" >"$m"
  rm -rf "$dir"; mkdir -p "$dir"
  "$EXP" run "$m" --profiles-dir experiments/profiles --out "$dir" --db "$dir/records.db" >"$dir.txt" 2>&1 &
  local pid=$!
  poll_cpu "$pid" >"$dir/cpu.txt" &
  local poller=$!
  wait "$pid" || { echo "run $link $mode $rep failed: $dir.txt" >&2; wait "$poller"; exit 1; }
  wait "$poller"
  sqlite3 -separator $'\t' "$dir/records.db" \
    "SELECT '$link', '$mode', $rep, round, duration_ms FROM rounds WHERE status = 'committed' ORDER BY round" \
    >>"$RESULTS"
  awk -v l="$link" -v m="$mode" -v r="$rep" '{ s[$1] += $2 } END { for (c in s) printf "%s\t%s\t%s\tcpu\t%s\t%.2f\n", l, m, r, c, s[c] }' \
    "$dir/cpu.txt" >>"$RESULTS"
  echo "$link $mode #$rep: $(grep -o 'link emulation: [a-z]*; transport: [a-zA-Z ]*' "$dir.txt" | head -1)" \
       "rounds $(sqlite3 "$dir/records.db" "SELECT group_concat(printf('%.2f', duration_ms / 1000.0), ' ') FROM rounds WHERE status = 'committed'") s"
}

echo "$(date -u '+%F %T') UTC, $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg), backend: $BACKEND, $REPEATS pairs"
for link in $LINKS; do
  for rep in $(seq 1 "$REPEATS"); do
    run_one "$link" plaintext "$rep"
    run_one "$link" mtls "$rep"
  done
done
echo "$(date -u '+%F %T') UTC, load: $(cut -d' ' -f1-3 /proc/loadavg)"

"$PY" - "$RESULTS" <<'EOF'
import collections, statistics, sys
rounds = collections.defaultdict(list); per_run = collections.defaultdict(list); cpu = collections.defaultdict(list)
links = []
for line in open(sys.argv[1]):
    f = line.rstrip("\n").split("\t")
    if f[0] not in links: links.append(f[0])
    if f[3] == "cpu":
        cpu[(f[0], f[1], f[4])].append(float(f[5]))
    elif int(f[3]) > 1:   # round 1 (connections, TLS handshakes, the first model) is left out
        rounds[(f[0], f[1])].append(float(f[4]) / 1000); per_run[(f[0], f[1], f[2])].append(float(f[4]) / 1000)
med = statistics.median
print("\n| link | round s plaintext: median (min–max) | round s mTLS: median (min–max) | ratio | per pair | "
      "fl-server CPU s plaintext / mTLS | 4 fl-clients CPU s plaintext / mTLS |")
print("|---|---:|---:|---:|---|---:|---:|")
for l in links:
    p, t = rounds[(l, "plaintext")], rounds[(l, "mtls")]
    reps = sorted({k[2] for k in per_run if k[0] == l}, key=int)
    pairs = ", ".join(f"{med(per_run[(l, 'mtls', r)]) / med(per_run[(l, 'plaintext', r)]):.3f}" for r in reps
                      if (l, "mtls", r) in per_run and (l, "plaintext", r) in per_run)
    c = lambda mode, comm: f"{statistics.mean(cpu[(l, mode, comm)]):.2f}" if cpu[(l, mode, comm)] else "-"
    print(f"| {l} | {med(p):.3f} ({min(p):.3f}–{max(p):.3f}) | {med(t):.3f} ({min(t):.3f}–{max(t):.3f}) | "
          f"{med(t) / med(p):.3f} | {pairs} | {c('plaintext', 'fl-server')} / {c('mtls', 'fl-server')} | "
          f"{c('plaintext', 'fl-client')} / {c('mtls', 'fl-client')} |")
print(f"\nrounds 2..N of every run pooled ({len(p)} per mode for the last link); CPU: mean per run, whole run")
EOF

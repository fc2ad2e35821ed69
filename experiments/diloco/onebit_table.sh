#!/bin/bash
# The comparison of docs/diloco.md ("Syncing every step with few bits, or rarely with whole models"): the same
# model, tokens and islands over two emulated inter-site links, for data-parallel Adam (fp32 and int8 over the
# ring), 1-bit Adam, DiLoCo (H = 100, int8) and Streaming DiLoCo (4 fragments, overlap, fp4).
#
#   experiments/diloco/onebit_table.sh BUILD OUT [JOBS]
#     BUILD  a build folder (build/release) or a folder holding fl-islands-run, fl-island and fl-coordinator
#     OUT    where each run's folder, derived manifests and table.md go
#     JOBS   runs at a time (default 1; the bytes and losses do not depend on it, the wall times do)
# Environment: LINKS (default "wan-1gbit-10ms wan-100mbit-40ms"), METHODS (manifest names, default the five
# below), STEPS (inner.total_steps for every run; default: the manifests' 600; 1-bit Adam's W scales with it),
# MODEL (char-lm, the manifests' own, by default; gru: the TorchScript GRU language model below).
#
# MODEL=gru swaps each manifest's model: block for TinyLm of examples/bring-your-own-model (byte embedding 64,
# nn.GRU 128, linear 256: 123,904 parameters), exported with torch.jit.trace by export_models.py (Debian's
# python3-torch, seeded: the same weights every time) into OUT/byom/tiny_lm.pt, or the file GRU_PT names.
# Everything else stays the manifest's: the fortunes text, batch 16 x context 64 per rank (the same tokens a
# step), AdamW and its schedule, the links, codecs and sync schedules.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:?usage: onebit_table.sh BUILD OUT [JOBS]}"
out="${2:?usage: onebit_table.sh BUILD OUT [JOBS]}"
jobs="${3:-1}"
if [ -x "$build/fl-islands-run" ]; then
  run="$build/fl-islands-run"; island="$build/fl-island"; coordinator="$build/fl-coordinator"
else
  run="$build/experiments/fl-islands-run"; island="$build/diloco/island/fl-island"
  coordinator="$build/diloco/coord/fl-coordinator"
fi
[ -x "$run" ] || { echo "no fl-islands-run under $build (build it: ninja -C $build fl-islands-run fl-island fl-coordinator)" >&2; exit 2; }
links="${LINKS:-wan-1gbit-10ms wan-100mbit-40ms}"
methods="${METHODS:-adam_dp_fp32 adam_dp_int8 onebit_adam diloco onebit_table_streaming_fp4}"
model="${MODEL:-char-lm}"
mkdir -p "$out/manifests"
case "$model" in
  char-lm) ;;
  gru)
    gru_pt="${GRU_PT:-$out/byom/tiny_lm.pt}"
    if [ -z "${TABLE_ONLY:-}" ] && [ ! -f "$gru_pt" ]; then
      /usr/bin/python3 "$here/../../examples/bring-your-own-model/export_models.py" --out "$(dirname "$gru_pt")" \
        > "$out/export.log" 2>&1 || { echo "exporting the GRU failed: see $out/export.log (needs python3-torch)" >&2; exit 2; }
    fi
    gru_pt="$(realpath "$gru_pt")";;  # fl-island runs elsewhere: an absolute path
  *) echo "MODEL is '$model'; use char-lm or gru" >&2; exit 2;;
esac

one() {  # method link
  local m="$1" link="$2" dir="$out/$1-$2" manifest="$out/manifests/$1-$2.yaml"
  # The manifest with this link (an absolute path: the copy lives elsewhere) and, with STEPS, the run length.
  sed -e "s|^wan: .*|wan: $here/../profiles/links/$link.yaml|" -e "s|^name: \(.*\)|name: \1-$link|" \
    "$here/$m.yaml" > "$manifest"
  if [ "$model" = gru ]; then
    # The model: block (up to the next top-level key) becomes the GRU's, keeping the manifest's context, batch
    # and seed; the char LM's d_model, layers and heads mean nothing to a TorchScript model.
    # The name stays the manifest's: fl-islands-run puts it in its CA's common name, which OpenSSL caps at 64
    # characters, and streaming-p4-overlap5-fp4-wan-100mbit-40ms already fills it.
    python3 - "$manifest" "$gru_pt" <<'PY'
import re, sys
path, pt = sys.argv[1:]
text = open(path).read()
block = re.search(r"^model:\n((?: .*\n|\n)*)", text, re.M)
keep = "".join(line + "\n" for line in block.group(1).splitlines()
               if re.match(r"  (context|batch_size|seed):", line))
gru = (f"model:\n  name: {pt}   # TinyLm (TorchScript): byte embedding, nn.GRU, linear\n"
       "  data: /usr/share/games/fortunes\n  task: next-token\n" + keep)
text = text[:block.start()] + gru + text[block.end():]
open(path, "w").write(text)
PY
  fi
  if [ -n "${STEPS:-}" ]; then
    sed -i -e "s|^  total_steps: [0-9]*|  total_steps: $STEPS|" "$manifest"
    # 1-bit Adam's warm-up keeps its share of the run (1/6); data-parallel Adam's stays the whole run.
    if grep -q "warmup_steps: 600 " "$manifest"; then sed -i "s|^  warmup_steps: 600 |  warmup_steps: $STEPS |" "$manifest"
    else sed -i "s|^  warmup_steps: 100 |  warmup_steps: $((STEPS / 6)) |" "$manifest"; fi
  fi
  local load
  load="$(cut -d' ' -f1-3 /proc/loadavg)"
  if "$run" --manifest "$manifest" --out "$dir" --fl-island "$island" --fl-coordinator "$coordinator" \
    > "$dir.stdout" 2> "$dir.stderr"; then
    echo "$load $(cut -d' ' -f1-3 /proc/loadavg)" > "$dir/loadavg"
    echo "done $m $link"
  else
    echo "FAILED $m $link: see $dir.stderr" >&2
  fi
}

# TABLE_ONLY=1: only the table, from the runs already in OUT.
pids=()
[ -n "${TABLE_ONLY:-}" ] && links_to_run="" || links_to_run="$links"
for link in $links_to_run; do
  for m in $methods; do
    one "$m" "$link" &
    pids+=($!)
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do sleep 2; done
  done
done
wait

# The table: one row per run, from result.json and the islands' summaries.
# "network, ring model": what the syncs cost on the link alone, 2 ring hops per sync for 2 islands, each one
# way delay + half of what the island sends in the sync at the link's rate: syncs x 2 x delay + 8 x bytes / rate.
python3 - "$out" "$here/../profiles/links" $links -- $methods <<'EOF' | tee "$out/table.md"
import json, os, re, sys
out, profiles = sys.argv[1], sys.argv[2]
sep = sys.argv.index("--")
links, methods = sys.argv[3:sep], sys.argv[sep + 1:]
def link_of(name):
    text = open(os.path.join(profiles, name + ".yaml")).read().split("downlink:")[0]
    rate = re.search(r"rate: *([0-9.]+) *([kmg])bit", text)
    scale = {"k": 1e3, "m": 1e6, "g": 1e9}[rate.group(2)]
    return float(rate.group(1)) * scale, float(re.search(r"delay_ms: *([0-9.]+)", text).group(1)) / 1e3
print("| method | link | final eval loss | bytes sent per island | peak bytes / sync, per island | syncs | "
      "network, ring model (s) | waited on the exchange (s) | wall s | compute utilisation | load (start; end) |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for link in links:
    for m in methods:
        d = os.path.join(out, f"{m}-{link}")
        try:
            r = json.load(open(os.path.join(d, "result.json")))
        except OSError:
            print(f"| {m} | {link} | (no result) | | | | | | |")
            continue
        isl = [json.load(open(os.path.join(d, f))) for f in sorted(os.listdir(d))
               if f.startswith("island-") and f.endswith("-rank0.json")]
        util = sum(i["compute_s"] / i["wall_s"] for i in isl) / len(isl)
        syncs = max(i["syncs"] for i in isl)
        waited = sum(i["wait_s"] for i in isl) / len(isl)
        load = open(os.path.join(d, "loadavg")).read().split()
        rate, delay = link_of(link)
        per_island = r["bytes_sent"] // len(isl)
        network = syncs * 2 * delay + 8 * per_island / rate
        print(f"| {r['method']} | {link} | {r['final_eval_loss']:.4f} | {per_island:,} | "
              f"{r['peak_sync_bytes']:,} | {syncs} | {network:.1f} | {waited:.1f} | {r['wall_s']:.0f} | "
              f"{100 * util:.0f}% | {load[0]}; {load[3]} |")
EOF

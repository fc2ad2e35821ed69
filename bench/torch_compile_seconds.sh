#!/usr/bin/env bash
# LibTorch's compile cost per translation unit, with and without the precompiled <torch/torch.h> (issue 32 item 2;
# docs/performance.md, "Build: LibTorch's compile cost").
#
# Two configured build trees of the same source: REF configured with -DFL_TORCH_PCH=OFF (the reference: every
# file parses <torch/torch.h> itself) and NEW with the default ON. Every translation unit that includes LibTorch
# (found with the preprocessor among the files of targets that see LibTorch's headers) is compiled from the trees'
# own compile_commands.json, one compiler at a time, ccache bypassed (CCACHE_DISABLE=1; the commands themselves have
# no launcher), the object written to a scratch folder: REF's command, then NEW's, file after file, so that both see
# the same load (the machine is shared). NEW's precompiled headers (cmake_pch.hxx.gch) are built first, into NEW's
# tree where its commands look for them, and counted: a PCH costs once per target.
#
# Reports per file: CPU seconds (user + sys, less sensitive to other load than wall time) and wall seconds for REF
# and NEW, and NEW/REF; then the totals with NEW's PCH builds added. Load average at start and end.
#
# Usage: [FL_BENCH_KEEP_PCH=1] bench/torch_compile_seconds.sh REF_BUILD_DIR NEW_BUILD_DIR [FILE_REGEX]
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
[[ $# -ge 2 ]] || { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
REF="$(readlink -f "$1")"
NEW="$(readlink -f "$2")"
REGEX="${3:-.}"
for d in "$REF" "$NEW"; do
  [[ -f $d/compile_commands.json ]] || { echo "torch_compile_seconds: no $d/compile_commands.json: configure it" >&2; exit 2; }
done
[[ -x /usr/bin/time ]] || { echo "torch_compile_seconds: /usr/bin/time missing (apt-get install time)" >&2; exit 2; }
SCRATCH=$(mktemp -d /tmp/fl_torch_compile.XXXXXX)
trap 'rm -rf "$SCRATCH"' EXIT
export CCACHE_DISABLE=1

# Lines "<directory> <output> <file> <command>", separated by \x1f (a tab is whitespace to read: empty fields would
# collapse), from a tree's compile_commands.json: every entry with LibTorch's
# include directory on its command line (PCH builds: file cmake_pch.hxx.cxx).
commands() {
  python3 - "$1" <<'EOF'
import json, shlex, sys
for e in json.load(open(sys.argv[1] + "/compile_commands.json")):
    cmd = e.get("command") or shlex.join(e["arguments"])
    if "torch/csrc/api/include" not in cmd:
        continue
    args = shlex.split(cmd)
    out = e.get("output") or (args[args.index("-o") + 1] if "-o" in args else "")
    print("\x1f".join([e["directory"], out, e["file"], cmd]))
EOF
}

# Runs `command` (a compile command) in `dir` with its -o redirected to `out`; prints "cpu wall".
timed() {
  local dir=$1 out=$2 cmd=$3
  cmd="$(sed -E "s# -o [^ ]+# -o ${out}#" <<<"$cmd")"
  (cd "$dir" && /usr/bin/time -f '%U %S %e' -o "$SCRATCH/t" bash -c "$cmd" >"$SCRATCH/log" 2>&1 </dev/null) ||
    { echo "torch_compile_seconds: failed in $dir: $cmd" >&2; cat "$SCRATCH/log" >&2; exit 1; }
  awk '{printf "%.1f %.1f\n", $1 + $2, $3}' "$SCRATCH/t"
}

# Whether a compile command's file includes LibTorch: its dependency list (-M) names torch/torch.h or torch/script.h.
includes_torch() {
  local dir=$1 cmd=$2
  cmd="$(python3 - "$cmd" <<'EOF'
import shlex, sys
args, out, skip = shlex.split(sys.argv[1]), [], False
for a in args:
    if skip:
        skip = False
    elif a in ("-o", "-MT", "-MF", "-MQ"):
        skip = True
    elif a not in ("-MD", "-MMD"):
        out.append(a)
print(shlex.join(out + ["-M"]))
EOF
)"
  # awk reads to the end: grep -q would stop early and the compiler's SIGPIPE fail the pipeline (pipefail).
  (cd "$dir" && bash -c "$cmd" 2>/dev/null </dev/null) | awk '/torch\/(torch|script)\.h/ { f = 1 } END { exit !f }'
}

echo "# load at start: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores; $(g++ --version | head -n 1)"
declare -A ref_cmd ref_dir
while IFS=$'\x1f' read -r dir out file cmd; do
  [[ $file == *cmake_pch.hxx.cxx ]] && continue
  ref_cmd[$file]=$cmd
  ref_dir[$file]=$dir
done < <(commands "$REF")

pch_cpu=0 pch_wall=0
printf 'file\tref_cpu_s\tnew_cpu_s\tnew/ref_cpu\tref_wall_s\tnew_wall_s\n'
while IFS=$'\x1f' read -r dir out file cmd; do
  [[ $file == *cmake_pch.hxx.cxx ]] || continue
  # FL_BENCH_KEEP_PCH=1: NEW's .gch files are already built (an earlier run of this script timed them).
  [[ ${FL_BENCH_KEEP_PCH:-0} == 1 && -f $dir/$out ]] && continue
  read -r c w < <(timed "$dir" "$out" "$cmd")  # into NEW's tree: its users look for the .gch there
  [[ -n ${w:-} ]] || exit 1
  printf '%s\t-\t%s\t-\t-\t%s\n' "PCH ${out%/cmake_pch.hxx.gch}" "$c" "$w"
  pch_cpu=$(awk -v a="$pch_cpu" -v b="$c" 'BEGIN{print a + b}')
  pch_wall=$(awk -v a="$pch_wall" -v b="$w" 'BEGIN{print a + b}')
done < <(commands "$NEW")

ref_cpu_sum=0 new_cpu_sum=0 ref_wall_sum=0 new_wall_sum=0 n=0
while IFS=$'\x1f' read -r dir out file cmd; do
  [[ $file == *cmake_pch.hxx.cxx ]] && continue
  [[ $file =~ $REGEX ]] || continue
  [[ -n ${ref_cmd[$file]:-} ]] || continue
  includes_torch "${ref_dir[$file]}" "${ref_cmd[$file]}" || { echo "# ${file#"$PWD"/}: no LibTorch include" >&2; continue; }
  read -r rc rw < <(timed "${ref_dir[$file]}" "$SCRATCH/ref.o" "${ref_cmd[$file]}")
  read -r nc nw < <(timed "$dir" "$SCRATCH/new.o" "$cmd")
  [[ -n ${rw:-} && -n ${nw:-} ]] || exit 1
  printf '%s\t%s\t%s\t%.2f\t%s\t%s\n' "${file#"$PWD"/}" "$rc" "$nc" "$(awk -v a="$nc" -v b="$rc" 'BEGIN{print a / b}')" "$rw" "$nw"
  read -r ref_cpu_sum new_cpu_sum ref_wall_sum new_wall_sum < <(awk -v a="$ref_cpu_sum" -v b="$rc" -v c="$new_cpu_sum" \
    -v d="$nc" -v e="$ref_wall_sum" -v f="$rw" -v g="$new_wall_sum" -v h="$nw" 'BEGIN{print a + b, c + d, e + f, g + h}')
  n=$((n + 1))
done < <(commands "$NEW")

awk -v n="$n" -v rc="$ref_cpu_sum" -v nc="$new_cpu_sum" -v pc="$pch_cpu" -v rw="$ref_wall_sum" -v nw="$new_wall_sum" \
  -v pw="$pch_wall" 'BEGIN{
  printf "total (%d files)\t%.1f\t%.1f\t%.2f\t%.1f\t%.1f\n", n, rc, nc, nc / rc, rw, nw
  printf "total with the PCH builds\t%.1f\t%.1f\t%.2f\t%.1f\t%.1f\n", rc, nc + pc, (nc + pc) / rc, rw, nw + pw
}'
echo "# load at end: $(cut -d' ' -f1-3 /proc/loadavg)"

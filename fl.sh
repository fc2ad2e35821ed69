#!/usr/bin/env bash
# The testbed's front door: two verbs, each self-sufficient on a fresh Debian 12 machine (run as root).
#
#   ./fl.sh demo   install dependencies, build what the quickstart runs (fl-experiment, fl-server, fl-client and
#                  their libraries: the CMake target fl_demo), run the quickstart experiment
#   ./fl.sh test   install dependencies, build everything, run the whole test suite (arguments go to ctest)
#
# Both build into build/release (CMake preset "release"): the test command reuses every object the demo built.
# Each stage prints one line, the build and the install a progress line every tenth with the time left at the
# rate so far; their full output goes to build/fl-install.log and build/release/fl-build.log.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")"

PRESET="${FL_PRESET:-release}"
BUILD_DIR="build/${PRESET}"
STAGES=4
START=$SECONDS

usage() {
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}

# m:ss since the command started.
clock() {
  local s=$((SECONDS - START))
  printf '%d:%02d' $((s / 60)) $((s % 60))
}

say() { printf '[fl.sh %s] %s\n' "$(clock)" "$*"; }

# "about 3 min left" from `done` of `total` units after `spent` seconds at the same rate; "" while too early to say.
eta() {
  local ndone=$1 total=$2 spent=$3 left
  ((ndone > 0 && spent >= 5 && ndone < total)) || return 0
  left=$(((total - ndone) * spent / ndone))
  ((left > 0)) || return 0
  if ((left >= 90)); then
    printf ', about %d min left' $(((left + 30) / 60))
  else
    printf ', about %d s left' "$left"
  fi
}

# A progress line when a tenth more is done, or 30 s after the last line.
progress() {
  local what=$1 ndone=$2 total=$3 began=$4
  local pct=$((100 * ndone / total)) now=$SECONDS
  if ((pct >= next_pct || now - last_line >= 30)); then
    say "    ${what} ${pct}% (${ndone}/${total})$(eta "$ndone" "$total" $((now - began)))"
    next_pct=$(((pct / 10 + 1) * 10))
    last_line=$now
  fi
}

# Stage 1: the Debian packages. install-deps.sh's own lines (what is missing, or that all are there) are shown;
# apt's output goes to the log, shown as how much apt fetches, then the share of packages unpacked and then set up
# ("N newly installed" is apt's count, the requested packages and their dependencies), each phase with its own rate
# for the time left. Arguments go to install-deps.sh (the demo's --demo: only its packages; the test command's
# --slurm: the local two-node Slurm that the cluster launcher's tests run on).
install() {
  mkdir -p build
  local log=build/fl-install.log total=0 nunpacked=0 ndone=0 setting_up=0 began=$SECONDS line
  local next_pct=10 last_line=$SECONDS
  say "1/${STAGES} packages: deploy/install-deps.sh $* (apt's output in ${log})"
  : >"$log"
  set +e
  ./deploy/install-deps.sh "$@" 2>&1 | while IFS= read -r line; do
    printf '%s\n' "$line" >>"$log"
    case "$line" in
      install-deps:*) say "    ${line#install-deps: }" ;;
      E:*) say "    apt: $line" ;;
      *" newly installed"*)
        total="${line#*upgraded, }"
        total="${total%% newly installed*}"
        [[ "$total" =~ ^[0-9]+$ ]] || total=0
        say "    apt installs ${total} package(s), dependencies included" ;;
      "Need to get "*) say "    apt downloads ${line#Need to get }" ;;
      "Fetched "*) say "    apt f${line#F}" ;;
      "Unpacking "*)
        if ((nunpacked == 0)); then  # a new phase: its shares and its rate start again
          next_pct=10 began=$SECONDS last_line=$SECONDS
        fi
        nunpacked=$((nunpacked + 1))
        ((total > 0 && nunpacked <= total)) && progress "unpacked" "$nunpacked" "$total" "$began" ;;
      "Setting up "*)
        # dpkg sets a few packages up between unpacks (what later ones need): their phase starts, for the lines and
        # the rate, once every package is unpacked.
        ndone=$((ndone + 1))
        ((total > 0 && nunpacked >= total)) || continue
        if ((setting_up == 0)); then
          setting_up=1 next_pct=10 began=$SECONDS last_line=$SECONDS
        fi
        ((ndone <= total)) && progress "set up" "$ndone" "$total" "$began" ;;
    esac
  done
  local rc=${PIPESTATUS[0]}
  set -e
  if ((rc != 0)); then
    say "installing the packages failed (exit ${rc}); the end of ${log}:"
    tail -n 30 "$log"
    exit "$rc"
  fi
}

# Arguments go to cmake: the demo's -DFL_BUILD_TESTS=OFF -DFL_BUILD_BENCH=OFF (its install has no googletest or
# Google Benchmark); the test command's none, so the preset's ON applies again in the same build dir and every
# object the demo built is reused (the options change which targets exist, not how any object is compiled).
configure() {
  local log="${BUILD_DIR}/fl-configure.log"
  mkdir -p "$BUILD_DIR"
  say "2/${STAGES} configuring ${BUILD_DIR} (cmake --preset ${PRESET}${*:+ $*}; log ${log})"
  if ! cmake --preset "$PRESET" "$@" >"$log" 2>&1; then
    say "configuring failed; the end of ${log}:"
    tail -n 30 "$log"
    exit 1
  fi
}

# cmake --build for `target`, ninja's [done/total] turned into a progress line every tenth (or 30 s) with the time
# left at the rate so far: steps differ in cost (a LibTorch file takes a minute, a ccache hit nothing), so it is
# a rough figure. On a failure, the compiler's messages from the log.
build() {
  local target=$1 what=$2 log="${BUILD_DIR}/fl-build.log" began=$SECONDS line ndone=0 total st
  local next_pct=10 last_line=$SECONDS
  say "3/${STAGES} building ${what} (cmake --build --preset ${PRESET} --target ${target}; log ${log})"
  : >"$log"
  set +e
  NINJA_STATUS='[%f/%t] ' cmake --build --preset "$PRESET" --target "$target" -j "$(nproc)" 2>&1 |
    while true; do
      # A line at least every 60 s: a LibTorch file can take minutes with no step finishing.
      IFS= read -r -t 60 line
      st=$?
      if ((st != 0)); then
        ((st > 128)) || break  # end of the output; > 128: the wait timed out
        [[ -n ${total:-} ]] && say "    build still at ${ndone}/${total} steps (one file can take minutes: LibTorch code, a large main.cc)"
        continue
      fi
      printf '%s\n' "$line" >>"$log"
      if [[ "$line" =~ ^\[([0-9]+)/([0-9]+)\]\  ]]; then
        ndone=${BASH_REMATCH[1]}
        total=${BASH_REMATCH[2]}
        progress "build" "$ndone" "$total" "$began"
      elif [[ "$line" == "ninja: no work to do." ]]; then
        say "    already built"
      fi
    done
  local rc=${PIPESTATUS[0]}
  set -e
  if ((rc != 0)); then
    say "the build failed (exit ${rc}); from ${log}:"
    if grep -q '^FAILED: ' "$log"; then
      sed -n '/^FAILED: /,$p' "$log" | head -n 80
    else
      tail -n 40 "$log"
    fi
    exit "$rc"
  fi
  say "    built in $((SECONDS - began)) s"
}

# The quickstart's own lines pass through (fl-experiment's line per round); after each round's line, the time left
# at the mean round time so far. stdbuf: fl-experiment's printf lines would wait in a full buffer in a pipe.
quickstart() {
  local manifest=experiments/quickstart.yaml rounds line n total secs sum=0 began=$SECONDS
  rounds="$(sed -n 's/^  rounds: *\([0-9][0-9]*\).*/\1/p' "$manifest" | head -n 1)"
  say "4/${STAGES} running the quickstart (${manifest}: ${rounds:-?} rounds; records in out/quickstart)"
  set +e
  stdbuf -oL -eL "$BUILD_DIR/experiments/fl-experiment" run "$manifest" --out out/quickstart 2>&1 |
    while IFS= read -r line; do
      printf '%s\n' "$line"
      # "round 2/3: 4/4 accepted in 11.2 s; ..." (fl/report/progress.h)
      if [[ "$line" =~ ^round\ ([0-9]+)/([0-9]+):.*\ in\ ([0-9]+)(\.[0-9]+)?\ s ]]; then
        n=${BASH_REMATCH[1]}
        total=${BASH_REMATCH[2]}
        secs=${BASH_REMATCH[3]}
        sum=$((sum + secs))
        if ((n < total)); then
          say "    $((total - n)) round(s) left, about $(((total - n) * sum / n)) s at $((sum / n)) s a round"
        fi
      fi
    done
  local rc=${PIPESTATUS[0]}
  set -e
  if ((rc == 0)); then
    say "quickstart done in $((SECONDS - began)) s; records in out/quickstart/records.db"
  else
    say "the quickstart failed (exit ${rc}); its logs are in out/quickstart/"
  fi
  return "$rc"
}

demo() {
  # Only the demo's packages (deploy/install-deps.sh --demo): no test framework, browser or Python LibTorch.
  install --demo
  configure -DFL_BUILD_TESTS=OFF -DFL_BUILD_BENCH=OFF
  build fl_demo "fl_demo: fl-experiment, fl-server, fl-client and their libraries"
  # The main job: the quickstart experiment (fl-server + 4 fl-client processes, FedAvg on Fashion-MNIST,
  # each client behind an emulated Ethernet link), from its manifest; over mutual TLS with a throwaway CA made for
  # the run in out/quickstart/pki (docs/manifests.md, "Transport security").
  quickstart
}

run_tests() {
  install --slurm
  configure
  build all "everything: programs, tests, benchmarks (what the demo built is reused)"
  say "4/${STAGES} running the test suite (ctest --preset ${PRESET} $*)"
  ctest --preset "$PRESET" "$@"
}

case "${1:-}" in
  demo) shift; demo "$@" ;;
  test) shift; run_tests "$@" ;;
  *) usage ;;
esac

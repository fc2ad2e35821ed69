#!/usr/bin/env bash
# The testbed's front door: two verbs, each self-sufficient on a fresh Debian 12 machine (run as root).
#
#   ./fl.sh demo   install dependencies, build everything, run the main job (the quickstart experiment)
#   ./fl.sh test   install dependencies, build everything, run the whole test suite
#
# Both build into build/release (CMake preset "release"), so running one after the other compiles once.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")"

PRESET="${FL_PRESET:-release}"
BUILD_DIR="build/${PRESET}"

usage() {
  sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}

build() {
  ./deploy/install-deps.sh
  cmake --preset "$PRESET"
  cmake --build --preset "$PRESET" -j "$(nproc)"
}

demo() {
  build
  # The main job: the quickstart experiment (fl-server + 4 fl-client processes, FedAvg on Fashion-MNIST,
  # each client behind an emulated Ethernet link), from its manifest; over mutual TLS with a throwaway CA made for
  # the run in out/quickstart/pki (docs/manifests.md, "Transport security").
  "$BUILD_DIR/experiments/fl-experiment" run experiments/quickstart.yaml --out out/quickstart
}

run_tests() {
  build
  ctest --preset "$PRESET" "$@"
}

case "${1:-}" in
  demo) shift; demo "$@" ;;
  test) shift; run_tests "$@" ;;
  *) usage ;;
esac

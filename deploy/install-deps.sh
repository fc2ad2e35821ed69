#!/usr/bin/env bash
# Installs every Debian package that the build, the tests and the tools of the testbed need.
#
# Idempotent: when everything is installed it only checks and exits. Supports Debian 12 (bookworm) on
# amd64 and arm64 (Raspberry Pi OS 64-bit is Debian 12 arm64); anything else is refused with a clear
# message, because the package names and versions below are those of Debian 12.
#
# Usage: deploy/install-deps.sh [--check] [--demo] [--slurm]
#   --check: report what is missing, install nothing
#   --demo:  only what `./fl.sh demo` needs (DEMO_PACKAGES: building the programs and running the quickstart), not
#            the tests' and tools' packages (TEST_PACKAGES); without it, both
#   --slurm: also Slurm and munge (slurmctld, slurmd, slurm-client, munge) for tools/local-slurm.sh, the local
#            two-node cluster that `fl-experiment run --launcher slurm` is tested on (docs/cluster.md); opt-in so
#            that the normal install does not grow
set -euo pipefail

# What `./fl.sh demo` needs (--demo): the build of the programs and their libraries (CMake configures every module,
# so every library a module finds at configure time is here, zmq included) and what the quickstart reads.
DEMO_PACKAGES=(
  # toolchain
  g++ cmake ninja-build ccache pkgconf make git ca-certificates
  # control plane: gRPC + protobuf (+ abseil, which gRPC already pulls in)
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  # certificates (fl-provision links libssl; the openssl tool inspects what it issued)
  libssl-dev openssl
  # island data plane (configured with every module; compiled only by the test command)
  libzmq3-dev cppzmq-dev
  # privacy and secure aggregation: ChaCha20 noise, X25519, XChaCha20-Poly1305 (fl-server, fl-privacy, secagg)
  libsodium-dev
  # records and metrics
  libsqlite3-dev prometheus-cpp-dev
  # wire transfers' checksum (XXH3)
  libxxhash-dev
  # training
  libtorch-dev
  # LibTorch's matrix products (nn.Linear, nn.GRU) go to the system BLAS, which is the reference BLAS unless an
  # optimised one is installed: OpenBLAS (its OpenMP build follows LibTorch's thread count) trains a GRU language
  # model 10x and a CNN with a large nn.Linear 1.6x faster (docs/performance.md, "TorchScript models")
  libopenblas0-openmp
  # configuration, CLI, logging, JSON
  libyaml-cpp-dev libcli11-dev libspdlog-dev nlohmann-json3-dev
  # real data: Fashion-MNIST images
  dataset-fashion-mnist
  # link emulation (ip netns, tc)
  iproute2
)

# What the rest of the build (tests, benchmarks, the island runtime, the .deb packages), the tests and the tools
# need on top: the default (no --demo) installs both lists. Kept out of the demo's install because a newcomer's first
# run should not wait for a browser and a Python LibTorch (issue 32: the demo's install is part of its ten minutes).
TEST_PACKAGES=(
  # Debian packages of the testbed (cpack: dpkg-shlibdeps computes their Depends; CPack's deb generator refuses
  # to run without the file utility, which a minimal Debian 12 does not have)
  dpkg-dev file
  # the island runtime: gloo, the headers of LibTorch's c10d ProcessGroupGloo (island ranks)
  libgloo-dev
  # records inspected by tests and scripts
  sqlite3
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev prometheus
  # tools/k8s_schema_check.py: rendered Kubernetes objects against the official client's models (test-only)
  python3-kubernetes
  # the HTML report test renders it in headless Chromium
  chromium
  # bench/instrumentation_overhead.sh (a scraper and a free port)
  curl python3
  # bring-your-own-model examples and tests: export TorchScript models, write .npz datasets
  python3-torch python3-numpy
  # human text for the small language model (islands, examples)
  fortunes-min
)

SLURM_PACKAGES=(slurmctld slurmd slurm-client munge)

die() { echo "install-deps: $*" >&2; exit 1; }

check_platform() {
  [[ -r /etc/os-release ]] || die "cannot read /etc/os-release; this script supports Debian 12 (bookworm) only"
  # shellcheck disable=SC1091
  . /etc/os-release
  local id="${ID:-unknown}" version="${VERSION_ID:-unknown}"
  if [[ "$id" != "debian" && "$id" != "raspbian" && "${ID_LIKE:-}" != *debian* ]] || [[ "$version" != "12" ]]; then
    die "this is ${PRETTY_NAME:-$id $version}; the testbed's dependencies are Debian 12 (bookworm) packages. " \
        "Use Debian 12 or Raspberry Pi OS (bookworm), or set FL_SKIP_PLATFORM_CHECK=1 to try anyway."
  fi
  local arch
  arch="$(dpkg --print-architecture)"
  case "$arch" in
    amd64|arm64) ;;
    *) die "architecture '$arch' is not supported: use amd64 or arm64 (64-bit Raspberry Pi OS); LibTorch is not packaged for '$arch'" ;;
  esac
}

missing_packages() {
  local p status
  for p in "${PACKAGES[@]}"; do
    # One line per installed architecture of a multiarch package (e.g. libabsl-dev:amd64 and :arm64 when a
    # cross toolchain's packages are there): installed if any line says so.
    status="$(dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null || true)"
    grep -qx "install ok installed" <<<"$status" || echo "$p"
  done
}

main() {
  local check=0 demo=0 slurm=0 arg
  for arg in "$@"; do
    case "$arg" in
      --check) check=1 ;;
      --demo) demo=1 ;;
      --slurm) slurm=1 ;;
      *) die "unknown argument '$arg': use --check, --demo and/or --slurm" ;;
    esac
  done
  PACKAGES=("${DEMO_PACKAGES[@]}")
  [[ "$demo" -eq 1 ]] || PACKAGES+=("${TEST_PACKAGES[@]}")
  [[ "$slurm" -eq 0 ]] || PACKAGES+=("${SLURM_PACKAGES[@]}")
  [[ "${FL_SKIP_PLATFORM_CHECK:-0}" == "1" ]] || check_platform
  command -v dpkg-query >/dev/null || die "dpkg-query not found: this script needs a Debian system"

  mapfile -t missing < <(missing_packages)
  if [[ ${#missing[@]} -eq 0 ]]; then
    echo "install-deps: all ${#PACKAGES[@]} packages are installed"
    return 0
  fi
  echo "install-deps: missing ${#missing[@]} package(s): ${missing[*]}"
  if [[ "$check" -eq 1 ]]; then
    return 1
  fi

  local sudo=()
  if [[ "$(id -u)" -ne 0 ]]; then
    command -v sudo >/dev/null || die "run as root (or install sudo) to install: ${missing[*]}"
    sudo=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  # apt-get update only when apt does not know a missing package (a fresh image's empty lists), not every time.
  local p need_update=0
  for p in "${missing[@]}"; do
    apt-cache show "$p" >/dev/null 2>&1 || need_update=1
  done
  [[ "$need_update" -eq 0 ]] || "${sudo[@]}" apt-get update
  "${sudo[@]}" apt-get install -y --no-install-recommends "${missing[@]}"

  mapfile -t still_missing < <(missing_packages)
  if [[ ${#still_missing[@]} -ne 0 ]]; then
    die "these packages are still not installed after apt-get: ${still_missing[*]}; check the apt output above"
  fi
  echo "install-deps: installed ${#missing[@]} package(s)"
}

main "$@"

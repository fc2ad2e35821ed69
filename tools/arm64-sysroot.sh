#!/usr/bin/env bash
# Builds an arm64 (aarch64) Debian 12 sysroot for cross-building fl-client with LibTorch from an amd64 Debian 12
# machine (docs/deploy-raspberry-pi.md "Cross-building fl-client").
#
# Why a sysroot and not multiarch: libtorch-dev:arm64 (and part of its closure) cannot be co-installed with the
# amd64 packages the host already has, so the :arm64 packages are downloaded with `apt-get download` and unpacked
# with dpkg-deb into a directory; nothing is installed into the host's root (apart from registering the arm64
# architecture with dpkg so that apt knows the arm64 package lists).
#
# Idempotent: a package already downloaded is not downloaded again, one already unpacked is not unpacked again.
# The dependency closure is what apt would install on an empty arm64 Debian 12 for the -dev packages below (no
# Recommends), resolved by apt itself against an empty dpkg status, so it names exactly the versions downloaded.
#
# Checks that the arm64 protobuf and gRPC are the same upstream versions as the host's protoc and grpc_cpp_plugin:
# the build generates the .pb.cc/.grpc.pb.cc files with the host's tools and compiles them against the arm64
# headers, and protobuf's generated code refuses a runtime of another version.
#
# Usage: tools/arm64-sysroot.sh [SYSROOT]      (default: build/sysroot-arm64 under the repository)
#   SYSROOT/debs/        the downloaded .deb files (kept so that a re-run downloads nothing)
#   SYSROOT/.unpacked/   one stamp per unpacked .deb
#   SYSROOT/.dpkg/       a dpkg database of the unpacked packages, for dpkg-shlibdeps when the cross-built tree is
#                        packaged (cmake --build build/arm64 --target package-deb, docs/packages.md "arm64")
set -euo pipefail

die() { echo "arm64-sysroot: $*" >&2; exit 1; }
say() { echo "arm64-sysroot: $*"; }

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SYSROOT="${1:-$REPO/build/sysroot-arm64}"
mkdir -p "$SYSROOT"
SYSROOT="$(cd "$SYSROOT" && pwd)"

# What the project's find_package() calls need (all of them: CMake configures every module even when only
# fl-client is built), plus the C and C++ runtime headers and libraries that the cross compiler links against.
PACKAGES=(
  libc6-dev libstdc++-12-dev libgcc-12-dev
  libtorch-dev libgloo-dev
  libgrpc++-dev libgrpc-dev libprotobuf-dev libabsl-dev
  libssl-dev zlib1g-dev libsqlite3-dev libxxhash-dev
  prometheus-cpp-dev libspdlog-dev libfmt-dev libyaml-cpp-dev libcli11-dev nlohmann-json3-dev
  libzmq3-dev cppzmq-dev libsodium-dev
  # Never run (the build runs the host's grpc_cpp_plugin), but gRPCConfig.cmake's imported target
  # gRPC::grpc_cpp_plugin refuses to load when its file is missing.
  protobuf-compiler-grpc
)

# --- the host ---------------------------------------------------------------------------------------------------
{ command -v apt-get && command -v dpkg-deb; } >/dev/null ||
  die "needs apt-get and dpkg-deb: run it on Debian 12 (amd64)"
[[ "$(dpkg --print-architecture)" == "amd64" ]] ||
  die "the host is $(dpkg --print-architecture); this script prepares an arm64 sysroot on an amd64 Debian 12 host (on a Pi, use deploy/install-deps.sh instead)"
command -v aarch64-linux-gnu-g++ >/dev/null ||
  die "aarch64-linux-gnu-g++ not found: apt-get install g++-aarch64-linux-gnu (the cross compiler)"
for tool in protoc grpc_cpp_plugin; do
  command -v "$tool" >/dev/null ||
    die "$tool not found: apt-get install protobuf-compiler protobuf-compiler-grpc (the build runs the host's $tool)"
done
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  [[ $EUID -eq 0 ]] || die "dpkg does not know the arm64 architecture: run 'sudo dpkg --add-architecture arm64 && sudo apt-get update' once"
  say "registering the arm64 architecture with dpkg (no arm64 package is installed into the host)"
  dpkg --add-architecture arm64
  apt-get update
fi
apt-cache show libtorch-dev:arm64 >/dev/null 2>&1 ||
  die "apt has no arm64 package lists (libtorch-dev:arm64 unknown): run 'sudo apt-get update'"

# --- the closure ------------------------------------------------------------------------------------------------
empty_status="$(mktemp)"
trap 'rm -f "$empty_status"' EXIT
# An empty dpkg status and arm64 as the only architecture: apt resolves the closure as for a fresh arm64 system.
closure="$(apt-get -s -o Dir::State::status="$empty_status" -o APT::Architecture=arm64 \
             -o APT::Architectures::=arm64 -o Debug::NoLocking=1 \
             install --no-install-recommends "${PACKAGES[@]}" 2>&1)" ||
  die "apt cannot resolve the arm64 packages:"$'\n'"$closure"
# "Inst libc6 (2.36-9+deb12u14 Debian:12.15/oldstable [arm64]) []" -> "libc6 2.36-9+deb12u14 arm64"
mapfile -t wanted < <(sed -n 's/^Inst \([^ ]*\) (\([^ ]*\) .*\[\([a-z0-9]\+\)\].*/\1 \2 \3/p' <<<"$closure")
[[ ${#wanted[@]} -gt 0 ]] || die "apt named no package to install; its output was:"$'\n'"$closure"

version_of() {  # version_of PACKAGE: the version in the closure
  local line
  for line in "${wanted[@]}"; do
    [[ "${line%% *}" == "$1" ]] && { line="${line#* }"; echo "${line%% *}"; return; }
  done
}
upstream() { local v="${1#*:}"; echo "${v%%-*}"; }  # 1:3.21.12-3+deb12u1 -> 3.21.12

check_same() {  # check_same HOST_PACKAGE ARM64_PACKAGE
  local host arm
  host="$(dpkg-query -W -f='${Version}' "$1" 2>/dev/null || true)"
  arm="$(version_of "$2")"
  [[ -n "$host" ]] || die "$1 is not installed on the host: apt-get install $1"
  [[ "$(upstream "$host")" == "$(upstream "$arm")" ]] ||
    die "the host's $1 is $host but $2:arm64 is $arm: the code the host's generator writes must match the arm64 library; upgrade the host (apt-get update && apt-get install $1) so both come from the same Debian 12 point release"
  say "$1 $host (host) matches $2:arm64 $arm"
}
check_same protobuf-compiler libprotobuf-dev
check_same protobuf-compiler-grpc libgrpc++-dev
check_same libprotobuf-dev libprotobuf-dev
check_same libgrpc++-dev libgrpc++-dev

# --- download ---------------------------------------------------------------------------------------------------
mkdir -p "$SYSROOT/debs" "$SYSROOT/.unpacked"
deb_name() {  # deb_name PACKAGE VERSION ARCH: the file apt-get download writes (an epoch's ':' as %3a)
  echo "${1}_${2//:/%3a}_${3}.deb"
}
to_fetch=()
for line in "${wanted[@]}"; do
  read -r pkg ver arch <<<"$line"
  [[ -f "$SYSROOT/debs/$(deb_name "$pkg" "$ver" "$arch")" ]] && continue
  if [[ "$arch" == all ]]; then to_fetch+=("$pkg=$ver"); else to_fetch+=("$pkg:$arch=$ver"); fi
done
say "${#wanted[@]} packages in the closure of: ${PACKAGES[*]}"
if [[ ${#to_fetch[@]} -gt 0 ]]; then
  say "downloading ${#to_fetch[@]} package(s) into $SYSROOT/debs: ${to_fetch[*]}"
  # apt-get download writes into the current directory; as root it drops to the _apt user, who must be able to
  # write there, hence a world-writable staging directory that is emptied into debs/.
  staging="$(mktemp -d)"
  chmod 0777 "$staging"
  (cd "$staging" && apt-get download "${to_fetch[@]}") || die "apt-get download failed (network? apt-get update?)"
  mv "$staging"/*.deb "$SYSROOT/debs/"
  rmdir "$staging"
else
  say "every package is already downloaded"
fi

# --- unpack -----------------------------------------------------------------------------------------------------
# Debian 12 is merged-/usr: /lib, /bin and /sbin are links into /usr. Packages still ship some files under
# /lib/aarch64-linux-gnu (libc6), so the links must exist before unpacking and tar must keep them.
for d in lib bin sbin; do
  [[ -e "$SYSROOT/$d" || -L "$SYSROOT/$d" ]] || { mkdir -p "$SYSROOT/usr/$d"; ln -s "usr/$d" "$SYSROOT/$d"; }
done
unpacked=0
for line in "${wanted[@]}"; do
  read -r pkg ver arch <<<"$line"
  deb="$(deb_name "$pkg" "$ver" "$arch")"
  [[ -f "$SYSROOT/.unpacked/$deb" ]] && continue
  dpkg-deb --fsys-tarfile "$SYSROOT/debs/$deb" | tar -x --keep-directory-symlink -C "$SYSROOT" ||
    die "cannot unpack $deb"
  touch "$SYSROOT/.unpacked/$deb"
  unpacked=$((unpacked + 1))
done
say "unpacked $unpacked package(s)"

# Absolute symbolic links (e.g. usr/lib/aarch64-linux-gnu/libfoo.so -> /lib/aarch64-linux-gnu/libfoo.so.1) would
# point into the host: make them relative to the sysroot so that the linker and qemu-aarch64 -L find the arm64 file.
while IFS= read -r -d '' link; do
  target="$(readlink "$link")"
  [[ "$target" == /* ]] || continue
  ln -sfn "$(realpath -m --relative-to="$(dirname "$link")" "$SYSROOT$target")" "$link"
done < <(find "$SYSROOT" -path "$SYSROOT/debs" -prune -o -type l -print0)

# dpkg-deb -x runs no maintainer scripts, so update-alternatives never made the BLAS/LAPACK links that
# libtorch_cpu.so needs (libblas.so.3, liblapack.so.3): link the reference implementations, as a fresh install does.
libdir="$SYSROOT/usr/lib/aarch64-linux-gnu"
for lib in blas/libblas.so.3 lapack/liblapack.so.3 blas/libblas.so lapack/liblapack.so; do
  if [[ -e "$libdir/$lib" && ! -e "$libdir/$(basename "$lib")" ]]; then
    ln -sfn "$lib" "$libdir/$(basename "$lib")"
  fi
done
for lib in libblas.so.3 liblapack.so.3; do
  [[ -e "$libdir/$lib" ]] || die "$libdir/$lib is missing after unpacking: LibTorch needs it (an alternative of libblas3/liblapack3)"
done

# --- a dpkg database for dpkg-shlibdeps ---------------------------------------------------------------------------
# Packaging the cross-built tree (cmake --build build/arm64 --target package-deb, docs/packages.md) runs
# dpkg-shlibdeps, which finds each library the programs need in the sysroot and then asks dpkg which package holds
# that file, for the package's shlibs/symbols files (the Depends it writes). Unpacking registered nothing, so the
# script writes a database as dpkg --admindir reads it: status (each package's control fields, installed), info/format
# and, per package, info/<pkg>[:arm64].list with the paths it unpacked and its shlibs/symbols control files
# (dpkg-deb -e). The paths are the sysroot's as the build machine sees them ($SYSROOT/usr/lib/...), which is what
# dpkg-shlibdeps asks about: the database is for this sysroot where it is, not for dpkg --root (a moved sysroot
# gets its database rewritten).
admindir="$SYSROOT/.dpkg"
if [[ "$(cat "$admindir/sysroot" 2>/dev/null)" != "$SYSROOT" ]]; then
  rm -rf "$admindir"
fi
mkdir -p "$admindir/info" "$admindir/updates" "$admindir/.parts"
echo "$SYSROOT" >"$admindir/sysroot"
echo 1 >"$admindir/info/format"
echo arm64 >"$admindir/arch"
: >"$admindir/available"
registered=0
for line in "${wanted[@]}"; do
  read -r pkg ver arch <<<"$line"
  deb="$(deb_name "$pkg" "$ver" "$arch")"
  part="$admindir/.parts/$deb"
  if [[ ! -f "$part" ]]; then
    # dpkg keeps a Multi-Arch: same package's files as <pkg>:<arch>.*, any other's as <pkg>.*
    name="$pkg"
    [[ "$(dpkg-deb -f "$SYSROOT/debs/$deb" Multi-Arch)" == same ]] && name="$pkg:$arch"
    control="$(mktemp -d)"
    dpkg-deb -e "$SYSROOT/debs/$deb" "$control" || die "cannot read the control files of $deb"
    for f in shlibs symbols; do
      [[ -f "$control/$f" ]] && cp "$control/$f" "$admindir/info/$name.$f"
    done
    rm -rf "$control"
    # ./usr/lib/x -> $SYSROOT/usr/lib/x; files under the merged-/usr links (libc6's /lib/aarch64-linux-gnu) also
    # under /usr, where dpkg-shlibdeps finds them through the links.
    dpkg-deb --fsys-tarfile "$SYSROOT/debs/$deb" | tar -t | sed -e 's|^\./|/|' -e 's|/$||' -e '/^$/d' |
      awk -v root="$SYSROOT" '{ print ($0 == "/" ? root : root $0) }
                              /^\/(lib|bin|sbin)\// { print root "/usr" $0 }' >"$admindir/info/$name.list" ||
      die "cannot list the files of $deb"
    # The control fields as an installed package's entry in status.
    dpkg-deb -f "$SYSROOT/debs/$deb" | sed '/^Package:/a Status: install ok installed' >"$part.tmp"
    echo >>"$part.tmp"
    mv "$part.tmp" "$part"
    registered=$((registered + 1))
  fi
done
# status holds exactly the closure's packages (a package left from an older closure is dropped).
for line in "${wanted[@]}"; do
  read -r pkg ver arch <<<"$line"
  cat "$admindir/.parts/$(deb_name "$pkg" "$ver" "$arch")"
done >"$admindir/status"
say "dpkg database for dpkg-shlibdeps: $admindir ($registered package(s) registered now, ${#wanted[@]} in all)"

say "sysroot ready: $SYSROOT ($(du -sh --exclude=debs "$SYSROOT" | cut -f1) unpacked)"
say "next (docs/deploy-raspberry-pi.md \"Cross-building fl-client\"):"
echo "  cmake -S $REPO -B $REPO/build/arm64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=$REPO/cmake/toolchains/aarch64-linux-gnu.cmake \\"
echo "        -DCMAKE_SYSROOT=$SYSROOT -DCMAKE_BUILD_TYPE=Release -DFL_BUILD_TESTS=OFF -DFL_BUILD_BENCH=OFF \\"
echo "        -DFL_PACKAGE_COMPONENTS=client"
echo "  cmake --build $REPO/build/arm64 -j2 --target fl-client      # or package-deb: fl-client_<version>_arm64.deb"

# Cross-building for 64-bit Arm Linux (Raspberry Pi 4/5 with Raspberry Pi OS 12, any Debian 12 arm64) from an
# amd64 Debian 12 machine, with Debian's cross compiler (g++-aarch64-linux-gnu) and one of two library layouts:
#
# - a sysroot (fl-client with LibTorch; libtorch-dev:arm64 cannot be co-installed with the amd64 packages):
#     tools/arm64-sysroot.sh        # unpacks the :arm64 packages into build/sysroot-arm64
#     cmake -S . -B build/arm64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake \
#           -DCMAKE_SYSROOT=$PWD/build/sysroot-arm64 -DFL_BUILD_TESTS=OFF -DFL_BUILD_BENCH=OFF
#   (docs/deploy-raspberry-pi.md "Cross-building fl-client")
# - multiarch :arm64 -dev packages installed beside the amd64 ones (the torch-free parts, FL_WITH_TORCH=OFF):
#     sudo dpkg --add-architecture arm64 && sudo apt-get update
#     sudo apt-get install g++-aarch64-linux-gnu libabsl-dev:arm64 ...   (docs/deploy.md lists them)
#     cmake -S . -B build/arm64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake \
#           -DFL_WITH_TORCH=OFF -DFL_BUILD_TESTS=OFF -DFL_BUILD_BENCH=OFF
#
# Programs that run during the build (protoc, grpc_cpp_plugin) come from the build machine in both.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

if(CMAKE_SYSROOT)
  # Everything arm64 is under the sysroot, laid out as on the Pi (usr/lib/aarch64-linux-gnu, usr/include);
  # CMake prefixes its searches with CMAKE_SYSROOT and the compiler gets --sysroot.
  set(CMAKE_FIND_ROOT_PATH ${CMAKE_SYSROOT})
  set(_fl_arm64_root ${CMAKE_SYSROOT})
else()
  # Debian's multiarch layout: arm64 libraries live beside the amd64 ones under /usr, so the sysroot is "/" and
  # CMake tells them apart by CMAKE_LIBRARY_ARCHITECTURE (lib/aarch64-linux-gnu, lib/aarch64-linux-gnu/cmake).
  set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu /usr)
  set(_fl_arm64_root "")
endif()
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# pkg-config (used for gRPC's and protobuf's dependencies, libxxhash) must read the arm64 .pc files, and with a
# sysroot prefix the paths they name.
set(ENV{PKG_CONFIG_LIBDIR} ${_fl_arm64_root}/usr/lib/aarch64-linux-gnu/pkgconfig:${_fl_arm64_root}/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")
if(CMAKE_SYSROOT)
  set(ENV{PKG_CONFIG_SYSROOT_DIR} ${CMAKE_SYSROOT})
endif()

# Run cross-built programs under qemu when it is installed (qemu-user), e.g. try_run checks; -L names where the
# arm64 dynamic loader and libraries are.
find_program(FL_QEMU_AARCH64 qemu-aarch64)
if(FL_QEMU_AARCH64)
  if(CMAKE_SYSROOT)
    set(CMAKE_CROSSCOMPILING_EMULATOR ${FL_QEMU_AARCH64} -L ${CMAKE_SYSROOT})
  else()
    set(CMAKE_CROSSCOMPILING_EMULATOR ${FL_QEMU_AARCH64} -L /usr/aarch64-linux-gnu)
  endif()
endif()

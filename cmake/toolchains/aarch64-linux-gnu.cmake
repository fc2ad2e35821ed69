# Cross-building for 64-bit Arm Linux (Raspberry Pi 4/5 with Raspberry Pi OS 12, any Debian 12 arm64) from an
# amd64 Debian 12 machine, with Debian's cross compiler and multiarch :arm64 libraries:
#
#   sudo dpkg --add-architecture arm64 && sudo apt-get update
#   sudo apt-get install g++-aarch64-linux-gnu libabsl-dev:arm64 ...   (docs/deploy-raspberry-pi.md lists them)
#   cmake -S . -B build/arm64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake \
#         -DFL_BUILD_TESTS=OFF -DFL_BUILD_BENCH=OFF
#
# Libraries and headers come from the multiarch locations (/usr/lib/aarch64-linux-gnu, /usr/include), programs
# that run during the build (protoc, grpc_cpp_plugin) from the build machine.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

# Debian's multiarch layout: arm64 libraries live beside the amd64 ones under /usr, so the sysroot is "/" and
# CMake tells them apart by CMAKE_LIBRARY_ARCHITECTURE (lib/aarch64-linux-gnu, lib/aarch64-linux-gnu/cmake).
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu /usr)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# pkg-config (used for gRPC's and protobuf's dependencies) must read the arm64 .pc files.
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")

# Run cross-built test programs under qemu when it is installed (qemu-user), e.g. try_run checks.
find_program(FL_QEMU_AARCH64 qemu-aarch64)
if(FL_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${FL_QEMU_AARCH64} -L /usr/aarch64-linux-gnu)
endif()

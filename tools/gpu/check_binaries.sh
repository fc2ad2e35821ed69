#!/usr/bin/env bash
# Checks fl-client / fl-island built against LibTorch stand-ins (tools/gpu/make_torch_stubs.sh) before they
# travel to the GPU machine:
#   - no copy relocation (R_X86_64_COPY) of a symbol that a stand-in defines: its data sizes are not the real
#     library's, so a copied object would be cut short at run time; code seeing LibTorch must be -fPIC
#     (FL_TORCH_LINK_STUBS=ON). Copies from real libraries (libstdc++, protobuf, gRPC) are fine;
#   - libtorch_cuda.so and libc10_cuda.so are NEEDED (their static initialisers register CUDA);
#   - no RPATH/RUNPATH pointing at the build machine (CMAKE_SKIP_BUILD_RPATH=ON).
#
#   tools/gpu/check_binaries.sh STUB_LIB_DIR BIN...
set -u
stubs=$1; shift
defined=$(mktemp)
nm -D --defined-only "$stubs"/lib*.so | awk 'NF == 3 {print $3}' | sort -u > "$defined"
rc=0
for b in "$@"; do
  copies=$(readelf -rW "$b" | awk '/R_X86_64_COPY/ {sub(/@.*/, "", $5); print $5}' | sort -u | comm -12 - "$defined" | wc -l)
  needed=$(readelf -dW "$b" | grep NEEDED | grep -oE 'lib(torch|c10)[a-z_]*\.so' | sort | tr '\n' ' ')
  paths=$(readelf -dW "$b" | grep -E 'RPATH|RUNPATH' || true)
  echo "$(basename "$b"): copy relocations of LibTorch symbols: $copies; LibTorch NEEDED: ${needed:-none}${paths:+; $paths}"
  if [ "$copies" != 0 ]; then
    readelf -rW "$b" | awk '/R_X86_64_COPY/ {sub(/@.*/, "", $5); print $5}' | sort -u | comm -12 - "$defined" | sed 's/^/    /'
    rc=1
  fi
  if [ -n "$needed" ] && ! grep -q libtorch_cuda.so <<< "$needed"; then echo "    libtorch_cuda.so is not NEEDED"; rc=1; fi
  if [ -n "$paths" ]; then rc=1; fi
done
rm -f "$defined"
exit $rc

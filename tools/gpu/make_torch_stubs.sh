#!/usr/bin/env bash
# Link-time stand-ins for a CUDA LibTorch's shared libraries, for building fl-client / fl-island on a machine
# that has the CUDA LibTorch's headers but not its 1.4 GB of libraries (this one reaches no PyPI; the headers
# and the exported-symbol lists come from the GPU machine via tools/gpu/probe_device.sh).
#
#   tools/gpu/make_torch_stubs.sh SYMS.txt.xz TORCH_DIR
#
# SYMS.txt.xz: lines "<library> <nm type> <symbol>" (nm -D --defined-only of each real library). For every
# library named there, TORCH_DIR/lib/<library> becomes a shared object with the same SONAME that defines
# exactly those symbols (functions as `ret`, data as 8-byte objects). Linking against them checks every
# reference of ours against what the real library exports (an undefined one is a link error, as with the
# real library), and records the right NEEDED entries; at run time the real libraries are loaded instead
# (LD_LIBRARY_PATH on the GPU machine). A stub's data sizes are NOT the real ones: code that references
# LibTorch's data must be compiled -fPIC (through the GOT; FL_TORCH_STUB_LINK does that) so that no copy
# relocation is made with a wrong size -- tools/gpu/check_binaries.sh refuses a binary that has one.
set -euo pipefail
syms=$1 torch=$2
mkdir -p "$torch/lib" /tmp/fl-torch-stubs
for lib in $(xz -dc "$syms" | awk '{print $1}' | sort -u); do
  asm=/tmp/fl-torch-stubs/${lib%.so}.s
  xz -dc "$syms" | awk -v L="$lib" '$1 == L {
      t = $2; s = $3
      if (t == "T" || t == "W" || t == "i") {
        printf "\t.text\n\t.globl \"%s\"\n\t.type \"%s\",@function\n\"%s\":\n\tret\n", s, s, s
      } else {
        printf "\t.data\n\t.globl \"%s\"\n\t.type \"%s\",@object\n\t.size \"%s\",8\n\"%s\":\n\t.quad 0\n", s, s, s, s
      }
    }' > "$asm"
  gcc -shared -nostdlib -Wl,-soname,"$lib" -o "$torch/lib/$lib" -x assembler "$asm"
  echo "stub $torch/lib/$lib: $(grep -c '.globl' "$asm") symbols"
done
# Libraries that LibTorch's CMake files name but that none of ours references (libtorch_nvshmem.so): empty
# stand-ins with the right SONAME, so that find_package(Torch) finds every file it lists.
for f in $(grep -ho 'lib/lib[a-z0-9_]*\.so' "$torch"/share/cmake/Caffe2/*.cmake "$torch"/share/cmake/Torch/*.cmake | sort -u); do
  [ -e "$torch/$f" ] && continue
  echo > /tmp/fl-torch-stubs/empty.s
  gcc -shared -nostdlib -Wl,-soname,"$(basename "$f")" -o "$torch/$f" -x assembler /tmp/fl-torch-stubs/empty.s
  echo "stub $torch/$f: empty"
done

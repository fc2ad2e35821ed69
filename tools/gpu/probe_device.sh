#!/usr/bin/env bash
# First call on a lent GPU machine (issue 34): what it offers, and the CUDA LibTorch's headers and CMake
# files brought back so that fl-client / fl-island can be compiled against them on the CPU machine (which
# reaches no PyPI). Writes to $OUT: probe.log, torch_include.tar.xz(.partNN), torch_syms.txt.xz.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/probe.log") 2>&1
PY=$(command -v python3)
echo "== host"; uname -a; grep PRETTY /etc/os-release; nproc; free -g | head -2
echo "== gpu"; nvidia-smi || true
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true
echo "== toolchain"; gcc --version | head -1; g++ --version | head -1; nvcc --version | tail -2; cmake --version | head -1
ldd --version | head -1; ls -l /usr/lib/x86_64-linux-gnu/libstdc++.so.6* 2>/dev/null
echo "== python"; echo "$PY"
"$PY" - <<'PYEOF'
import torch, os, glob
print("torch", torch.__version__, torch.__file__)
print("cuda", torch.version.cuda, "available", torch.cuda.is_available(), "count", torch.cuda.device_count())
if torch.cuda.is_available(): print("name", torch.cuda.get_device_name(0))
print("cxx11abi", torch._C._GLIBCXX_USE_CXX11_ABI)
try: print("nccl", torch.cuda.nccl.version())
except Exception as e: print("nccl?", e)
print("distributed", torch.distributed.is_available(), "nccl_avail", torch.distributed.is_nccl_available(), "gloo", torch.distributed.is_gloo_available())
d = os.path.dirname(torch.__file__)
print("TORCH_DIR", d)
sp = os.path.dirname(d)
for p in sorted(glob.glob(sp + "/nvidia/*/lib")) + sorted(glob.glob(sp + "/nvidia/cu13/lib")): print("NVLIB", p)
print("config", torch.__config__.show())
PYEOF
TD=$("$PY" -c 'import torch,os;print(os.path.dirname(torch.__file__))')
SP=$(dirname "$TD")
echo "== torch/lib"; ls -la "$TD/lib"
echo "== include dirs"; ls "$TD/include"; du -sh "$TD/include" "$TD/share/cmake"
for l in "$TD"/lib/lib*.so*; do echo "-- $l"; readelf -d "$l" | grep -E 'SONAME|NEEDED|RUNPATH|RPATH'; done
echo "== nvidia"; ls "$SP/nvidia" 2>/dev/null; find "$SP/nvidia" -maxdepth 3 -name 'lib*.so*' | sort
find / -xdev -name nccl.h 2>/dev/null | head
echo "== ldd libtorch_cuda"; ldd "$TD/lib/libtorch_cuda.so" | head -40
echo "== pack headers"
tar -C "$TD" -cf - include share/cmake | xz -T0 -6 > /tmp/torch_include.tar.xz
ls -l /tmp/torch_include.tar.xz
split -b 15M -d /tmp/torch_include.tar.xz "$OUT/torch_include.tar.xz.part"
echo "== symbols"
for l in libtorch.so libtorch_cpu.so libtorch_cuda.so libc10.so libc10_cuda.so; do
  nm -D --defined-only "$TD/lib/$l" | awk -v L=$l '{print L, $2, $3}'
done | xz -T0 > "$OUT/torch_syms.txt.xz"
ls -l "$OUT"
echo "== our Debian-built fl-server with the carried libraries"
export LD_LIBRARY_PATH=$PWD/.gpu/lib
ldd .gpu/bin/fl-server | grep -E 'not found' || echo "all found"
.gpu/bin/fl-server --help | head -5
echo "== done"

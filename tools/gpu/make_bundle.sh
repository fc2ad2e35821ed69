#!/usr/bin/env bash
# Packs what tools/gpu/run_on_device.sh needs into .gpu/ (git-ignored; the device tool carries it):
#
#   tools/gpu/make_bundle.sh BUILD_DIR [DEST=.gpu]
#
#   DEST/bundle.tar.xz  bin/: fl-server, fl-client, fl-island, fl-coordinator, fl-provision from BUILD_DIR
#                       (stripped); lib/: every shared library they need except LibTorch/c10, CUDA, NCCL (the
#                       GPU machine's PyTorch provides those) and glibc/libstdc++/libgcc (Ubuntu 24.04's are newer)
#   DEST/fmnist/        Fashion-MNIST with 30,000 training images (tools/gpu/shorten_idx.py)
#   DEST/fortunes/      Debian's fortunes-min (fl-island's char-lm corpus)
#   DEST/models/        cnn_bn.pt, exported by examples/bring-your-own-model/export_models.py
# The carried tree must stay under the device tool's 64 MiB (the repository included): xz does most of it.
set -euo pipefail
B=$1
D=${2:-.gpu}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$D/stage" && mkdir -p "$D/stage/bin" "$D/stage/lib"
# fl-server and fl-provision are torch-free: FL_GPU_TORCHFREE_BUILD may name another build of them (the
# Debian-LibTorch one) when BUILD_DIR has none.
T=${FL_GPU_TORCHFREE_BUILD:-$B}
for t in "$T/server/fl-server" "$B/client/fl-client" "$B/diloco/island/fl-island" "$B/diloco/coord/fl-coordinator" \
  "$T/pki/fl-provision"; do
  cp "$t" "$D/stage/bin/" && strip "$D/stage/bin/$(basename "$t")"
done
skip='lib(torch|c10|cuda|cudart|nvrtc|nccl|cublas|cudnn|nvToolsExt|gomp)|/libc\.so|/libm\.so|libstdc\+\+|libgcc_s|libpthread|libdl\.so|librt\.so|libresolv|libutil|libanl|libnsl|ld-linux|linux-vdso'
# ldd with the stand-ins first, or it would resolve libtorch.so to a Debian LibTorch and carry its dependencies.
for b in "$D"/stage/bin/*; do LD_LIBRARY_PATH=${FL_GPU_TORCH_STUBS:-/work/gpu-torch/torch/lib} ldd "$b"; done | awk '/=> \//{print $3}' | sort -u | grep -Ev "$skip" |
  while read -r l; do cp -L "$l" "$D/stage/lib/"; done
echo "libraries carried: $(find "$D/stage/lib" -type f | wc -l)"
tar -C "$D/stage" -cf - bin lib | xz -T2 -6 > "$D/bundle.tar.xz"
rm -rf "$D/stage"
if [ ! -d "$D/fmnist" ]; then python3 "$ROOT/tools/gpu/shorten_idx.py" /usr/share/datasets/fashion-mnist "$D/fmnist" 30000; fi
if [ ! -d "$D/fortunes" ]; then cp -r /usr/share/games/fortunes "$D/fortunes"; fi
if [ ! -f "$D/models/cnn_bn.pt" ]; then
  /usr/bin/python3 "$ROOT/examples/bring-your-own-model/export_models.py" --out "$D/models" > /dev/null
  rm -f "$D/models/tiny_lm.pt" "$D/models/regressor.pt" "$D/models/plain_cnn.pt"
fi
du -sh "$D"/*

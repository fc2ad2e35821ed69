#!/usr/bin/python3
"""Writes the first N examples of a Fashion-MNIST IDX directory into another one, with the header counts fixed.

    tools/gpu/shorten_idx.py SRC_DIR DST_DIR N_TRAIN [N_TEST]

For carrying the data set to a machine whose transfer is bounded (tools/gpu/make_bundle.sh): the training
images are 26 MB gzipped. Files stay gzipped, under the names fl-client and fl-island look for.
"""
import gzip
import os
import struct
import sys


def shorten(src: str, dst: str, n: int) -> None:
    with gzip.open(src, "rb") as f:
        data = f.read()
    magic, count = struct.unpack(">II", data[:8])
    dims = magic & 0xFF
    shape = struct.unpack(">" + "I" * (dims - 1), data[8:4 + 4 * dims])
    per = 1
    for d in shape:
        per *= d
    n = min(n, count)
    header = struct.pack(">II", magic, n) + data[8:4 + 4 * dims]
    body = data[4 + 4 * dims:4 + 4 * dims + n * per]
    with gzip.open(dst, "wb", compresslevel=9) as f:
        f.write(header + body)
    print(f"{dst}: {n} of {count} examples")


def main() -> None:
    src, dst, n_train = sys.argv[1], sys.argv[2], int(sys.argv[3])
    n_test = int(sys.argv[4]) if len(sys.argv) > 4 else 10000
    os.makedirs(dst, exist_ok=True)
    for kind, n in (("train", n_train), ("t10k", n_test)):
        for what in ("images-idx3-ubyte", "labels-idx1-ubyte"):
            shorten(os.path.join(src, f"{kind}-{what}.gz"), os.path.join(dst, f"{kind}-{what}.gz"), n)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Writes the example datasets as .npz files for fl-client's --data (numpy only, no torchvision).

    /usr/bin/python3 examples/bring-your-own-model/make_data.py --out out/byom [--seed 1] [--stores 4]

Source: Debian's Fashion-MNIST (package dataset-fashion-mnist, /usr/share/datasets/fashion-mnist: the four
gzipped IDX files, 60,000 training and 10,000 test images of 28x28 grey pixels, 10 classes).

fashion_mnist.npz
    x_train uint8 [60000, 1, 28, 28], y_train int64 [60000] (class 0..9), x_test uint8 [10000, 1, 28, 28],
    y_test int64 [10000]. Pixels stay uint8: fl-client divides uint8 data by 255 (float32 in [0, 1]).

fashion_mnist_natural.npz
    the same arrays plus client_id int64 [60000]: which "store" each training image belongs to, for
    `--partition natural` (one shard per distinct id; ids are 0..stores-1). Fashion-MNIST has no natural
    owner (its images are Zalando's catalogue), so the stores are simulated the way real retail data is
    skewed, seeded by --seed:
      - each store s has its own mix of categories, pref[s] ~ Dirichlet(0.5, ..., 0.5) over the 10 classes
        (a store sells mostly a few kinds of garment: label skew);
      - each store has its own size, size[s] ~ LogNormal(0, 0.5) (quantity skew);
      - each image of class c goes to store s with probability size[s] * pref[s][c] / sum over stores.
    The test set is the common one (no client_id): every store is judged on the whole catalogue.

regression.npz
    a real regression task on the same images: from the top half of a garment (x uint8 [N, 1, 14, 28]),
    predict the mean brightness of its bottom half (y float32 [N], in [0, 1]). The bottom half is not in
    the input, so the model has to infer the garment's shape (trousers, dress, shirt, bag...) from what
    it sees; predicting the training mean gives the baseline printed at the end.

Every file is written with np.savez (uncompressed), so that a reader can map it instead of inflating it.
"""

import argparse
import gzip
import os
import struct

import numpy as np

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"


def read_idx(path: str) -> np.ndarray:
    """An IDX file (gzipped): big-endian magic 0x0000 <dtype 0x08 = uint8> <ndim>, ndim uint32 sizes, data."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype != 0x08:
        raise SystemExit(f"{path}: not an IDX file of uint8 (magic {raw[:4].hex()})")
    dims = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise SystemExit(f"{path}: {data.size} bytes of data for shape {dims}")
    return data.reshape(dims)


def load_fashion_mnist(folder: str):
    def part(prefix):
        images = read_idx(os.path.join(folder, f"{prefix}-images-idx3-ubyte.gz"))
        labels = read_idx(os.path.join(folder, f"{prefix}-labels-idx1-ubyte.gz"))
        if len(images) != len(labels):
            raise SystemExit(f"{folder}: {len(images)} {prefix} images but {len(labels)} labels")
        return images[:, None, :, :].copy(), labels.astype(np.int64)  # [N, 1, 28, 28] uint8, [N] int64

    if not os.path.isdir(folder):
        raise SystemExit(f"{folder} not found: install Debian's dataset-fashion-mnist "
                         "(apt-get install dataset-fashion-mnist) or pass --fashion-mnist DIR")
    x_train, y_train = part("train")
    x_test, y_test = part("t10k")
    return x_train, y_train, x_test, y_test


def store_ids(y: np.ndarray, stores: int, seed: int) -> np.ndarray:
    """Simulated stores (see the module docstring): int64 [N] ids in 0..stores-1, each id used."""
    rng = np.random.default_rng(seed)
    classes = int(y.max()) + 1
    pref = rng.dirichlet(np.full(classes, 0.5), size=stores)  # [stores, classes]
    size = rng.lognormal(0.0, 0.5, size=stores)                # [stores]
    weight = size[:, None] * pref                               # [stores, classes]
    ids = np.empty(len(y), dtype=np.int64)
    for c in range(classes):
        members = np.flatnonzero(y == c)
        p = weight[:, c] / weight[:, c].sum()
        ids[members] = rng.choice(stores, size=len(members), p=p)
    if len(np.unique(ids)) != stores:
        raise SystemExit(f"seed {seed} left a store without images; use another --seed")
    return ids


def halves(x: np.ndarray):
    """[N, 1, 28, 28] uint8 -> top halves [N, 1, 14, 28] uint8, bottom halves' mean brightness [N] float32."""
    top = np.ascontiguousarray(x[:, :, :14, :])
    bottom_mean = x[:, :, 14:, :].reshape(len(x), -1).mean(axis=1, dtype=np.float64) / 255.0
    return top, bottom_mean.astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for the .npz files (created if missing)")
    parser.add_argument("--fashion-mnist", default=FASHION_MNIST_DIR, help="folder of the gzipped IDX files")
    parser.add_argument("--seed", type=int, default=1, help="seed of the simulated stores")
    parser.add_argument("--stores", type=int, default=4, help="distinct client_id values (natural shards)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)

    x_train, y_train, x_test, y_test = load_fashion_mnist(args.fashion_mnist)

    path = os.path.join(args.out, "fashion_mnist.npz")
    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    print(f"{path}: x_train {x_train.dtype} {list(x_train.shape)}, y_train {y_train.dtype} {list(y_train.shape)}, "
          f"x_test {list(x_test.shape)}, y_test {list(y_test.shape)}")

    client_id = store_ids(y_train, args.stores, args.seed)
    path = os.path.join(args.out, "fashion_mnist_natural.npz")
    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test, client_id=client_id)
    print(f"{path}: the same plus client_id int64 [{len(client_id)}]; images per store and class:")
    for s in range(args.stores):
        counts = np.bincount(y_train[client_id == s], minlength=10)
        print(f"    store {s}: {counts.sum():6d}  " + " ".join(f"{c:5d}" for c in counts))

    xr_train, yr_train = halves(x_train)
    xr_test, yr_test = halves(x_test)
    path = os.path.join(args.out, "regression.npz")
    np.savez(path, x_train=xr_train, y_train=yr_train, x_test=xr_test, y_test=yr_test)
    baseline_mse = float(np.mean((yr_test - yr_train.mean()) ** 2))
    print(f"{path}: x_train uint8 {list(xr_train.shape)} (top halves), y_train float32 {list(yr_train.shape)} "
          f"(bottom halves' mean brightness); predicting the training mean gives test MSE {baseline_mse:.5f}, "
          f"MAE {float(np.mean(np.abs(yr_test - yr_train.mean()))):.4f}")


if __name__ == "__main__":
    main()

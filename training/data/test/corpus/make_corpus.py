#!/usr/bin/python3
# Writes the seed corpus of training/data/test/fuzz_test.cc (small real files, a few KB each) next to this script:
#   idx_images/  IDX image files, plain and gzip        idx_labels/  IDX label files, plain and gzip
#   fashion/     28 x 28 IDX image files (a Fashion-MNIST folder's train images)
#   npz/         .npz data sets for the three tasks (np.savez and np.savez_compressed, with and without client_id)
#   text/        text corpora (next-token)
# Run it again (python3 make_corpus.py) to regenerate; the output is deterministic (gzip's mtime is 0).
import gzip, os, struct
import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(27)

def path(folder, name):
    os.makedirs(os.path.join(here, folder), exist_ok=True)
    return os.path.join(here, folder, name)

def write(folder, name, data):
    with open(path(folder, name), "wb") as f:
        f.write(data)

def gz(data):
    return gzip.compress(data, mtime=0)

def idx_images(count, rows, cols):
    return struct.pack(">IIII", 0x803, count, rows, cols) + rng.integers(0, 256, count * rows * cols, np.uint8).tobytes()

def idx_labels(count, classes):
    return struct.pack(">II", 0x801, count) + rng.integers(0, classes, count, np.uint8).tobytes()

images = idx_images(3, 4, 5)
write("idx_images", "plain_3x4x5", images)
write("idx_images", "gzip_3x4x5.gz", gz(images))
write("idx_images", "plain_2x28x28", idx_images(2, 28, 28))
labels = idx_labels(6, 10)
write("idx_labels", "plain_6", labels)
write("idx_labels", "gzip_6.gz", gz(labels))
write("fashion", "train_images_6", idx_images(6, 28, 28))

def npz(name, compressed=False, **arrays):
    (np.savez_compressed if compressed else np.savez)(path("npz", name), **arrays)

x = rng.standard_normal((6, 3)).astype(np.float32)
npz("classification.npz", x_train=x, y_train=np.array([0, 1, 2, 0, 1, 2]), x_test=x[:4], y_test=np.array([0, 1, 2, 1]))
npz("classification_uint8_client_id.npz", x_train=rng.integers(0, 256, (6, 2, 2), np.uint8),
    y_train=np.array([1, 0, 1, 0, 1, 0], np.int32), x_test=rng.integers(0, 256, (2, 2, 2), np.uint8),
    y_test=np.array([0, 1], np.uint8), client_id=np.array([0, 0, 1, 1, 0, 1]))
npz("regression_compressed.npz", compressed=True, x_train=x, y_train=rng.standard_normal((6, 2)).astype(np.float32),
    x_test=x[:3], y_test=rng.standard_normal((3, 2)).astype(np.float32))
tokens = rng.integers(0, 50, (6, 5))
npz("next_token.npz", x_train=tokens, y_train=np.roll(tokens, -1, 1), x_test=tokens[:2], y_test=tokens[:2])

write("text", "verse", b"The quick brown fox jumps over the lazy dog.\nPack my box with five dozen liquor jugs.\n" * 3)
write("text", "bytes", bytes(range(256)))

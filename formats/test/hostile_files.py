"""Hostile files for the torch-free readers of formats/ (issue 27), written the way an attacker would: TorchScript
archives built entry by entry (a pickle emitted opcode by opcode, code files, storages), pickles, .npy and .npz.

    python3 hostile_files.py OUT_DIR [NAME...]     # every file (or only NAME...) into OUT_DIR
    python3 hostile_files.py --corpus CORPUS_DIR   # the fuzz seeds (small valid files) of formats/test/corpus/

Used by formats/test/hostile_inputs_test.cc and, for the corpus, formats/test/fuzz_test.cc (docs/input-limits.md,
"Fuzzing"). The hostile files need only the standard library; the corpus adds a model exported by torch and
arrays saved by numpy when those are installed.
"""
import os
import struct
import sys
import zipfile
import zlib


# --- a pickle emitter: exactly the opcodes LibTorch's pickler writes -----------------------------------------------
class Pickle:
    def __init__(self):
        self.out = bytearray(b"\x80\x02")
        self.memo = {}

    def op(self, b):
        self.out += b
        return self

    def string(self, s):
        b = s.encode()
        return self.op(b"X" + struct.pack("<I", len(b)) + b)

    def int(self, v):
        if 0 <= v < 256:
            return self.op(b"K" + bytes([v]))
        if -(2**31) <= v < 2**31:
            return self.op(b"J" + struct.pack("<i", v))
        return self.op(b"\x8a\x08" + struct.pack("<q", v))

    def glob(self, module, name):
        key = (module, name)
        if key in self.memo:
            return self.op(b"j" + struct.pack("<I", self.memo[key]))
        self.op(("c%s\n%s\n" % (module, name)).encode())
        self.memo[key] = len(self.memo)
        return self.op(b"r" + struct.pack("<I", self.memo[key]))

    def int_tuple(self, values):
        self.op(b"(")
        for v in values:
            self.int(v)
        return self.op(b"t")

    def tensor(self, key, storage="FloatStorage", numel=1, offset=0, size=(1,), stride=(1,)):
        self.glob("torch._utils", "_rebuild_tensor_v2").op(b"(")
        self.op(b"(").string("storage").glob("torch", storage).string(key).string("cpu").int(numel).op(b"tQ")
        self.int(offset).int_tuple(size).int_tuple(stride).op(b"\x89")
        self.glob("collections", "OrderedDict").op(b")R")
        return self.op(b"tR")

    def module(self, cls, attributes):
        """attributes: list of (name, emit) where emit(pickle) writes the value."""
        self.glob("__torch__", cls).op(b")\x81}(")
        for name, emit in attributes:
            self.string(name)
            emit(self)
        return self.op(b"ub")

    def done(self):
        return bytes(self.out + b".")


def code_for(cls, parameters, buffers=(), extra=""):
    names = lambda ns: "[" + "".join('"%s", ' % n for n in ns) + "]"
    return ("class %s(Module):\n  __parameters__ = %s\n  __buffers__ = %s\n%s" %
            (cls, names(parameters), names(buffers), extra)).encode()


def f32(values):
    return struct.pack("<%df" % len(values), *values)


def write_archive(path, entries, compress=()):
    """entries: list of (name, bytes); names in `compress` are deflated. Duplicates are written as given."""
    with open(path, "wb") as f:
        z = zipfile.ZipFile(f, "w", zipfile.ZIP_STORED)
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED if name in compress else zipfile.ZIP_STORED
            z.writestr(info, data)
        z.close()


def write_streamed(path, entries, big_name, big_chunks):
    """Like write_archive, plus one deflated entry `big_name` written from the generator `big_chunks` (a bomb of
    gigabytes costs the generator one chunk of memory)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for name, data in entries:
            z.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), data)
        info = zipfile.ZipInfo(big_name, date_time=(2020, 1, 1, 0, 0, 0))
        info.compress_type = zipfile.ZIP_DEFLATED
        with z.open(info, "w", force_zip64=True) as w:
            for chunk in big_chunks:
                w.write(chunk)


def model(path, tensors, storages, code=None, extra_entries=(), byteorder=None, compress=(), prefix="m/"):
    """A TorchScript-shaped archive of one module `Net` whose parameters are `tensors` [(name, emit)]."""
    p = Pickle().module("Net", tensors).done()
    entries = [(prefix + "data.pkl", p)]
    entries.append((prefix + "code/__torch__.py", code if code is not None else code_for("Net", [n for n, _ in tensors])))
    for key, data in storages:
        entries.append((prefix + "data/" + key, data))
    if byteorder is not None:
        entries.append((prefix + "byteorder", byteorder))
    entries.append((prefix + "version", b"3\n"))
    entries.extend(extra_entries)
    write_archive(path, entries, compress={prefix + n for n in compress})


def linear(**kw):
    return lambda p: p.tensor(**kw)


# --- the hostile files -----------------------------------------------------------------------------------------
def good(out):
    model(os.path.join(out, "good.pt"),
          [("w", linear(key="0", numel=6, size=(2, 3), stride=(3, 1))), ("b", linear(key="1", numel=2, size=(2,)))],
          [("0", f32([1, 2, 3, 4, 5, 6])), ("1", f32([0.5, -0.5]))])


def pickle_bomb_pt(out):
    # A 1 MB .pt whose data.pkl inflates to 1 GB: a valid pickle, then padding after STOP (Python ignores it).
    head = Pickle().module("Net", [("w", linear(key="0"))]).done()
    def chunks():
        yield head
        zero = bytes(1 << 20)
        for _ in range(1000):
            yield zero
    write_streamed(os.path.join(out, "pickle_bomb.pt"),
                   [("m/code/__torch__.py", code_for("Net", ["w"])), ("m/data/0", f32([1.0])), ("m/version", b"3\n")],
                   "m/data.pkl", chunks())


def memoize_bomb(out):
    # 10^8 MEMOIZE opcodes (100 MB of pickle, about 100 KB deflated) inside a .pt, and 3*10^7 of them bare.
    head = b"\x80\x02N"
    def chunks():
        yield head
        block = b"\x94" * (1 << 20)
        for _ in range(100):
            yield block
        yield b"0" + Pickle().module("Net", [("w", linear(key="0"))]).done()[2:]
    write_streamed(os.path.join(out, "memoize_bomb.pt"),
                   [("m/code/__torch__.py", code_for("Net", ["w"])), ("m/data/0", f32([1.0])), ("m/version", b"3\n")],
                   "m/data.pkl", chunks())
    with open(os.path.join(out, "memoize_bomb.pkl"), "wb") as f:
        f.write(head + b"\x94" * 30_000_000 + b".")


def none_list(out):
    # A list of 2^24 Nones, appended one at a time (32 MiB of pickle).
    with open(os.path.join(out, "none_list.pkl"), "wb") as f:
        f.write(b"\x80\x02]" + b"Na" * (1 << 24) + b".")


def many_names(out, n=400_000):
    # n parameters, each with its own storage: fl-server's reader was quadratic in them.
    p = Pickle()
    p.glob("__torch__", "Net").op(b")\x81}(")
    for i in range(n):
        p.string("p%d" % i)
        p.tensor(key=str(i))
    body = p.op(b"ub").done()
    entries = [("m/data.pkl", body), ("m/code/__torch__.py", code_for("Net", ["p%d" % i for i in range(n)]))]
    one = f32([0.25])
    entries += [("m/data/%d" % i, one) for i in range(n)]
    entries.append(("m/version", b"3\n"))
    write_raw_zip(os.path.join(out, "many_names.pt"), entries)


def write_raw_zip(path, entries):
    """A stored ZIP written record by record (zipfile takes half a minute for 400,000 entries); from 65,535
    entries on, the end record's counts saturate and a ZIP64 end record and locator carry them."""
    out = bytearray()
    central = bytearray()
    for name, data in entries:
        n = name.encode()
        crc = zlib.crc32(data)
        offset = len(out)
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 0, 0, 0x21, crc, len(data), len(data), len(n), 0)
        out += n + data
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 0, 0, 0x21, crc, len(data), len(data),
                               len(n), 0, 0, 0, 0, 0, offset)
        central += n
    cd_offset = len(out)
    out += central
    count = len(entries)
    if count >= 0xFFFF:
        zip64 = len(out)
        out += struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, count, count, len(central), cd_offset)
        out += struct.pack("<IIQI", 0x07064B50, 0, zip64, 1)
        out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, len(central), cd_offset, 0)
    else:
        out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, count, count, len(central), cd_offset, 0)
    with open(path, "wb") as f:
        f.write(out)


def code_bombs(out):
    tensors = [("w", linear(key="0"))]
    storages = [("0", f32([1.0]))]
    model(os.path.join(out, "newline_bomb.pt"), tensors, storages, code=code_for("Net", ["w"]) + b"\n" * 100_000)
    model(os.path.join(out, "paren_bomb.pt"), tensors, storages,
          code=code_for("Net", ["w"], extra="  def f(self):\n    return " + "(" * 10_000 + "1" + ")" * 10_000 + "\n"))
    # 64 million newlines, deflated (64 MB in about 64 KB).
    def chunks():
        yield code_for("Net", ["w"])
        block = b"\n" * (1 << 20)
        for _ in range(64):
            yield block
    write_streamed(os.path.join(out, "newline_bomb_64m.pt"),
                   [("m/data.pkl", Pickle().module("Net", tensors).done()), ("m/data/0", f32([1.0])),
                    ("m/version", b"3\n")], "m/code/__torch__.py", chunks())


def small_bombs(out):
    # 100 storages of 1 MiB of zeros, each deflated to 1 KB and each within 16x the file, 100 MiB together.
    n = 100
    model(os.path.join(out, "small_bombs.pt"),
          [("p%d" % i, linear(key=str(i), numel=1 << 18)) for i in range(n)],
          [(str(i), bytes(1 << 20)) for i in range(n)], compress={"data/%d" % i for i in range(n)})


def tensor_attacks(out):
    def one(name, tensor, storages=(("0", f32([1.0] * 128)),), **kw):
        model(os.path.join(out, name + ".pt"), [("w", tensor)], list(storages), **kw)
    one("huge_offset", linear(key="0", numel=128, offset=2**62 + 2**28))
    one("huge_shape", linear(key="0", numel=128, size=(2**20, 2**20), stride=(2**20, 1)))
    one("negative_stride", linear(key="0", numel=128, size=(4,), stride=(-1,)))
    one("numel_past_record", linear(key="0", numel=1 << 20, size=(4,)))
    one("big_endian", linear(key="0", numel=128, size=(4,)), byteorder=b"big")
    one("nan_weight", linear(key="0", numel=4, size=(4,)), storages=[("0", f32([1.0, float("nan"), 2.0, 3.0]))])
    one("inf_weight", linear(key="0", numel=4, size=(4,)), storages=[("0", f32([1.0, 2.0, float("-inf"), 3.0]))])
    # Two references to one storage as different counts.
    model(os.path.join(out, "storage_two_counts.pt"),
          [("w", linear(key="0", numel=4, size=(4,))), ("v", linear(key="0", numel=2, size=(2,)))],
          [("0", f32([1, 2, 3, 4]))])
    # A tensor attribute that is neither parameter nor buffer, out of bounds: LibTorch loads it all the same.
    model(os.path.join(out, "hidden_tensor_out_of_bounds.pt"),
          [("w", linear(key="0", numel=4, size=(4,))), ("h", linear(key="1", numel=2, size=(9,)))],
          [("0", f32([1, 2, 3, 4])), ("1", f32([1, 2]))], code=code_for("Net", ["w"]))


def archive_attacks(out):
    tensors = [("w", linear(key="0", numel=2, size=(2,)))]
    # A duplicate 8-byte storage entry (LibTorch's miniz takes the first, zipfile the last).
    model(os.path.join(out, "duplicate_storage.pt"), tensors, [("0", f32([1.0, 2.0])), ("0", f32([3.0, 4.0]))])
    # Flipped storage bytes with a stale CRC.
    model(os.path.join(out, "stale_crc.pt"), tensors, [("0", f32([1.0, 2.0]))])
    flip_entry(os.path.join(out, "stale_crc.pt"), "m/data/0")
    # The same in an .npz's stored member (rows read without the rest of the member).
    arr = struct.pack("<8f", *range(8))
    header = npy_header("<f4", "(4, 2)")
    write_archive(os.path.join(out, "stale_crc.npz"), [("x.npy", header + arr)])
    flip_entry(os.path.join(out, "stale_crc.npz"), "x.npy", at=len(header) + 20)
    write_archive(os.path.join(out, "duplicate.npz"), [("x.npy", header + arr), ("x.npy", header + arr)])


def flip_entry(path, name, at=0):
    """Flips one byte of a stored entry's data in place, leaving its CRC as it was."""
    with zipfile.ZipFile(path) as z:
        info = z.getinfo(name)
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        n, m = struct.unpack("<HH", f.read(4))
        data = info.header_offset + 30 + n + m
        f.seek(data + at)
        b = f.read(1)
        f.seek(data + at)
        f.write(bytes([b[0] ^ 0xFF]))


def npy_header(descr, shape, version=1):
    text = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    pad = 64 - (10 + len(text) + 1) % 64
    text = text + " " * pad + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode()


def npy_attacks(out):
    nest = "(" * 65_000 + ")" * 65_000
    text = ("{'descr': '<f4', 'fortran_order': False, 'shape': %s, }" % nest) + "\n"
    with open(os.path.join(out, "nested.npy"), "wb") as f:
        f.write(b"\x93NUMPY\x02\x00" + struct.pack("<I", len(text)) + text.encode())
    with open(os.path.join(out, "nested.npy"), "rb") as f:
        write_archive(os.path.join(out, "nested.npz"), [("x.npy", f.read())])


def corpus(out):
    """Small valid seeds, one folder per reader."""
    for d in ("pickle", "zip", "npy", "npz", "torchscript"):
        os.makedirs(os.path.join(out, d), exist_ok=True)
    t = os.path.join(out, "torchscript")
    model(os.path.join(t, "linear.pt"),
          [("w", linear(key="0", numel=6, size=(2, 3), stride=(3, 1))), ("b", linear(key="1", numel=2, size=(2,)))],
          [("0", f32([1, 2, 3, 4, 5, 6])), ("1", f32([0.5, -0.5]))])
    model(os.path.join(t, "view_and_buffer.pt"),
          [("w", linear(key="0", numel=12, offset=2, size=(3, 2), stride=(1, 3))),
           ("n", linear(key="1", storage="LongStorage", numel=1, size=(), stride=()))],
          [("0", f32(range(12))), ("1", struct.pack("<q", 3))],
          code=code_for("Net", ["w"], ["n"], extra="  def forward(self, x: Tensor) -> Tensor:\n"
                        "    return torch.add(x, (self.w)[0])  # a comment (\n"),
          compress=("data.pkl",))
    with zipfile.ZipFile(os.path.join(t, "linear.pt")) as z:
        pkl = z.read("m/data.pkl")
    p = os.path.join(out, "pickle")
    open(os.path.join(p, "module.pkl"), "wb").write(pkl)
    open(os.path.join(p, "containers.pkl"), "wb").write(
        b"\x80\x02}q\x00(X\x01\x00\x00\x00a]q\x01(K\x01M\x00\x01J\xff\xff\xff\xff\x8a\x01\x80eX\x01\x00\x00\x00b"
        b"h\x01X\x01\x00\x00\x00c(G?\xf8\x00\x00\x00\x00\x00\x00N\x88\x89)\x85\x86\x87tU\x02hiC\x01zu.")
    n = os.path.join(out, "npy")
    open(os.path.join(n, "f4.npy"), "wb").write(npy_header("<f4", "(3, 2)") + struct.pack("<6f", *range(6)))
    open(os.path.join(n, "u1.npy"), "wb").write(npy_header("|u1", "(5,)") + bytes(range(5)))
    open(os.path.join(n, "scalar.npy"), "wb").write(npy_header("<i8", "()") + struct.pack("<q", 7))
    z = os.path.join(out, "npz")
    x = npy_header("<f4", "(4, 2)") + struct.pack("<8f", *range(8))
    y = npy_header("<i8", "(4,)") + struct.pack("<4q", 0, 1, 2, 3)
    write_archive(os.path.join(z, "stored.npz"), [("x_train.npy", x), ("y_train.npy", y)])
    write_archive(os.path.join(z, "deflated.npz"), [("x_train.npy", x), ("y_train.npy", y)],
                  compress={"x_train.npy", "y_train.npy"})
    try:  # a real one, when torch is there (the committed corpus has it)
        import torch
        torch.manual_seed(1)
        torch.jit.script(torch.nn.Linear(3, 2)).save(os.path.join(t, "real_linear.pt"))
        with zipfile.ZipFile(os.path.join(t, "real_linear.pt")) as archive:
            for name in archive.namelist():
                if name.endswith("/data.pkl") or name.endswith("/constants.pkl"):
                    with open(os.path.join(out, "pickle", "real_" + os.path.basename(name)), "wb") as f:
                        f.write(archive.read(name))
    except ImportError:
        pass
    try:  # and numpy's own writer
        import numpy as np
        np.save(os.path.join(n, "numpy_f2.npy"), np.arange(6, dtype=np.float16).reshape(2, 3))
        np.savez_compressed(os.path.join(z, "numpy_compressed.npz"), x=np.ones((3, 2), np.float32),
                            y=np.arange(3, dtype=np.int64))
    except ImportError:
        pass
    zp = os.path.join(out, "zip")
    write_archive(os.path.join(zp, "mixed.zip"), [("a/one.txt", b"hello\n" * 20), ("a/two.bin", bytes(range(64)))],
                  compress={"a/one.txt"})


ALL = {
    "good": good, "pickle_bomb": pickle_bomb_pt, "memoize_bomb": memoize_bomb, "none_list": none_list,
    "many_names": many_names, "code_bombs": code_bombs, "small_bombs": small_bombs, "tensor_attacks": tensor_attacks,
    "archive_attacks": archive_attacks, "npy_attacks": npy_attacks,
}

if __name__ == "__main__":
    if sys.argv[1] == "--corpus":
        corpus(sys.argv[2])
    else:
        out = sys.argv[1]
        os.makedirs(out, exist_ok=True)
        for name in sys.argv[2:] or list(ALL):
            ALL[name](out)
    print("written")

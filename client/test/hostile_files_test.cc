// fl-client must not trust the files it is given (issue 27): hostile TorchScript models, data files and
// availability traces, run through the real fl-client binary, each as the finding was made. Every file here is
// read at start, before fl-client reaches a server, so the client points at a loopback port nobody listens on;
// each case asserts exit status 2 (not a signal: the Subprocess reports 128 + signal), and that stderr names
// the file and the problem.
//
// The models are a small scripted nn.Linear(4, 2) exported by python3-torch in the test and then rewritten: its
// data.pkl's rebuild arguments of fc.weight / fc.bias, its storages, entries added to the archive, or bytes
// patched in place with the CRC left stale. Before the fix each one crashed fl-client (std::bad_alloc abort,
// SIGSEGV in fl-client's own flattening or in LibTorch's parser) or loaded without a word (heap memory as weights,
// NaN, flipped bytes, a big-endian record).
//
// The FIFO and /dev/zero cases have no deadline of their own: before the fix fl-client blocked forever or grew
// without bound, and the CTest timeout is what stops such a run.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fl/core/str_cat.h"
#include "fl/testing/python.h"
#include "fl/testing/run_tool.h"
#include "fl/testing/scratch_dir.h"
#include "fl/testing/subprocess.h"

namespace fl::client {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Longer than any CTest timeout: a run that hangs is stopped by CTest, not by a deadline of this test.
constexpr std::chrono::seconds kNoDeadline{3600};

#if FL_WITH_TORCH
// sys.argv[1]: output folder. small.pt (a scripted nn.Linear(4, 2)), small.npz (its data), then hostile variants.
constexpr const char* kHostileModelsScript = R"PY(
import os, re, struct, sys, zipfile
import numpy as np
import torch, torch.nn as nn

out = sys.argv[1]
torch.manual_seed(5)

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)
    def forward(self, x):
        return self.fc(x)

small = os.path.join(out, "small.pt")
torch.jit.script(Net()).save(small)
rng = np.random.default_rng(1)
np.savez(os.path.join(out, "small.npz"),
         x_train=rng.standard_normal((16, 4)).astype(np.float32), y_train=rng.integers(0, 2, 16).astype(np.int64),
         x_test=rng.standard_normal((8, 4)).astype(np.float32), y_test=rng.integers(0, 2, 8).astype(np.int64))

with zipfile.ZipFile(small) as z:
    entries = [(i.filename, z.read(i.filename), i.compress_type) for i in z.infolist()]
prefix = entries[0][0].split("/")[0] + "/"

def write(name, items):
    # items: (entry name, bytes, compression), written in that order (a name given twice is written twice).
    import warnings
    warnings.simplefilter("ignore")
    with zipfile.ZipFile(os.path.join(out, name), "w") as zout:
        for n, d, c in items:
            zout.writestr(zipfile.ZipInfo(n), d, compress_type=c)

def changed(name, change):
    write(name, [(n, change(n, d), c) for n, d, c in entries])

def pint(v):
    # A pickle integer: BININT1, BININT or LONG1 (two's complement, little-endian).
    if 0 <= v < 256:
        return b"K" + bytes([v])
    if -2**31 <= v < 2**31:
        return b"J" + struct.pack("<i", v)
    n = (v.bit_length() + 8) // 8
    return b"\x8a" + bytes([n]) + v.to_bytes(n, "little", signed=True)

# fc.weight: storage '0' of 8 floats, offset 0, sizes (2, 4), strides (4, 1). fc.bias: storage '1' of 2, (2,), (1,).
WEIGHT = re.compile(rb"K\x08tQq(.)K\x00\(K\x02K\x04t\(K\x04K\x01t", re.S)
BIAS = re.compile(rb"K\x02tQq(.)K\x00\(K\x02t\(K\x01t", re.S)

def rebuild(pattern, numel, offset, sizes, strides):
    def change(n, d):
        if not n.endswith("/data.pkl"):
            return d
        m = pattern.search(d)
        assert m, "rebuild arguments not found in data.pkl"
        new = (pint(numel) + b"tQq" + m.group(1) + pint(offset) + b"(" + b"".join(pint(s) for s in sizes) + b"t(" +
               b"".join(pint(s) for s in strides) + b"t")
        return d[:m.start()] + new + d[m.end():]
    return change

def storage(key, data):
    return lambda n, d: data if n == prefix + "data/" + key else d

def both(*changes):
    def change(n, d):
        for c in changes:
            d = c(n, d)
        return d
    return change

weight = {n: d for n, d, c in entries}[prefix + "data/0"]

# A tensor declared (2^20, 2^20) over a 512-byte storage.
changed("huge_shape.pt", both(rebuild(WEIGHT, 128, 0, (2**20, 2**20), (2**20, 1)), storage("0", bytes(512))))
# A storage offset of 2^62 + 2^28.
changed("huge_offset.pt", rebuild(WEIGHT, 8, 2**62 + 2**28, (2, 4), (4, 1)))
# A negative stride: fc.bias read backwards from element 1 of its storage.
changed("negative_stride.pt", rebuild(BIAS, 2, 1, (2,), (-1,)))
# NaN and infinity among the values (CRCs right: only the values are wrong).
changed("nan_weight.pt", storage("0", struct.pack("<f", float("nan")) + weight[4:]))
changed("inf_bias.pt", storage("1", struct.pack("<ff", 0.5, float("inf"))))
# The weight's storage entry twice, an 8-byte one first: LibTorch takes it and reads heap memory past its end.
write("duplicate_storage.pt", [(prefix + "data/0", weight[:8], zipfile.ZIP_STORED)] + entries)
# A big-endian byte-order record (written by PyTorch on big-endian machines; the values here are little-endian).
write("big_endian.pt", entries + [(prefix + "byteorder", b"big", zipfile.ZIP_STORED)])
# The root class's code file after 64 million newlines (64 MiB, about 64 KiB deflated).
changed("newline_bomb.pt", lambda n, d: b"\n" * (64 << 20) + d if n == prefix + "code/__torch__.py" else d)
# Flipped bytes of the weight's storage, the CRC left as it was: the archive's bytes patched in place.
raw = bytearray(open(small, "rb").read())
with zipfile.ZipFile(small) as z:
    info = z.getinfo(prefix + "data/0")
name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26:info.header_offset + 30])
at = info.header_offset + 30 + name_len + extra_len
for k in range(4):
    raw[at + k] ^= 0xFF
open(os.path.join(out, "stale_crc.pt"), "wb").write(bytes(raw))
print("written")
)PY";
#endif

class HostileFilesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { dir_ = new fl::testing::ScratchDir("client_hostile_files"); }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string File(const std::string& name) { return dir_->File(name); }

  // The hostile models, written once per process (each test is its own process under CTest).
  static void WriteModels() {
#if FL_WITH_TORCH
    static const absl::Status written = [] {
      const std::string script = File("hostile_models.py");
      std::ofstream(script) << kHostileModelsScript;
      auto run = fl::testing::RunPythonFile(script, {dir_->path().string()}, script + ".log");
      if (run.ok()) return absl::OkStatus();
      if (absl::Status s = fl::testing::RequirePythonModule("torch", File("require_torch.log")); !s.ok()) return s;
      return run.status();
    }();
    ASSERT_TRUE(written.ok()) << written.message();
#endif
  }

  // fl-client with `args` after its connection flags: a loopback port nobody listens on, plaintext, one thread.
  static fl::testing::ToolResult RunClient(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {FL_CLIENT_BIN,
                                     "--server",
                                     fl::StrCat("127.0.0.1:", fl::testing::FreeLoopbackPort()),
                                     "--insecure",
                                     "--give-up-after-s",
                                     "1",
                                     "--threads",
                                     "1",
                                     "--device",
                                     "cpu"};
    argv.insert(argv.end(), args.begin(), args.end());
    return fl::testing::RunTool(argv, *dir_, kNoDeadline);
  }

  // Exit 2 (a refusal at start, not a signal) with every one of `needles` in the output.
  static void ExpectRefused(const fl::testing::ToolResult& result, const std::vector<std::string>& needles) {
    EXPECT_EQ(result.code, 2) << "exit status (128 + N: killed by signal N)\n" << result.output;
    for (const std::string& needle : needles) EXPECT_THAT(result.output, HasSubstr(needle)) << result.output;
  }

  static void MakeFifo(const std::string& path) { ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0) << path; }

  static fl::testing::ScratchDir* dir_;
};

fl::testing::ScratchDir* HostileFilesTest::dir_ = nullptr;

#if FL_WITH_TORCH
TEST_F(HostileFilesTest, TheUnalteredModelLoads) {
  // The control: the same model unaltered passes every check and fl-client goes on to look for the server (it
  // gives up after a second: exit 1, not a refusal of its files).
  WriteModels();
  const auto result = RunClient({"--model", File("small.pt"), "--data", File("small.npz")});
  EXPECT_EQ(result.code, 1) << result.output;
  EXPECT_THAT(result.output, HasSubstr("model small (classification): 2 tensors, 10 values")) << result.output;
}

TEST_F(HostileFilesTest, ATensorLargerThanItsStorageIsRefusedNotAborted) {
  WriteModels();
  ExpectRefused(RunClient({"--model", File("huge_shape.pt"), "--data", File("small.npz")}),
                {File("huge_shape.pt"), "fc.weight", "storage"});
}

TEST_F(HostileFilesTest, AStorageOffsetFarPastItsStorageIsRefusedNotASegfault) {
  WriteModels();
  ExpectRefused(RunClient({"--model", File("huge_offset.pt"), "--data", File("small.npz")}),
                {File("huge_offset.pt"), "fc.weight", "offset"});
}

TEST_F(HostileFilesTest, ANegativeStrideIsRefused) {
  WriteModels();
  const auto result = RunClient({"--model", File("negative_stride.pt"), "--data", File("small.npz")});
  ExpectRefused(result, {File("negative_stride.pt"), "fc.bias", "stride"});
  // Refused at load, not by LibTorch in the middle of the probe's forward pass.
  EXPECT_THAT(result.output, Not(HasSubstr("forward failed"))) << result.output;
}

TEST_F(HostileFilesTest, ADuplicateStorageEntryIsRefusedNotLoadedAsHeapMemory) {
  WriteModels();
  ExpectRefused(RunClient({"--model", File("duplicate_storage.pt"), "--data", File("small.npz")}),
                {File("duplicate_storage.pt"), "data/0"});
}

TEST_F(HostileFilesTest, FlippedStorageBytesWithAStaleCrcAreRefused) {
  WriteModels();
  ExpectRefused(RunClient({"--model", File("stale_crc.pt"), "--data", File("small.npz")}),
                {File("stale_crc.pt"), "CRC"});
}

TEST_F(HostileFilesTest, ABigEndianByteOrderRecordIsRefused) {
  WriteModels();
  ExpectRefused(RunClient({"--model", File("big_endian.pt"), "--data", File("small.npz")}),
                {File("big_endian.pt"), "big"});
}

TEST_F(HostileFilesTest, NanAndInfinityWeightsAreRefused) {
  WriteModels();
  ExpectRefused(RunClient({"--model", File("nan_weight.pt"), "--data", File("small.npz")}),
                {File("nan_weight.pt"), "fc.weight", "nan"});
  ExpectRefused(RunClient({"--model", File("inf_bias.pt"), "--data", File("small.npz")}),
                {File("inf_bias.pt"), "fc.bias", "inf"});
}

TEST_F(HostileFilesTest, ACodeFileOfMillionsOfNewlinesIsRefusedNotASegfault) {
  WriteModels();
  ExpectRefused(RunClient({"--model", File("newline_bomb.pt"), "--data", File("small.npz")}),
                {File("newline_bomb.pt"), "code/__torch__.py"});
}

TEST_F(HostileFilesTest, DevZeroAsATextCorpusIsRefusedBeforeItIsRead) {
  WriteModels();
  ExpectRefused(RunClient({"--model", File("small.pt"), "--task", "next-token", "--data", "/dev/zero"}),
                {"/dev/zero", "a character device, not a regular file"});
}

TEST_F(HostileFilesTest, AFifoAsDataIsRefusedInsteadOfBlocking) {
  WriteModels();
  MakeFifo(File("corpus"));
  ExpectRefused(RunClient({"--model", File("small.pt"), "--task", "next-token", "--data", File("corpus")}),
                {File("corpus"), "a FIFO, not a regular file"});
  MakeFifo(File("fifo.npz"));
  ExpectRefused(RunClient({"--model", File("small.pt"), "--data", File("fifo.npz")}),
                {File("fifo.npz"), "a FIFO, not a regular file"});
}

TEST_F(HostileFilesTest, AFifoOrDevZeroAsAnIdxFileIsRefused) {
  // A Fashion-MNIST folder whose files are FIFOs, another whose files are links to /dev/zero (the built-in CNN
  // reads them).
  for (const std::string folder : {"idx_fifos", "idx_zeros"}) {
    std::filesystem::create_directories(File(folder));
    for (const char* name :
         {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}) {
      const std::string path = File(fl::StrCat(folder, "/", name));
      if (folder == "idx_fifos") {
        MakeFifo(path);
      } else {
        std::filesystem::create_symlink("/dev/zero", path);
      }
    }
    ExpectRefused(RunClient({"--model", "cnn", "--data-dir", File(folder)}),
                  {File(folder),
                   folder == "idx_fifos" ? "a FIFO, not a regular file" : "a character device, not a regular file"});
  }
}
#endif

TEST_F(HostileFilesTest, AFifoOrDevZeroAsTheAvailabilityTraceIsRefused) {
  MakeFifo(File("availability"));
  for (const std::string& trace : {File("availability"), std::string("/dev/zero")}) {
    ExpectRefused(
        RunClient({"--model", "synthetic:10", "--instances", "2", "--availability", fl::StrCat("trace:", trace)}),
        {trace, "availability trace", "not a regular file"});
  }
}

}  // namespace
}  // namespace fl::client

// The torch-free TorchScript reader against real files exported by python3-torch: the tensor order, roles,
// dtypes, shapes and values equal Python's state_dict() for scripted and traced CNNs with BatchNorm and
// Dropout, a nested ModuleList/ModuleDict model with every dtype, views, tied weights and None parameters,
// and a GRU + transformer language model; every bad input gets an error naming the file; mutated archives
// never crash the reader.
#include "fl/formats/torchscript_archive.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fl/testing/python.h"
#include "fl/testing/scratch_dir.h"
#include "torchscript_test_models.h"

namespace fl::formats {
namespace {

using ::testing::HasSubstr;

// Bad inputs and mutated archives, written into sys.argv[1].
constexpr const char* kBadFilesScript = R"PY(
import io, os, random, sys, zipfile
import numpy as np
import torch, torch.nn as nn

out = sys.argv[1]
torch.manual_seed(3)

class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.bn = nn.BatchNorm1d(2)
    def forward(self, x):
        return self.bn(self.lin(x))

class BuffersOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("offset", torch.ones(3))
    def forward(self, x):
        return x + self.offset

class BoolBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.register_buffer("keep", torch.tensor([True, False]))
    def forward(self, x):
        return self.lin(x)

class Int8Param(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.register_buffer("codes", torch.tensor([1, -1], dtype=torch.int8))
    def forward(self, x):
        return self.lin(x)

small = Small()
torch.jit.script(small).save(os.path.join(out, "small.pt"))
torch.save(small.state_dict(), os.path.join(out, "state_dict.pt"))
torch.save(small.state_dict(), os.path.join(out, "legacy.pt"), _use_new_zipfile_serialization=False)
np.savez(os.path.join(out, "data.npz"), x_train=np.zeros((2, 3), np.float32))
with open(os.path.join(out, "text.pt"), "w") as f:
    f.write("not a model\n")
torch.jit.script(BuffersOnly()).save(os.path.join(out, "buffers_only.pt"))
torch.jit.script(nn.ReLU()).save(os.path.join(out, "no_tensors.pt"))
torch.jit.script(BoolBuffer()).save(os.path.join(out, "bool_buffer.pt"))
torch.jit.script(Int8Param()).save(os.path.join(out, "int8_buffer.pt"))

def rewrite(src, dst, change):
    # Copies the archive entry by entry; change(name, bytes) returns new bytes, or None to drop the entry.
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = change(info.filename, zin.read(info.filename))
            if data is not None:
                zout.writestr(info.filename, data)

small_pt = os.path.join(out, "small.pt")
rewrite(small_pt, os.path.join(out, "short_storage.pt"),
        lambda n, d: d[: len(d) // 2] if n.endswith("/data/0") else d)
rewrite(small_pt, os.path.join(out, "missing_storage.pt"), lambda n, d: None if n.endswith("/data/1") else d)
rewrite(small_pt, os.path.join(out, "missing_code.pt"),
        lambda n, d: None if n.endswith("code/__torch__/torch/nn/modules/linear.py") else d)

# Mutated archives (CRCs recomputed, so the reader's own checks are what meets the damage): bytes of data.pkl,
# bytes of the class files, truncated data.pkl.
rng = random.Random(99)
count = 0
def mutate_bytes(d):
    d = bytearray(d)
    for _ in range(rng.randint(1, 6)):
        d[rng.randrange(len(d))] = rng.randrange(256)
    return bytes(d)
for i in range(300):
    rewrite(small_pt, os.path.join(out, "fuzz_pkl_%d.pt" % i),
            lambda n, d: mutate_bytes(d) if n.endswith("/data.pkl") else d)
for i in range(100):
    rewrite(small_pt, os.path.join(out, "fuzz_code_%d.pt" % i),
            lambda n, d: mutate_bytes(d) if n.endswith(".py") else d)
with zipfile.ZipFile(small_pt) as z:
    pkl_len = len(z.read([n for n in z.namelist() if n.endswith("/data.pkl")][0]))
for i, cut in enumerate(range(0, pkl_len, max(1, pkl_len // 60))):
    rewrite(small_pt, os.path.join(out, "fuzz_cut_%d.pt" % i),
            lambda n, d: d[:cut] if n.endswith("/data.pkl") else d)
print("written")
)PY";

// Each test runs (in its own process, as CTest runs them) only the export it needs.
class TorchScriptArchiveTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { dir_ = new fl::testing::ScratchDir("torchscript_archive_test"); }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static ::testing::AssertionResult Models() {
    static const ::testing::AssertionResult done = testing::ExportTestModels(dir_->path().string());
    return done;
  }
  static ::testing::AssertionResult BadFiles() {
    static const ::testing::AssertionResult done =
        testing::RunTorchScript(dir_->path().string(), "bad_files.py", kBadFilesScript);
    return done;
  }
  static std::string File(const std::string& name) { return dir_->File(name); }
  static std::string ErrorOf(const std::string& name) {
    auto read = ReadTorchScriptModel(File(name));
    if (read.ok()) return "(read without error)";
    EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument) << read.status();
    return std::string(read.status().message());
  }

  static fl::testing::ScratchDir* dir_;
};
fl::testing::ScratchDir* TorchScriptArchiveTest::dir_ = nullptr;

TEST_F(TorchScriptArchiveTest, SpecAndValuesEqualPythonStateDict) {
  ASSERT_TRUE(Models());
  for (const char* model : testing::kModelNames) {
    SCOPED_TRACE(model);
    auto read = ReadTorchScriptModel(File(std::string(model) + ".pt"));
    ASSERT_TRUE(read.ok()) << read.status();
    const std::vector<testing::ExpectedTensor> expected =
        testing::ReadExpectedKeys(File(std::string(model) + ".keys.txt"));
    ASSERT_FALSE(expected.empty());
    ASSERT_EQ(read->tensors.size(), expected.size());
    ASSERT_EQ(read->spec.num_tensors(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      const ScriptTensor& got = read->tensors[i];
      const core::TensorSpec& spec = read->spec.tensors()[i];
      EXPECT_EQ(got.name, expected[i].name) << "tensor " << i;
      EXPECT_EQ(spec.name, expected[i].name);
      EXPECT_EQ(core::DTypeName(got.dtype), expected[i].dtype) << got.name;
      EXPECT_EQ(spec.dtype, got.dtype);
      EXPECT_EQ(got.shape, expected[i].shape) << got.name;
      EXPECT_EQ(spec.shape, got.shape);
      EXPECT_EQ(got.is_parameter, expected[i].is_parameter) << got.name;
    }
    const std::vector<float> values = testing::ReadFloats(File(std::string(model) + ".f32"));
    ASSERT_EQ(read->values.size(), values.size());
    ASSERT_EQ(read->spec.num_elements(), values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      ASSERT_EQ(read->values[i], values[i])
          << "element " << i << " of " << read->spec.tensors()[read->spec.TensorIndexOfElement(i)].name;
    }
  }
}

TEST_F(TorchScriptArchiveTest, ScriptedAndTracedCnnHaveOneSpec) {
  ASSERT_TRUE(Models());
  auto scripted = ReadTorchScriptModel(File("cnn_scripted.pt"));
  auto traced = ReadTorchScriptModel(File("cnn_traced.pt"));
  ASSERT_TRUE(scripted.ok()) << scripted.status();
  ASSERT_TRUE(traced.ok()) << traced.status();
  EXPECT_EQ(scripted->spec.fingerprint(), traced->spec.fingerprint());
  EXPECT_EQ(scripted->root_class, "__torch__.Cnn");
  EXPECT_THAT(traced->root_class, HasSubstr("Cnn"));
  const core::TensorSpec* counter = scripted->spec.Find("features.1.num_batches_tracked");
  ASSERT_NE(counter, nullptr);
  EXPECT_EQ(counter->dtype, core::DType::kInt64);
  EXPECT_TRUE(counter->shape.empty());
  EXPECT_EQ(scripted->values[counter->offset], 3.0f);  // three training batches before export
}

TEST_F(TorchScriptArchiveTest, NotTorchScriptFilesSayHowToExport) {
  ASSERT_TRUE(BadFiles());
  for (const char* name : {"state_dict.pt", "legacy.pt", "data.npz", "text.pt"}) {
    SCOPED_TRACE(name);
    const std::string error = ErrorOf(name);
    EXPECT_THAT(error, HasSubstr(File(name)));
    EXPECT_THAT(error, HasSubstr("torch.jit.script(model).save(path)"));
  }
  EXPECT_THAT(ErrorOf("state_dict.pt"), HasSubstr("torch.save() file (a state_dict"));
  EXPECT_THAT(ErrorOf("legacy.pt"), HasSubstr("bare pickle"));
  EXPECT_THAT(ErrorOf("data.npz"), HasSubstr("not a TorchScript model"));
  auto missing = ReadTorchScriptModel(File("no_such_file.pt"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr(File("no_such_file.pt")));
}

TEST_F(TorchScriptArchiveTest, ModelsWithoutParametersAreRefused) {
  ASSERT_TRUE(BadFiles());
  for (const char* name : {"buffers_only.pt", "no_tensors.pt"}) {
    const std::string error = ErrorOf(name);
    EXPECT_THAT(error, HasSubstr(File(name)));
    EXPECT_THAT(error, HasSubstr("has no parameters"));
  }
}

TEST_F(TorchScriptArchiveTest, UnsupportedDtypesNameTheTensor) {
  ASSERT_TRUE(BadFiles());
  EXPECT_THAT(ErrorOf("bool_buffer.pt"), HasSubstr("buffer 'keep' is stored as torch.BoolStorage"));
  EXPECT_THAT(ErrorOf("bool_buffer.pt"), HasSubstr("supported: float32, float16, bfloat16"));
  EXPECT_THAT(ErrorOf("int8_buffer.pt"), HasSubstr("buffer 'codes' is stored as torch.CharStorage"));
}

TEST_F(TorchScriptArchiveTest, CorruptArchivesNameTheFileAndTensor) {
  ASSERT_TRUE(BadFiles());
  const std::string short_storage = ErrorOf("short_storage.pt");
  EXPECT_THAT(short_storage, HasSubstr(File("short_storage.pt")));
  EXPECT_THAT(short_storage, HasSubstr("tensor 'lin.weight'"));
  EXPECT_THAT(short_storage, HasSubstr("corrupt or truncated"));
  EXPECT_THAT(ErrorOf("missing_storage.pt"), HasSubstr("tensor 'lin.bias'"));
  EXPECT_THAT(ErrorOf("missing_storage.pt"), HasSubstr("is missing from the archive"));
  EXPECT_THAT(ErrorOf("missing_code.pt"), HasSubstr("code/__torch__/torch/nn/modules/linear.py is missing"));
}

// The whole file cut short at many lengths: an error naming the file each time (the ZIP directory is at the
// end, so most cuts fail in the ZIP reader; those past it reach the pickle and storages).
TEST_F(TorchScriptArchiveTest, TruncatedFilesAreErrors) {
  ASSERT_TRUE(BadFiles());
  const std::string bytes = testing::ReadFileBytes(File("small.pt"));
  ASSERT_GT(bytes.size(), 100u);
  const std::string cut_path = File("cut.pt");
  for (size_t n = 0; n < bytes.size(); n += 1 + n / 16) {
    std::ofstream(cut_path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(n));
    auto read = ReadTorchScriptModel(cut_path);
    ASSERT_FALSE(read.ok()) << "read a file cut to " << n << " of " << bytes.size() << " bytes";
    EXPECT_THAT(std::string(read.status().message()), HasSubstr(cut_path));
  }
}

// Archives whose data.pkl or class files were mutated (with valid CRCs) or cut short: the reader returns a
// model or an error naming the file, and never crashes (run under the asan preset too).
TEST_F(TorchScriptArchiveTest, MutatedArchivesNeverCrash) {
  ASSERT_TRUE(BadFiles());
  size_t files = 0;
  size_t errors = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir_->path())) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with("fuzz_")) continue;
    ++files;
    auto read = ReadTorchScriptModel(entry.path().string());
    if (!read.ok()) {
      ++errors;
      EXPECT_THAT(std::string(read.status().message()), HasSubstr(name));
    } else {
      EXPECT_EQ(read->values.size(), read->spec.num_elements());
    }
  }
  EXPECT_GE(files, 400u);
  EXPECT_GT(errors, 0u);
}

}  // namespace
}  // namespace fl::formats

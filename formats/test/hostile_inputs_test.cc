// Issue 27, the torch-free readers: hostile files written by formats/test/hostile_files.py (the way the outside
// harness made them) are refused before they cost, each with an error naming the file and the problem. The
// "costs gigabytes" files are read in a forked child under RLIMIT_AS (its address space at the start plus a
// stated headroom): a reader that balloons dies of std::bad_alloc there, and the test fails on its exit code.
// No test here measures time; the quadratic case is a size that takes many minutes when quadratic (the CTest
// timeout fails it) and a second when not.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fl/formats/npy.h"
#include "fl/formats/pickle.h"
#include "fl/formats/torchscript_archive.h"
#include "fl/formats/zip_archive.h"
#include "fl/testing/python.h"
#include "fl/testing/scratch_dir.h"
#include "torchscript_test_models.h"

#ifndef FL_FORMATS_TEST_SOURCE_DIR
#error "FL_FORMATS_TEST_SOURCE_DIR must name formats/test (set in formats/CMakeLists.txt)"
#endif

namespace fl::formats {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr size_t kMiB = size_t{1} << 20;

// What a child reports: its exit code (0 reader succeeded, 1 reader refused; 128 + signal when killed, e.g.
// 134 for the abort of an uncaught std::bad_alloc), the reader's message and the child's peak RSS.
struct ChildResult {
  int code = -1;
  std::string message;
};

// Runs `body` in a forked child whose address space may grow by at most `headroom` bytes beyond what it has at
// the start. `body` returns the reader's status; the message comes back through a pipe.
ChildResult RunBounded(size_t headroom, const std::function<absl::Status()>& body) {
  int fds[2];
  if (pipe(fds) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    size_t vm_kib = 0;
    if (FILE* status = std::fopen("/proc/self/status", "r")) {
      char line[256];
      while (std::fgets(line, sizeof line, status) != nullptr) {
        if (std::sscanf(line, "VmSize: %zu kB", &vm_kib) == 1) break;
      }
      std::fclose(status);
    }
    struct rlimit limit {};
    limit.rlim_cur = limit.rlim_max = vm_kib * 1024 + headroom;
#if !defined(__SANITIZE_ADDRESS__)  // AddressSanitizer reserves terabytes of shadow address space
    setrlimit(RLIMIT_AS, &limit);
#endif
    const absl::Status status = body();
    struct rusage usage {};
    getrusage(RUSAGE_SELF, &usage);
    const std::string report = std::string(status.message()) + "\npeak_rss_kib=" + std::to_string(usage.ru_maxrss);
    (void)!write(fds[1], report.data(), report.size());
    _exit(status.ok() ? 0 : 1);
  }
  close(fds[1]);
  ChildResult result;
  char buffer[4096];
  ssize_t n = 0;
  while ((n = read(fds[0], buffer, sizeof buffer)) > 0) result.message.append(buffer, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  result.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::span<const uint8_t> Span(const std::string& s) { return {reinterpret_cast<const uint8_t*>(s.data()), s.size()}; }

class HostileInputsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { dir_ = new fl::testing::ScratchDir("hostile_inputs_test"); }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  // Writes the named groups of hostile_files.py (CTest runs each test in its own process: only what it needs).
  static ::testing::AssertionResult Write(const std::vector<std::string>& groups) {
    std::vector<std::string> args = {dir_->path().string()};
    args.insert(args.end(), groups.begin(), groups.end());
    auto run = fl::testing::RunPythonFile(std::string(FL_FORMATS_TEST_SOURCE_DIR) + "/hostile_files.py", args,
                                          dir_->File("hostile_files.log"));
    if (run.ok()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << run.status().message();
  }
  static std::string File(const std::string& name) { return dir_->File(name); }
  static std::string CheckError(const std::string& name) {
    absl::Status status = CheckTorchScriptFile(File(name));
    return status.ok() ? "(passed the check)" : std::string(status.message());
  }
  static std::string ReadError(const std::string& name) {
    auto read = ReadTorchScriptModel(File(name));
    return read.ok() ? "(read without error)" : std::string(read.status().message());
  }

  static fl::testing::ScratchDir* dir_;
};
fl::testing::ScratchDir* HostileInputsTest::dir_ = nullptr;

// --- small files that cost gigabytes -----------------------------------------------------------------------

// A 1 MB .pt whose data.pkl inflates to 1 GB: refused from its declared size, before inflating, by both the
// reader (fl-server) and the check (fl-client), within 64 MiB of address space.
TEST_F(HostileInputsTest, PickleDeflateBombIsRefusedBeforeInflating) {
  ASSERT_TRUE(Write({"pickle_bomb"}));
  const std::string path = File("pickle_bomb.pt");
  for (int check = 0; check < 2; ++check) {
    ChildResult r =
        RunBounded(64 * kMiB, [&] { return check ? CheckTorchScriptFile(path) : ReadTorchScriptModel(path).status(); });
    EXPECT_EQ(r.code, 1) << r.message;
    EXPECT_THAT(r.message, AllOf(HasSubstr(path), HasSubstr("data.pkl")));
    EXPECT_THAT(r.message, check ? HasSubstr("more than 16 times the file's size") : HasSubstr("over the limit"));
  }
}

// 10^8 MEMOIZE opcodes deflated into a 100 KB .pt: refused before the pickle is parsed.
TEST_F(HostileInputsTest, MemoizeBombInAnArchiveIsRefused) {
  ASSERT_TRUE(Write({"memoize_bomb"}));
  const std::string path = File("memoize_bomb.pt");
  ChildResult r = RunBounded(64 * kMiB, [&] { return ReadTorchScriptModel(path).status(); });
  EXPECT_EQ(r.code, 1) << r.message;
  EXPECT_THAT(r.message, AllOf(HasSubstr(path), HasSubstr("m/data.pkl"), HasSubstr("over the limit")));
}

// 3*10^7 MEMOIZE opcodes in a bare 30 MB pickle: legal, so it parses, at 4 bytes a memo entry (an unordered_map
// took about 40: 1.2 GB) — within 256 MiB of address space.
TEST_F(HostileInputsTest, MemoizeBombPickleCostsAFewBytesAnEntry) {
  ASSERT_TRUE(Write({"memoize_bomb"}));
  const std::string bytes = ReadBytes(File("memoize_bomb.pkl"));
  ASSERT_EQ(bytes.size(), 30'000'004u);
  ChildResult r = RunBounded(256 * kMiB, [&] { return ParsePickle(Span(bytes), "memoize_bomb.pkl").status(); });
  EXPECT_EQ(r.code, 0) << r.message;
  // The accounting itself, in this process (cheap now): at most 8 bytes of memory per byte of pickle.
  auto doc = ParsePickle(Span(bytes), "memoize_bomb.pkl");
  ASSERT_TRUE(doc.ok()) << doc.status();
  EXPECT_LE(doc->memory_bytes(), 8 * bytes.size());
}

// A list of 2^24 Nones (a 32 MiB pickle): one shared None and 4 bytes an item, within 256 MiB (88-byte values
// took 1.5 GB).
TEST_F(HostileInputsTest, ListOfManyNonesCostsItsItemsOnly) {
  ASSERT_TRUE(Write({"none_list"}));
  const std::string bytes = ReadBytes(File("none_list.pkl"));
  ChildResult r = RunBounded(256 * kMiB, [&]() -> absl::Status {
    auto doc = ParsePickle(Span(bytes), "none_list.pkl");
    if (!doc.ok()) return doc.status();
    if (doc->items(doc->root()).size() != (size_t{1} << 24)) return absl::InternalError("wrong length");
    return absl::OkStatus();
  });
  EXPECT_EQ(r.code, 0) << r.message;
}

// Memory, not only counts, is bounded: a pickle whose values would take more than its budget is refused when it
// gets there, naming the pickle.
TEST_F(HostileInputsTest, PickleMemoryBudgetRefusesWithTheNumbers) {
  std::string p = "\x80\x02(";
  for (int i = 0; i < 100'000; ++i)
    p += std::string("X\x01\x00\x00\x00z", 6);  // 100,000 one-byte strings: values, not counts
  p += "t.";
  PickleLimits limits;
  limits.max_memory_bytes = 1 * kMiB;
  auto doc = ParsePickle(Span(p), "budget.pkl", limits);
  ASSERT_FALSE(doc.ok());
  EXPECT_THAT(std::string(doc.status().message()),
              AllOf(HasSubstr("budget.pkl"), HasSubstr("would take more than 1048576 bytes of memory")));
  EXPECT_TRUE(ParsePickle(Span(p), "budget.pkl").ok());
}

// 100 deflated storages, each within the per-entry bound, 100 MiB together from a 130 KB file: refused once the
// total passes 16 times the file, by the reader (before inflating the third) and the check (before any).
TEST_F(HostileInputsTest, ManySmallDeflateBombsAreRefusedTogether) {
  ASSERT_TRUE(Write({"small_bombs"}));
  const std::string path = File("small_bombs.pt");
  for (const std::string& error : {CheckError("small_bombs.pt"), ReadError("small_bombs.pt")}) {
    EXPECT_THAT(error, AllOf(HasSubstr(path), HasSubstr("16 times the file's size")));
  }
}

// --- 400,000 parameter names -----------------------------------------------------------------------------

// fl-server's reader matched each attribute against the class's whole parameter list and searched the ZIP
// directory linearly for each storage: quadratic, past a minute at 400,000 names. Now hash sets and a sorted
// index: a few seconds here (no time is asserted: quadratic would run into the CTest timeout).
TEST_F(HostileInputsTest, FourHundredThousandParameterNamesReadInNLogN) {
  ASSERT_TRUE(Write({"many_names"}));
  auto read = ReadTorchScriptModel(File("many_names.pt"));
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->tensors.size(), 400'000u);
  EXPECT_EQ(read->tensors.back().name, "p399999");
  EXPECT_EQ(read->values.back(), 0.25f);
  EXPECT_TRUE(CheckTorchScriptFile(File("many_names.pt")).ok());
}

// --- code files LibTorch's parser compiles ------------------------------------------------------------------

TEST_F(HostileInputsTest, CodeFileBombsAreRefusedByTheCheck) {
  ASSERT_TRUE(Write({"code_bombs"}));
  EXPECT_THAT(CheckError("newline_bomb.pt"), AllOf(HasSubstr(File("newline_bomb.pt")), HasSubstr("m/code/__torch__.py"),
                                                   HasSubstr("more than 256 blank lines in a row")));
  EXPECT_THAT(CheckError("paren_bomb.pt"),
              AllOf(HasSubstr(File("paren_bomb.pt")), HasSubstr("nests brackets more than 64 deep")));
  // 64 million newlines deflated into 64 KB: refused from the declared size, by the check and the reader.
  ChildResult r = RunBounded(64 * kMiB, [&] { return CheckTorchScriptFile(File("newline_bomb_64m.pt")); });
  EXPECT_EQ(r.code, 1) << r.message;
  EXPECT_THAT(r.message, AllOf(HasSubstr(File("newline_bomb_64m.pt")), HasSubstr("m/code/__torch__.py")));
  EXPECT_THAT(ReadError("newline_bomb_64m.pt"), HasSubstr("over the limit"));
}

// --- what fl-client trusted LibTorch with -------------------------------------------------------------------

TEST_F(HostileInputsTest, TensorsReachingOutsideTheirStorageAreRefused) {
  ASSERT_TRUE(Write({"good", "tensor_attacks"}));
  EXPECT_TRUE(CheckTorchScriptFile(File("good.pt")).ok()) << CheckError("good.pt");
  struct Case {
    const char* file;
    const char* expected;
  } cases[] = {
      {"huge_offset.pt",
       "tensor 'w' (shape (1), stride (1), offset 4611686018695823360) reaches element "
       "4611686018695823360 of its storage m/data/0, which holds 128"},
      {"huge_shape.pt",
       "tensor 'w' (shape (1048576, 1048576), stride (1048576, 1), offset 0) reaches element "
       "1099511627775 of its storage m/data/0"},
      {"negative_stride.pt", "tensor 'w' has a negative stride (-1)"},
      {"numel_past_record.pt",
       "tensor 'w' declares a storage of 1048576 torch.FloatStorage elements (4194304 bytes) but m/data/0 holds 512"},
      {"storage_two_counts.pt", "tensor 'v' refers to m/data/0 as 2 torch.FloatStorage elements, another tensor as 4"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.file);
    for (const std::string& error : {CheckError(c.file), ReadError(c.file)}) {
      EXPECT_THAT(error, AllOf(HasSubstr(File(c.file)), HasSubstr(c.expected)));
    }
  }
  // An attribute that is neither parameter nor buffer: fl does not read it, LibTorch does.
  EXPECT_TRUE(ReadTorchScriptModel(File("hidden_tensor_out_of_bounds.pt")).ok());
  EXPECT_THAT(CheckError("hidden_tensor_out_of_bounds.pt"),
              AllOf(HasSubstr("a tensor of m/data.pkl"), HasSubstr("reaches element 8 of its storage m/data/1")));
}

TEST_F(HostileInputsTest, BigEndianAndNonFiniteModelsAreRefused) {
  ASSERT_TRUE(Write({"tensor_attacks"}));
  for (const std::string& error : {CheckError("big_endian.pt"), ReadError("big_endian.pt")}) {
    EXPECT_THAT(error, AllOf(HasSubstr(File("big_endian.pt")), HasSubstr("'big' byte order")));
  }
  EXPECT_THAT(CheckError("nan_weight.pt"),
              AllOf(HasSubstr(File("nan_weight.pt")), HasSubstr("parameter 'w' holds a value that is not finite"),
                    HasSubstr("nan at element 1")));
  EXPECT_THAT(ReadError("inf_weight.pt"), AllOf(HasSubstr("parameter 'w'"), HasSubstr("-inf at element 2")));
}

TEST_F(HostileInputsTest, StaleCrcsAndDuplicateEntriesAreRefused) {
  ASSERT_TRUE(Write({"archive_attacks"}));
  EXPECT_THAT(CheckError("stale_crc.pt"),
              AllOf(HasSubstr(File("stale_crc.pt")), HasSubstr("'m/data/0' fails its CRC-32 check")));
  EXPECT_THAT(ReadError("stale_crc.pt"), HasSubstr("'m/data/0' fails its CRC-32 check"));
  for (const std::string& error : {CheckError("duplicate_storage.pt"), ReadError("duplicate_storage.pt")}) {
    EXPECT_THAT(error, AllOf(HasSubstr(File("duplicate_storage.pt")), HasSubstr("holds the entry 'm/data/0' twice")));
  }
  // .npz: rows of a stored member read alone are CRC-checked through the whole member once.
  auto npz = NpzFile::Open(File("stale_crc.npz"));
  ASSERT_TRUE(npz.ok()) << npz.status();
  const uint32_t rows[] = {0};
  auto read = npz->ReadRows("x", rows);
  ASSERT_FALSE(read.ok());
  EXPECT_THAT(std::string(read.status().message()),
              AllOf(HasSubstr(File("stale_crc.npz")), HasSubstr("'x.npy' fails its CRC-32 check")));
  auto duplicate = NpzFile::Open(File("duplicate.npz"));
  ASSERT_FALSE(duplicate.ok());
  EXPECT_THAT(std::string(duplicate.status().message()), HasSubstr("holds the entry 'x.npy' twice"));
}

// --- .npy ------------------------------------------------------------------------------------------------

// A header of 65,000 nested parentheses: refused at depth 16 (the recursive parser overflowed the stack).
TEST_F(HostileInputsTest, DeeplyNestedNpyHeaderIsRefused) {
  ASSERT_TRUE(Write({"npy_attacks"}));
  auto npy = LoadNpy(File("nested.npy"));
  ASSERT_FALSE(npy.ok());
  EXPECT_THAT(std::string(npy.status().message()),
              AllOf(HasSubstr(File("nested.npy")), HasSubstr("tuples nested more than 16 deep")));
  auto npz = NpzFile::Open(File("nested.npz"));
  ASSERT_TRUE(npz.ok()) << npz.status();
  auto header = npz->Header("x");
  ASSERT_FALSE(header.ok());
  EXPECT_THAT(std::string(header.status().message()),
              AllOf(HasSubstr(File("nested.npz") + ":x"), HasSubstr("tuples nested more than 16 deep")));
}

// --- special files --------------------------------------------------------------------------------------

// A FIFO (would block forever), /dev/zero and a symlink to it (endless): refused at open, naming the file.
TEST_F(HostileInputsTest, SpecialFilesAreRefusedWithoutBlocking) {
  const std::string fifo = File("model_fifo.pt");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const std::string link = File("zero_link.npz");
  std::filesystem::create_symlink("/dev/zero", link);
  struct Case {
    std::string path;
    const char* type;
  } cases[] = {{fifo, "is a FIFO"}, {"/dev/zero", "is a character device"}, {link, "is a character device"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.path);
    std::vector<std::string> errors = {std::string(ReadTorchScriptModel(c.path).status().message()),
                                       std::string(CheckTorchScriptFile(c.path).message()),
                                       std::string(LoadNpy(c.path).status().message()),
                                       std::string(NpzFile::Open(c.path).status().message())};
    for (const std::string& error : errors) EXPECT_THAT(error, AllOf(HasSubstr(c.path), HasSubstr(c.type)));
  }
}

// --- real models still pass ------------------------------------------------------------------------------

// The project's test models, the bring-your-own-model examples and a model with tensor constants
// (constants.pkl's storages under constants/) pass the whole-archive check.
TEST_F(HostileInputsTest, RealModelsPassTheCheck) {
  ASSERT_TRUE(testing::ExportTestModels(dir_->path().string()));
  for (const char* model : testing::kModelNames) {
    EXPECT_TRUE(CheckTorchScriptFile(File(std::string(model) + ".pt")).ok()) << CheckError(std::string(model) + ".pt");
  }
  ASSERT_TRUE(testing::RunTorchScript(dir_->path().string(), "constants.py", R"PY(
import os, sys
import torch, torch.nn as nn
class WithConstants(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 2)
    def forward(self, x):
        return self.lin(x) * torch.tensor([0.5, 2.0]) + torch.ones(2)
torch.jit.trace(WithConstants(), torch.randn(3, 4)).save(os.path.join(sys.argv[1], "constants.pt"))
)PY"));
  EXPECT_TRUE(CheckTorchScriptFile(File("constants.pt")).ok()) << CheckError("constants.pt");
  const std::string examples = std::string(FL_FORMATS_TEST_SOURCE_DIR) + "/../../examples/bring-your-own-model";
  auto run =
      fl::testing::RunPythonFile(examples + "/export_models.py", {"--out", dir_->File("byom")}, dir_->File("byom.log"));
  ASSERT_TRUE(run.ok()) << run.status();
  size_t checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir_->File("byom"))) {
    if (entry.path().extension() != ".pt") continue;
    ++checked;
    EXPECT_TRUE(CheckTorchScriptFile(entry.path().string()).ok())
        << CheckTorchScriptFile(entry.path().string()).message();
  }
  EXPECT_GE(checked, 4u);
}

}  // namespace
}  // namespace fl::formats

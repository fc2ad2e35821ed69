// Damaged .npz files (written by numpy, then bytes flipped or cut at seeded random places) never crash the
// readers nor make them read out of bounds (run under the asan preset to see the latter): every call
// returns either the data or an error naming the file.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "fl/formats/npy.h"
#include "fl/testing/python.h"
#include "fl/testing/scratch_dir.h"

namespace fl::formats {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Everything a data loader does with an .npz; returns how many calls succeeded.
int Exercise(const std::string& path) {
  auto npz = NpzFile::Open(path);
  if (!npz.ok()) {
    EXPECT_NE(std::string(npz.status().message()).find(path), std::string::npos) << npz.status();
    return 0;
  }
  int ok = 1;
  const std::vector<uint32_t> rows = {0, 3, 1, 3};
  for (const std::string& name : npz->ArrayNames()) {
    auto header = npz->Header(name);
    if (!header.ok()) {
      EXPECT_NE(std::string(header.status().message()).find(path), std::string::npos) << header.status();
      continue;
    }
    ++ok;
    if (npz->ReadAll(name).ok()) ++ok;
    if (npz->ReadRows(name, rows).ok()) ++ok;
  }
  return ok;
}

TEST(CorruptNpzTest, FlippedAndTruncatedFilesGiveErrorsNotCrashes) {
  fl::testing::ScratchDir dir("corrupt_npz");
  const absl::Status numpy = fl::testing::RequirePythonModule("numpy", dir.File("require.log"));
  ASSERT_TRUE(numpy.ok()) << numpy.message();
  auto written = fl::testing::RunPython(R"PY(
import os, sys, numpy as np
d = sys.argv[1]
a = dict(x_train=np.arange(60, dtype=np.float32).reshape(6, 10), y_train=np.arange(6),
         x_test=np.ones((4, 10), np.uint8), y_test=np.arange(4, dtype=np.int32))
np.savez(os.path.join(d, 'stored.npz'), **a)
np.savez_compressed(os.path.join(d, 'compressed.npz'), **a)
)PY",
                                        {dir.path().string()}, dir.File("python.log"));
  ASSERT_TRUE(written.ok()) << written.status().message();
  std::mt19937_64 random(20240607);
  for (const char* name : {"stored.npz", "compressed.npz"}) {
    const std::string original = ReadFile(dir.File(name));
    ASSERT_EQ(Exercise(dir.File(name)), 13) << "the intact file reads completely";
    const std::string damaged = dir.File(std::string("damaged_") + name);
    for (int i = 0; i < 300; ++i) {
      std::string bytes = original;
      if (i % 3 == 0) {
        bytes.resize(random() % bytes.size());  // cut anywhere
      } else {
        for (int flips = 1 + static_cast<int>(random() % 4); flips > 0; --flips) {
          bytes[random() % bytes.size()] ^= static_cast<char>(1 + random() % 255);
        }
      }
      WriteFile(damaged, bytes);
      Exercise(damaged);
    }
  }
}

}  // namespace
}  // namespace fl::formats

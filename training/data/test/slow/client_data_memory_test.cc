// Memory: a client loading its 1/100 shard of a ~300 MB .npz must not hold the file. Labelled `slow`
// (numpy writes and compresses 300 MB); kept out of fl_add_module_tests' glob by living in test/slow/.
//
// Measured as the growth of this process's peak resident set (VmHWM) across LoadClientData, after the
// peak is reset through /proc/self/clear_refs (or, where that is refused, from the current peak). The file
// is read with pread, so its pages sit in the kernel's page cache, shared and not counted in our RSS.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "fl/training/data/client_data.h"
#include "fl/testing/python.h"
#include "fl/testing/scratch_dir.h"

namespace fl::training::data {
namespace {

// A field of /proc/self/status in KiB ("VmHWM", "VmRSS").
uint64_t StatusKiB(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1));
  }
  ADD_FAILURE() << "no " << field << " in /proc/self/status";
  return 0;
}

// The peak RSS now, after resetting it to the current RSS where the kernel allows (Linux >= 4.0).
uint64_t ResetPeakKiB() {
  std::ofstream("/proc/self/clear_refs") << "5";
  return StatusKiB("VmHWM");
}

// One client of 100 loads its shard of x_train written by numpy.<writer> ("savez" or "savez_compressed").
void ExpectShardNotFileInMemory(const std::string& writer) {
  fl::testing::ScratchDir dir("client_data_memory");
  const absl::Status numpy = fl::testing::RequirePythonModule("numpy", dir.File("require.log"));
  ASSERT_TRUE(numpy.ok()) << numpy.message();
  // 100,000 x 768 float32 = 307 MB of x_train (low-entropy values, so that compressing it is quick).
  auto written = fl::testing::RunPython(R"PY(
import sys, numpy as np
path, writer = sys.argv[1], sys.argv[2]
n, f = 100000, 768
x = (np.arange(n * f, dtype=np.int64) % 251).astype(np.float32).reshape(n, f)
y = (np.arange(n) % 10).astype(np.int64)
save = np.savez if writer == 'savez' else np.savez_compressed
save(path, x_train=x, y_train=y, x_test=x[:2000], y_test=y[:2000], client_id=np.arange(n) % 1000)
)PY",
                                        {dir.File("big.npz"), writer}, dir.File("python.log"));
  ASSERT_TRUE(written.ok()) << written.status().message();
  const uint64_t x_train_bytes = uint64_t{100000} * 768 * 4;

  DataOptions options;
  options.path = dir.File("big.npz");
  options.partition = "dirichlet:1.0";
  options.num_clients = 100;
  options.client_index = 42;
  const uint64_t before_kib = ResetPeakKiB();
  auto data = LoadClientData(options);
  const uint64_t after_kib = StatusKiB("VmHWM");
  ASSERT_TRUE(data.ok()) << data.status();
  const uint64_t growth = (after_kib - before_kib) * 1024;
  const uint64_t shard_bytes = data->train.x.size() + data->test.x.size();
  std::printf("[ memory   ] %s: x_train %.0f MB, this client's x %.2f MB, peak RSS grew by %.1f MB\n", writer.c_str(),
              static_cast<double>(x_train_bytes) / 1e6, static_cast<double>(shard_bytes) / 1e6,
              static_cast<double>(growth) / 1e6);
  EXPECT_GT(data->train.n, 0u);
  EXPECT_LT(data->train.n, 5000u);
  // Far less than the file: a quarter is the bound asked for (it holds the labels and client ids whole,
  // 1.6 MB, the shard, and at most a few MiB of read/inflate buffers).
  EXPECT_LT(growth, x_train_bytes / 4);
}

TEST(ClientDataMemoryTest, StoredNpzShardNotFileInMemory) { ExpectShardNotFileInMemory("savez"); }
TEST(ClientDataMemoryTest, CompressedNpzShardNotFileInMemory) { ExpectShardNotFileInMemory("savez_compressed"); }

}  // namespace
}  // namespace fl::training::data

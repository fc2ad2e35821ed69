// LoadClientData on real files: .npz datasets written by numpy inside the test (stored and compressed;
// classification, regression, next-token), every bad input with its message, the natural partition, the
// IID test split, plain text windows, and Fashion-MNIST through this path against the existing loader.
#include "fl/training/data/client_data.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "fl/core/str_cat.h"
#include "fl/training/data/fashion_mnist.h"
#include "fl/training/data/partition.h"
#include "fl/testing/python.h"
#include "fl/testing/scratch_dir.h"

namespace fl::training::data {
namespace {

using ::testing::HasSubstr;

std::vector<uint8_t> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void WriteFile(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

template <typename T>
std::vector<T> Values(const std::vector<uint8_t>& bytes) {
  std::vector<T> values(bytes.size() / sizeof(T));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(T));
  return values;
}

// The bytes of `rows` of an array whose rows are `row_bytes` long, from its whole raw dump.
std::vector<uint8_t> Gather(const std::vector<uint8_t>& all, const std::vector<uint32_t>& rows, size_t row_bytes) {
  std::vector<uint8_t> out;
  for (uint32_t row : rows) out.insert(out.end(), all.begin() + row * row_bytes, all.begin() + (row + 1) * row_bytes);
  return out;
}

std::string Message(const absl::Status& status) { return std::string(status.message()); }

class ClientDataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const absl::Status status = fl::testing::RequirePythonModule("numpy", dir_.File("require.log"));
    ASSERT_TRUE(status.ok()) << status.message();
  }
  // Runs a numpy script with `d` (the scratch directory) and `np` defined; `save(name, **arrays)` writes
  // name.npz with np.savez and name_c.npz with np.savez_compressed, and each array's raw bytes as
  // name.<array>.raw.
  void Python(const std::string& script) {
    auto result = fl::testing::RunPython(std::string(R"PY(
import os, sys, numpy as np
d = sys.argv[1]
def save(name, **arrays):
    np.savez(os.path.join(d, name + '.npz'), **arrays)
    np.savez_compressed(os.path.join(d, name + '_c.npz'), **arrays)
    for k, a in arrays.items():
        open(os.path.join(d, name + '.' + k + '.raw'), 'wb').write(np.ascontiguousarray(a).tobytes())
)PY") + script,
                                         {dir_.path().string()}, dir_.File("python.log"));
    ASSERT_TRUE(result.ok()) << result.status().message();
  }
  DataOptions Options(const std::string& file, Task task = Task::kClassification) {
    DataOptions o;
    o.path = dir_.File(file);
    o.task = task;
    return o;
  }
  // The error of loading `o` (the test fails when it loads).
  std::string ErrorOf(const DataOptions& o) {
    auto data = LoadClientData(o);
    EXPECT_FALSE(data.ok()) << o.path;
    return data.ok() ? "" : Message(data.status());
  }
  std::vector<uint8_t> Raw(const std::string& name) { return ReadFile(dir_.File(name + ".raw")); }

  fl::testing::ScratchDir dir_{"client_data_test"};
};

constexpr const char* kClassification = R"PY(
rng = np.random.default_rng(5)
x_train = rng.standard_normal((1000, 3, 4, 2)).astype(np.float32)
y_train = rng.integers(0, 10, 1000).astype(np.int64)
x_test = rng.standard_normal((300, 3, 4, 2)).astype(np.float32)
y_test = rng.integers(0, 10, 300).astype(np.int64)
client_id = rng.integers(100, 107, 1000)
save('f32', x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test, client_id=client_id)
save('u8', x_train=(x_train * 40 + 128).clip(0, 255).astype(np.uint8), y_train=y_train.astype(np.int32),
     x_test=(x_test * 40 + 128).clip(0, 255).astype(np.uint8), y_test=y_test.astype(np.uint8))
)PY";

TEST_F(ClientDataTest, ClassificationShardIsNumpysRows) {
  Python(kClassification);
  for (const char* file : {"f32", "f32_c", "u8", "u8_c"}) {
    const bool u8 = std::string(file).starts_with("u8");
    const std::string raw = u8 ? "u8" : "f32";
    std::set<uint32_t> all_train, all_test;
    uint64_t test_total = 0;
    for (uint32_t k = 0; k < 4; ++k) {
      DataOptions o = Options(std::string(file) + ".npz");
      o.partition = "dirichlet:0.5";
      o.num_clients = 4;
      o.client_index = k;
      o.partition_seed = 9;
      auto data = LoadClientData(o);
      ASSERT_TRUE(data.ok()) << file << ": " << data.status();
      const Examples& train = data->train;
      EXPECT_EQ(train.source, o.path + ":x_train");
      EXPECT_EQ(train.x_shape, (std::vector<int64_t>{3, 4, 2}));
      EXPECT_EQ(train.x_type, u8 ? ElementType::kUInt8 : ElementType::kFloat32);
      EXPECT_TRUE(train.y_shape.empty());
      EXPECT_EQ(train.y_type, ElementType::kInt64);
      ASSERT_EQ(train.n, train.rows.size());
      // The rows are the partitioner's, and the bytes numpy's.
      const std::vector<int64_t> y_all = Values<int64_t>(Raw("f32.y_train"));
      auto expected_rows = PartitionFor(k, PartitionSpec::Dirichlet(0.5), std::span<const int64_t>(y_all), 4, 9);
      ASSERT_TRUE(expected_rows.ok());
      EXPECT_EQ(train.rows, *expected_rows);
      const size_t row_bytes = 24 * (u8 ? 1 : 4);
      EXPECT_EQ(train.x, Gather(Raw(raw + ".x_train"), train.rows, row_bytes)) << file;
      std::vector<int64_t> labels;
      for (uint32_t row : train.rows) labels.push_back(y_all[row]);
      EXPECT_EQ(Values<int64_t>(train.y), labels) << file;
      EXPECT_EQ(data->test.x, Gather(Raw(raw + ".x_test"), data->test.rows, row_bytes)) << file;
      // The largest label over the whole file, whatever this client's shard.
      ASSERT_TRUE(data->train_labels.has_value());
      EXPECT_EQ(data->train_labels->max, *std::max_element(y_all.begin(), y_all.end()));
      EXPECT_EQ(y_all[data->train_labels->index], data->train_labels->max);
      EXPECT_EQ(data->train_labels->array, "y_train");
      all_train.insert(train.rows.begin(), train.rows.end());
      for (uint32_t row : data->test.rows) EXPECT_TRUE(all_test.insert(row).second) << "test row twice: " << row;
      test_total += data->test.n;
      EXPECT_THAT(data->description, HasSubstr("client " + std::to_string(k) + " of 4"));
    }
    // Every training row in some client, and the test shares are a partition of the whole test set.
    EXPECT_EQ(all_train.size(), 1000u);
    EXPECT_EQ(all_test.size(), 300u);
    EXPECT_EQ(test_total, 300u);
  }
}

TEST_F(ClientDataTest, DataFractionKeepsTheFirstOfTheShard) {
  Python(kClassification);
  DataOptions o = Options("f32.npz");
  o.num_clients = 3;
  o.client_index = 2;
  auto full = LoadClientData(o);
  ASSERT_TRUE(full.ok()) << full.status();
  o.data_fraction = 0.25;
  auto part = LoadClientData(o);
  ASSERT_TRUE(part.ok()) << part.status();
  const size_t keep = static_cast<size_t>(std::ceil(0.25 * static_cast<double>(full->train.n)));
  ASSERT_EQ(part->train.n, keep);
  EXPECT_EQ(part->train.rows, std::vector<uint32_t>(full->train.rows.begin(), full->train.rows.begin() + keep));
  EXPECT_EQ(part->test.n, full->test.n);
  o.data_fraction = 0;
  EXPECT_THAT(ErrorOf(o), HasSubstr("data fraction 0 is outside (0, 1]"));
}

TEST_F(ClientDataTest, NaturalPartitionByClientId) {
  Python(kClassification);
  const std::vector<int64_t> ids = Values<int64_t>(Raw("f32.client_id"));
  std::set<int64_t> distinct(ids.begin(), ids.end());
  ASSERT_EQ(distinct.size(), 7u);  // 100..106
  const std::vector<int64_t> sorted(distinct.begin(), distinct.end());
  for (const char* file : {"f32.npz", "f32_c.npz"}) {
    for (uint32_t k = 0; k < 3; ++k) {
      DataOptions o = Options(file);
      o.partition = "natural";
      o.num_clients = 3;
      o.client_index = k;
      auto data = LoadClientData(o);
      ASSERT_TRUE(data.ok()) << data.status();
      // Client k has the ids at positions k, k+3, k+6 of the sorted distinct ids, and all their rows.
      std::set<int64_t> mine;
      for (size_t p = k; p < sorted.size(); p += 3) mine.insert(sorted[p]);
      std::vector<uint32_t> expected;
      for (uint32_t i = 0; i < ids.size(); ++i) {
        if (mine.count(ids[i])) expected.push_back(i);
      }
      EXPECT_EQ(data->train.rows, expected) << "client " << k;
      EXPECT_EQ(data->train.x, Gather(Raw("f32.x_train"), expected, 96));
      // The test split is still the IID share.
      auto test_rows = PartitionIidFor(k, 300, 3, 0);
      ASSERT_TRUE(test_rows.ok());
      EXPECT_EQ(data->test.rows, *test_rows);
    }
  }
  DataOptions o = Options("f32.npz");
  o.partition = "natural";
  o.num_clients = 8;
  EXPECT_THAT(ErrorOf(o), HasSubstr("8 clients but the data have only 7 distinct client ids"));
  o = Options("u8.npz");
  o.partition = "natural";
  EXPECT_THAT(ErrorOf(o), HasSubstr("u8.npz has no client_id array"));
}

TEST_F(ClientDataTest, RegressionTargets) {
  Python(R"PY(
rng = np.random.default_rng(1)
save('r', x_train=rng.standard_normal((500, 6)).astype(np.float32),
     y_train=rng.standard_normal((500, 2)).astype(np.float32),
     x_test=rng.standard_normal((100, 6)).astype(np.float32), y_test=rng.standard_normal((100, 2)).astype(np.float32))
save('r1', x_train=rng.standard_normal((50, 6)).astype(np.float32), y_train=rng.standard_normal(50).astype(np.float32),
     x_test=rng.standard_normal((10, 6)).astype(np.float32), y_test=rng.standard_normal(10).astype(np.float32))
)PY");
  for (const char* file : {"r.npz", "r_c.npz"}) {
    DataOptions o = Options(file, Task::kRegression);
    o.num_clients = 5;
    o.client_index = 4;
    o.partition_seed = 3;
    auto data = LoadClientData(o);
    ASSERT_TRUE(data.ok()) << data.status();
    EXPECT_EQ(data->train.y_type, ElementType::kFloat32);
    EXPECT_EQ(data->train.y_shape, (std::vector<int64_t>{2}));
    auto rows = PartitionIidFor(4, 500, 5, 3);
    ASSERT_TRUE(rows.ok());
    EXPECT_EQ(data->train.rows, *rows);
    EXPECT_EQ(data->train.x, Gather(Raw("r.x_train"), *rows, 24));
    EXPECT_EQ(data->train.y, Gather(Raw("r.y_train"), *rows, 8));
    EXPECT_FALSE(data->train_labels.has_value());
    // Label partitions need labels.
    o.partition = "dirichlet:0.5";
    EXPECT_THAT(ErrorOf(o), HasSubstr("partition dirichlet:0.5 splits by class label, and regression data"));
  }
  auto scalar = LoadClientData(Options("r1.npz", Task::kRegression));
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_TRUE(scalar->train.y_shape.empty());
  EXPECT_EQ(scalar->train.y, Raw("r1.y_train"));  // one client: every row, in order
}

TEST_F(ClientDataTest, NextTokenFromNpz) {
  Python(R"PY(
rng = np.random.default_rng(2)
seq = rng.integers(0, 300, (200, 17))
save('t', x_train=seq[:, :-1].astype(np.int32), y_train=seq[:, 1:].astype(np.int64),
     x_test=seq[:40, :-1].astype(np.int32), y_test=seq[:40, 1:].astype(np.int64), client_id=np.arange(200) % 4)
)PY");
  DataOptions o = Options("t_c.npz", Task::kNextToken);
  o.num_clients = 2;
  o.client_index = 1;
  o.partition = "natural";
  auto data = LoadClientData(o);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->train.x_type, ElementType::kInt64);
  EXPECT_EQ(data->train.x_shape, (std::vector<int64_t>{16}));
  EXPECT_EQ(data->train.y_shape, (std::vector<int64_t>{16}));
  ASSERT_EQ(data->train.n, 100u);  // ids 1 and 3
  EXPECT_EQ(data->train.rows[0], 1u);
  const std::vector<int32_t> x_all = Values<int32_t>(Raw("t.x_train"));
  const std::vector<int64_t> x = Values<int64_t>(data->train.x);
  for (size_t i = 0; i < data->train.n; ++i) {
    for (size_t t = 0; t < 16; ++t) ASSERT_EQ(x[i * 16 + t], x_all[data->train.rows[i] * 16 + t]);
  }
  EXPECT_EQ(data->train.y, Gather(Raw("t.y_train"), data->train.rows, 16 * 8));
  ASSERT_TRUE(data->train_labels.has_value());
  EXPECT_LE(data->train_labels->max, 299);
  EXPECT_GE(data->train_labels->max, 290);
  const absl::Status range = CheckLabelRange(*data, 256);
  ASSERT_FALSE(range.ok());
  EXPECT_THAT(Message(range), HasSubstr("t_c.npz: "));
  EXPECT_THAT(Message(range), HasSubstr("is outside [0, 256) (the model outputs 256 token ids)"));
  EXPECT_TRUE(CheckLabelRange(*data, 300).ok());
}

TEST_F(ClientDataTest, BadInputsNameTheFileAndArray) {
  Python(R"PY(
rng = np.random.default_rng(4)
x = rng.standard_normal((20, 5)).astype(np.float32)
y = rng.integers(0, 3, 20)
good = dict(x_train=x, y_train=y, x_test=x[:6], y_test=y[:6])
def variant(name, **changes):
    arrays = dict(good)
    arrays.update(changes)
    np.savez(os.path.join(d, name + '.npz'), **{k: v for k, v in arrays.items() if v is not None})
variant('missing', y_test=None)
variant('lengths', y_train=y[:19])
variant('x_f64', x_train=x.astype(np.float64))
variant('x_i64', x_train=np.ones((20, 5), np.int64))
variant('y_float', y_train=y.astype(np.float32))
variant('y_2d', y_train=y.reshape(20, 1))
variant('negative', y_train=np.where(np.arange(20) == 13, -1, y))
xn = x.copy(); xn[7, 3] = np.nan
variant('nan', x_train=xn)
xi = x.copy(); xi[2, 1] = np.inf
variant('inf_test', x_test=xi[:6])
variant('empty', x_test=np.zeros((0, 5), np.float32), y_test=np.zeros(0, np.int64))
variant('ids', client_id=np.arange(19))
variant('ids_float', client_id=np.arange(20.0))
variant('big_endian', x_train=x.astype('>f4'))
variant('fortran', x_train=np.asfortranarray(x))
variant('test_shape', x_test=np.zeros((6, 4), np.float32))
variant('labels', y_test=np.array([0, 1, 2, 12, 1, 0]))
np.savez(os.path.join(d, 'reg.npz'), x_train=x, y_train=x[:, 0].astype(np.float64), x_test=x[:6], y_test=x[:6, 0])
yr = x[:, 0].copy(); yr[4] = np.inf
np.savez(os.path.join(d, 'reg_inf.npz'), x_train=x, y_train=yr, x_test=x[:6], y_test=x[:6, 0])
np.save(os.path.join(d, 'single.npy'), x)
open(os.path.join(d, 'text.npz'), 'w').write('not a zip')
)PY");
  auto error = [&](const std::string& file, Task task = Task::kClassification) {
    return ErrorOf(Options(file + (file.find('.') == std::string::npos ? ".npz" : ""), task));
  };
  const std::string p = dir_.path().string() + "/";
  EXPECT_THAT(error("missing"), HasSubstr(p + "missing.npz has no array 'y_test' (it has: x_train, y_train, x_test)"));
  EXPECT_THAT(error("lengths"), HasSubstr(p + "lengths.npz: x_train has 20 examples but y_train has 19"));
  EXPECT_THAT(error("x_f64"), HasSubstr(p + "x_f64.npz:x_train has dtype float64"));
  EXPECT_THAT(error("x_f64"), HasSubstr("x_train.astype(np.float32)"));
  EXPECT_THAT(error("x_i64"),
              HasSubstr("x_i64.npz:x_train has dtype int64; classification features must be float32 or uint8"));
  EXPECT_THAT(error("y_float"), HasSubstr(p + "y_float.npz:y_train has dtype float32"));
  EXPECT_THAT(error("y_float"), HasSubstr("y_train.astype(np.int64)"));
  EXPECT_THAT(error("y_2d"), HasSubstr("y_2d.npz:y_train has shape (20, 1)"));
  EXPECT_THAT(error("negative"), HasSubstr(p + "negative.npz:y_train[13] = -1 is negative"));
  EXPECT_THAT(error("nan"), HasSubstr(p + "nan.npz:x_train[7][3] is NaN"));
  EXPECT_THAT(error("inf_test"), HasSubstr(p + "inf_test.npz:x_test[2][1] is infinite"));
  EXPECT_THAT(error("empty"), HasSubstr(p + "empty.npz:x_test is empty (shape (0, 5))"));
  EXPECT_THAT(error("ids"), HasSubstr(p + "ids.npz: client_id has 19 entries but x_train has 20 examples"));
  EXPECT_THAT(error("ids_float"), HasSubstr(p + "ids_float.npz:client_id is float64 (20,)"));
  EXPECT_THAT(error("big_endian"), HasSubstr(p + "big_endian.npz:x_train: dtype '>f4' is big-endian"));
  EXPECT_THAT(error("fortran"), HasSubstr(p + "fortran.npz:x_train: the array (20, 5) is stored in Fortran"));
  EXPECT_THAT(error("fortran"), HasSubstr("np.ascontiguousarray(a)"));
  EXPECT_THAT(error("test_shape"), HasSubstr("x_train's examples are [5] but x_test's are [4]"));
  EXPECT_THAT(error("reg", Task::kRegression), HasSubstr(p + "reg.npz:y_train has dtype float64"));
  EXPECT_THAT(error("reg", Task::kRegression), HasSubstr("y_train.astype(np.float32)"));
  EXPECT_THAT(error("reg_inf", Task::kRegression), HasSubstr(p + "reg_inf.npz:y_train[4] is infinite"));
  EXPECT_THAT(error("single.npy"), HasSubstr(p + "single.npy is a single array"));
  EXPECT_THAT(error("text.npz"), HasSubstr(p + "text.npz is not a ZIP archive"));
  EXPECT_THAT(error("nothing.npz"), HasSubstr("nothing.npz' does not exist"));

  // Labels beyond the model's classes: found over the whole test set.
  auto labels = LoadClientData(Options("labels.npz"));
  ASSERT_TRUE(labels.ok()) << labels.status();
  EXPECT_TRUE(CheckLabelRange(*labels, 13).ok());
  const absl::Status range = CheckLabelRange(*labels, 10);
  EXPECT_EQ(range.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(range),
              HasSubstr(p + "labels.npz: y_test[3] = 12 is outside [0, 10) (the model outputs 10 classes)"));
}

// NaN in rows another client loads is that client's problem: only loaded rows are checked.
TEST_F(ClientDataTest, NonFiniteValuesOnlyMatterInLoadedRows) {
  Python(R"PY(
x = np.ones((10, 3), np.float32); x[7, 2] = np.nan
save('n', x_train=x, y_train=np.zeros(10, np.int64), x_test=np.ones((4, 3), np.float32), y_test=np.zeros(4, np.int64),
     client_id=(np.arange(10) == 7).astype(np.int64))
)PY");
  DataOptions o = Options("n_c.npz");
  o.partition = "natural";
  o.num_clients = 2;
  o.client_index = 0;
  EXPECT_TRUE(LoadClientData(o).ok());
  o.client_index = 1;
  EXPECT_THAT(ErrorOf(o), HasSubstr("n_c.npz:x_train[7][2] is NaN"));
}

TEST_F(ClientDataTest, TextCorpusWindows) {
  std::string text;
  for (int i = 0; i < 300; ++i) text += "line " + std::to_string(i) + " of some text\n";
  WriteFile(dir_.File("corpus.txt"), text);
  DataOptions o = Options("corpus.txt", Task::kNextToken);
  o.seq_len = 16;
  o.num_clients = 3;
  o.client_index = 1;
  o.partition_seed = 4;
  auto data = LoadClientData(o);
  ASSERT_TRUE(data.ok()) << data.status();
  const size_t test_bytes = text.size() / 10;
  const std::string train_text = text.substr(0, text.size() - test_bytes);
  const std::string test_text = text.substr(text.size() - test_bytes);
  const uint64_t windows = (train_text.size() - 1) / 16;
  auto rows = PartitionIidFor(1, windows, 3, 4);
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(data->train.rows, *rows);
  EXPECT_EQ(data->train.x_shape, (std::vector<int64_t>{16}));
  EXPECT_EQ(data->train.x_type, ElementType::kInt64);
  const std::vector<int64_t> x = Values<int64_t>(data->train.x);
  const std::vector<int64_t> y = Values<int64_t>(data->train.y);
  for (size_t i = 0; i < data->train.n; ++i) {
    const size_t start = data->train.rows[i] * 16;
    for (size_t t = 0; t < 16; ++t) {
      ASSERT_EQ(x[i * 16 + t], static_cast<uint8_t>(train_text[start + t]));
      ASSERT_EQ(y[i * 16 + t], static_cast<uint8_t>(train_text[start + t + 1]));
    }
  }
  // Test windows come from the last 10% only.
  const std::vector<int64_t> tx = Values<int64_t>(data->test.x);
  ASSERT_GT(data->test.n, 0u);
  const size_t start = data->test.rows[0] * 16;
  for (size_t t = 0; t < 16; ++t) EXPECT_EQ(tx[t], static_cast<uint8_t>(test_text[start + t]));
  EXPECT_TRUE(CheckLabelRange(*data, kTextVocabulary).ok());
  // Too short.
  o.seq_len = 1000;
  EXPECT_THAT(ErrorOf(o), HasSubstr("is too short for seq_len 1000 and 3 clients"));
  o.seq_len = 16;
  o.partition = "shards:2";
  EXPECT_THAT(ErrorOf(o), HasSubstr("partition shards:2 is not available for a plain text corpus"));
}

TEST_F(ClientDataTest, TextDirectoryJoinsFilesWithoutDotsInByteOrder) {
  const std::filesystem::path corpus = dir_.path() / "corpus";
  std::filesystem::create_directory(corpus);
  std::string b(500, 'b'), a(400, 'a'), z(300, 'z');
  WriteFile((corpus / "b").string(), b);
  WriteFile((corpus / "a").string(), a);
  WriteFile((corpus / "Z").string(), z);  // 'Z' < 'a' in byte order
  WriteFile((corpus / "a.dat").string(), std::string(1000, '!'));
  WriteFile((corpus / "b.u8").string(), std::string(1000, '?'));
  std::filesystem::create_directory(corpus / "sub");
  DataOptions o = Options("corpus", Task::kNextToken);
  o.seq_len = 8;
  auto data = LoadClientData(o);
  ASSERT_TRUE(data.ok()) << data.status();
  const std::string joined = z + "\n" + a + "\n" + b;
  const std::string train_text = joined.substr(0, joined.size() - joined.size() / 10);
  std::string rebuilt;
  const std::vector<int64_t> x = Values<int64_t>(data->train.x);
  ASSERT_EQ(data->train.n, (train_text.size() - 1) / 8);
  for (size_t i = 0; i < data->train.n; ++i) {  // one client: every window, in order
    for (size_t t = 0; t < 8; ++t) rebuilt.push_back(static_cast<char>(x[i * 8 + t]));
  }
  EXPECT_EQ(rebuilt, train_text.substr(0, rebuilt.size()));
  std::filesystem::create_directory(dir_.path() / "empty");
  EXPECT_THAT(ErrorOf(Options("empty", Task::kNextToken)), HasSubstr("has no text files"));
}

// Issue 27: a user's data file is opened as a regular file of a stated size before a byte is read. Before the
// fix, --data /dev/zero with the next-token task read until the memory was gone and a FIFO blocked forever.
TEST_F(ClientDataTest, FifosDevicesAndOversizedTextsAreRefusedBeforeReading) {
  const std::string zero = ErrorOf(DataOptions{.path = "/dev/zero", .task = Task::kNextToken});
  EXPECT_THAT(zero, HasSubstr("data file /dev/zero: is a character device, not a regular file"));
  const std::string fifo = dir_.File("corpus-fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THAT(ErrorOf(DataOptions{.path = fifo, .task = Task::kNextToken}),
              HasSubstr(fifo + ": is a FIFO, not a regular file"));
  // A text of 300 MB (sparse: no disk written) is refused by its size, before it is read.
  const std::string big = dir_.File("big.txt");
  { std::ofstream create(big); }
  std::filesystem::resize_file(big, 300'000'000);
  const std::string over = ErrorOf(DataOptions{.path = big, .task = Task::kNextToken});
  EXPECT_THAT(over, HasSubstr(fl::StrCat("text file ", big, ": 300000000 bytes, over the limit of 268435456")));
  EXPECT_THAT(over, HasSubstr(".npz"));
  // In a folder, the limit is the whole corpus's: a small text, then one that alone fits but not with it.
  std::filesystem::create_directories(dir_.File("two"));
  std::ofstream(dir_.File("two/a")) << std::string(100, 'a');
  { std::ofstream create(dir_.File("two/b")); }
  std::filesystem::resize_file(dir_.File("two/b"), 268'435'400);
  EXPECT_THAT(ErrorOf(DataOptions{.path = dir_.File("two"), .task = Task::kNextToken}),
              HasSubstr(fl::StrCat("text file ", dir_.File("two/b"), ": 268435400 bytes, over the limit")));
}

TEST_F(ClientDataTest, FortunesCorpus) {
  DataOptions o;
  o.path = "/usr/share/games/fortunes";
  o.task = Task::kNextToken;
  o.num_clients = 4;
  o.client_index = 2;
  auto data = LoadClientData(o);
  ASSERT_TRUE(data.ok()) << data.status() << " (the fortunes-min package: run deploy/install-deps.sh)";
  EXPECT_GT(data->train.n, 100u);
  EXPECT_GT(data->test.n, 10u);
  EXPECT_TRUE(CheckLabelRange(*data, 256).ok());
}

TEST_F(ClientDataTest, FashionMnistDirectoryEqualsTheIdxLoader) {
  const std::string dir(kDefaultFashionMnistDir);
  auto train = LoadFashionMnist(dir, Split::kTrain);
  ASSERT_TRUE(train.ok()) << train.status();
  auto test = LoadFashionMnist(dir, Split::kTest);
  ASSERT_TRUE(test.ok()) << test.status();
  DataOptions o;
  o.path = dir;
  o.partition = "dirichlet:0.5";
  o.num_clients = 10;
  o.client_index = 3;
  o.partition_seed = 42;
  auto data = LoadClientData(o);
  ASSERT_TRUE(data.ok()) << data.status();
  auto rows = PartitionFor(3, PartitionSpec::Dirichlet(0.5), train->labels, 10, 42);
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(data->train.rows, *rows);
  EXPECT_EQ(data->train.x_type, ElementType::kUInt8);
  EXPECT_EQ(data->train.x_shape, (std::vector<int64_t>{1, 28, 28}));
  EXPECT_EQ(data->train.x, Gather(train->pixels, *rows, 784));
  std::vector<int64_t> labels;
  for (uint32_t row : *rows) labels.push_back(train->labels[row]);
  EXPECT_EQ(Values<int64_t>(data->train.y), labels);
  auto test_rows = PartitionFor(3, PartitionSpec::Iid(), test->labels, 10, 42);
  ASSERT_TRUE(test_rows.ok());
  EXPECT_EQ(data->test.x, Gather(test->pixels, *test_rows, 784));
  EXPECT_EQ(data->test.rows, *test_rows);
  std::vector<int64_t> test_labels;
  for (uint32_t row : *test_rows) test_labels.push_back(test->labels[row]);
  EXPECT_EQ(Values<int64_t>(data->test.y), test_labels);
  EXPECT_THAT(data->description, HasSubstr(": 2801 of 60000 train examples, 1000 of 10000 test"));
  EXPECT_EQ(data->train_labels->max, 9);
  EXPECT_TRUE(CheckLabelRange(*data, 10).ok());
  EXPECT_THAT(Message(CheckLabelRange(*data, 5)), HasSubstr("is outside [0, 5) (the model outputs 5 classes)"));
  o.task = Task::kRegression;
  EXPECT_THAT(ErrorOf(o), HasSubstr("its task is classification"));
  o.task = Task::kClassification;
  o.partition = "natural";
  EXPECT_THAT(ErrorOf(o), HasSubstr("client_id"));
}

TEST(TaskTest, NamesRoundTrip) {
  for (Task task : {Task::kClassification, Task::kRegression, Task::kNextToken}) {
    auto parsed = ParseTask(TaskName(task));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, task);
  }
  EXPECT_EQ(TaskName(Task::kNextToken), "next-token");
  EXPECT_FALSE(ParseTask("segmentation").ok());
  EXPECT_EQ(ElementSize(ElementType::kFloat32), 4u);
  EXPECT_EQ(ElementTypeName(ElementType::kInt64), "int64");
}

}  // namespace
}  // namespace fl::training::data

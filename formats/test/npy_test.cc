// .npy headers and .npz arrays written by the real numpy (Debian's /usr/bin/python3 with python3-numpy):
// every accepted dtype, the refused ones with the fix in the message, header versions 1.0/2.0/3.0, and
// NpzFile::ReadRows against numpy's own fancy indexing for stored (np.savez) and deflated
// (np.savez_compressed) members.
#include "fl/formats/npy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "fl/testing/python.h"
#include "fl/testing/scratch_dir.h"

namespace fl::formats {
namespace {

using ::testing::HasSubstr;

std::vector<uint8_t> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

class NpyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const absl::Status status = fl::testing::RequirePythonModule("numpy", dir_.File("require.log"));
    ASSERT_TRUE(status.ok()) << status.message();
  }
  // Runs a numpy script with argv[1] = the scratch directory (`d` and `np` are predefined).
  void Python(const std::string& script) {
    auto result = fl::testing::RunPython("import os, sys, numpy as np\nd = sys.argv[1]\n" + script,
                                         {dir_.path().string()}, dir_.File("python.log"));
    ASSERT_TRUE(result.ok()) << result.status().message();
  }
  fl::testing::ScratchDir dir_{"npy_test"};
};

TEST_F(NpyTest, EveryAcceptedDtype) {
  Python(R"PY(
rng = np.random.default_rng(3)
for name in ['bool', 'int8', 'uint8', 'int16', 'uint16', 'int32', 'uint32', 'int64', 'uint64',
             'float16', 'float32', 'float64']:
    a = (rng.standard_normal((3, 4, 5)) * 50).astype(name)
    np.save(os.path.join(d, name + '.npy'), a)
    open(os.path.join(d, name + '.raw'), 'wb').write(a.tobytes())
)PY");
  const std::vector<std::pair<std::string, DType>> cases = {
      {"bool", DType::kBool},       {"int8", DType::kInt8},       {"uint8", DType::kUInt8},
      {"int16", DType::kInt16},     {"uint16", DType::kUInt16},   {"int32", DType::kInt32},
      {"uint32", DType::kUInt32},   {"int64", DType::kInt64},     {"uint64", DType::kUInt64},
      {"float16", DType::kFloat16}, {"float32", DType::kFloat32}, {"float64", DType::kFloat64}};
  for (const auto& [name, dtype] : cases) {
    auto array = LoadNpy(dir_.File(name + ".npy"));
    ASSERT_TRUE(array.ok()) << name << ": " << array.status();
    EXPECT_EQ(array->header.dtype, dtype) << name;
    EXPECT_EQ(DTypeName(dtype), name);
    EXPECT_EQ(array->header.descr, DTypeDescr(dtype)) << name;
    EXPECT_EQ(array->header.shape, (std::vector<uint64_t>{3, 4, 5}));
    EXPECT_EQ(array->header.ShapeString(), "(3, 4, 5)");
    EXPECT_EQ(array->header.row_bytes(), 20 * DTypeSize(dtype));
    EXPECT_FALSE(array->header.fortran_order);
    EXPECT_EQ(array->data, ReadFile(dir_.File(name + ".raw"))) << name;
  }
}

TEST_F(NpyTest, HeaderVersions) {
  Python(R"PY(
a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
for v in [(1, 0), (2, 0), (3, 0)]:
    with open(os.path.join(d, 'v%d.npy' % v[0]), 'wb') as f:
        np.lib.format.write_array(f, a, version=v)
)PY");
  for (int version : {1, 2, 3}) {
    // (Built with append: GCC 12's -Wrestrict misfires on "literal" + std::string&&.)
    std::string file = "v";
    file.append(std::to_string(version)).append(".npy");
    auto array = LoadNpy(dir_.File(file));
    ASSERT_TRUE(array.ok()) << array.status();
    EXPECT_EQ(array->header.major_version, version);
    EXPECT_EQ(array->header.data_offset % 64, 0u);  // numpy aligns the data to 64 bytes
    ASSERT_EQ(array->data.size(), 24u * 4);
    float last = 0;
    std::memcpy(&last, array->data.data() + 23 * 4, 4);
    EXPECT_EQ(last, 23.0f);
  }
}

TEST_F(NpyTest, ScalarsAndEmptyShapes) {
  Python(R"PY(
np.save(os.path.join(d, 'scalar.npy'), np.float64(2.5))
np.save(os.path.join(d, 'empty.npy'), np.zeros((0, 7), np.float32))
np.save(os.path.join(d, 'vector.npy'), np.arange(5, dtype=np.int64))
)PY");
  auto scalar = LoadNpy(dir_.File("scalar.npy"));
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_TRUE(scalar->header.shape.empty());
  EXPECT_EQ(scalar->header.ShapeString(), "()");
  EXPECT_EQ(scalar->header.num_elements(), 1u);
  auto empty = LoadNpy(dir_.File("empty.npy"));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->header.shape, (std::vector<uint64_t>{0, 7}));
  EXPECT_TRUE(empty->data.empty());
  auto vector = LoadNpy(dir_.File("vector.npy"));
  ASSERT_TRUE(vector.ok()) << vector.status();
  EXPECT_EQ(vector->header.ShapeString(), "(5,)");
  EXPECT_EQ(vector->header.row_bytes(), 8u);
}

TEST_F(NpyTest, RefusedArraysSayHowToFixThem) {
  Python(R"PY(
np.save(os.path.join(d, 'big.npy'), np.arange(6, dtype='>f4').reshape(2, 3))
np.save(os.path.join(d, 'fortran.npy'), np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)))
np.save(os.path.join(d, 'object.npy'), np.array([{'a': 1}, None], dtype=object), allow_pickle=True)
np.save(os.path.join(d, 'strings.npy'), np.array(['cat', 'dog']))
np.save(os.path.join(d, 'complex.npy'), np.zeros(3, np.complex64))
np.save(os.path.join(d, 'record.npy'), np.zeros(3, dtype=[('x', '<f4'), ('y', '<i8')]))
)PY");
  struct Case {
    const char* file;
    std::vector<const char*> message;
  };
  const std::vector<Case> cases = {
      {"big.npy", {"'>f4' is big-endian", "a.astype('<f4')"}},
      {"fortran.npy", {"Fortran (column-major) order", "np.ascontiguousarray(a)"}},
      {"object.npy", {"'|O' is an object array", "dtype=np.float32"}},
      {"strings.npy", {"'<U3' is not supported", "a.astype(np.float32)"}},
      {"complex.npy", {"'<c8' is not supported"}},
      {"record.npy", {"structured (record) dtype", "each field as its own array"}},
  };
  for (const Case& c : cases) {
    auto array = LoadNpy(dir_.File(c.file));
    ASSERT_FALSE(array.ok()) << c.file;
    EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(array.status().message()), HasSubstr(dir_.File(c.file)));
    for (const char* part : c.message) EXPECT_THAT(std::string(array.status().message()), HasSubstr(part)) << c.file;
  }
}

// Headers as old numpy versions (Python 2) and hand-written tools produce them.
TEST(NpyHeaderTest, ParsesDictVariants) {
  auto make = [](const std::string& dict) {
    std::vector<uint8_t> bytes(kNpyMagic.begin(), kNpyMagic.end());
    const uint16_t length = static_cast<uint16_t>(dict.size());
    for (uint8_t b : {uint8_t{1}, uint8_t{0}, static_cast<uint8_t>(length & 0xFF), static_cast<uint8_t>(length >> 8)}) {
      bytes.push_back(b);
    }
    bytes.insert(bytes.end(), dict.begin(), dict.end());
    return bytes;
  };
  const std::string py2_dict = "{'descr': '<i8', 'fortran_order': False, 'shape': (3L, 4L), }     \n";
  auto py2 = ParseNpyHeader(make(py2_dict), "py2");
  ASSERT_TRUE(py2.ok()) << py2.status();
  EXPECT_EQ(py2->shape, (std::vector<uint64_t>{3, 4}));
  EXPECT_EQ(py2->data_offset, 10u + py2_dict.size());
  auto reordered = ParseNpyHeader(make("{\"shape\": (7,), \"fortran_order\": True, \"descr\": \"|u1\"}\n"), "x");
  ASSERT_TRUE(reordered.ok()) << reordered.status();  // Fortran order of a 1-D array is C order
  EXPECT_EQ(reordered->dtype, DType::kUInt8);
  auto garbage = ParseNpyHeader(make("{'descr': '<f4', 'shape': (3, }"), "data.npz:x_train");
  ASSERT_FALSE(garbage.ok());
  EXPECT_THAT(std::string(garbage.status().message()), HasSubstr("data.npz:x_train"));
  auto not_npy = ParseNpyHeader(std::vector<uint8_t>(20, 'a'), "data.npz:y_train");
  ASSERT_FALSE(not_npy.ok());
  EXPECT_THAT(std::string(not_npy.status().message()), HasSubstr("data.npz:y_train is not a NumPy .npy array"));
}

constexpr const char* kWriteNpz = R"PY(
rng = np.random.default_rng(11)
x = rng.standard_normal((20000, 7, 11)).astype(np.float32)  # 6 MB: several inflate chunks
y = rng.integers(0, 10, size=20000).astype(np.int64)
u = rng.integers(0, 255, size=(20000, 28, 28), dtype=np.uint8)
np.savez(os.path.join(d, 'stored.npz'), x=x, y=y, u=u)
np.savez_compressed(os.path.join(d, 'compressed.npz'), x=x, y=y, u=u)
rows = np.concatenate([rng.choice(20000, 300, replace=False), [0, 1, 2, 3, 19999, 5, 5, 0, 19998, 19999]])
rows.astype('<u4').tofile(os.path.join(d, 'rows.bin'))
for name, a in [('x', x), ('y', y), ('u', u)]:
    open(os.path.join(d, name + '.all'), 'wb').write(a.tobytes())
    open(os.path.join(d, name + '.rows'), 'wb').write(a[rows].tobytes())
)PY";

TEST_F(NpyTest, NpzReadRowsEqualsNumpyIndexing) {
  Python(kWriteNpz);
  const std::vector<uint8_t> row_bytes = ReadFile(dir_.File("rows.bin"));
  std::vector<uint32_t> rows(row_bytes.size() / 4);
  std::memcpy(rows.data(), row_bytes.data(), row_bytes.size());
  ASSERT_EQ(rows.size(), 310u);
  for (const char* file : {"stored.npz", "compressed.npz"}) {
    auto npz = NpzFile::Open(dir_.File(file));
    ASSERT_TRUE(npz.ok()) << npz.status();
    EXPECT_EQ(npz->ArrayNames(), (std::vector<std::string>{"x", "y", "u"}));
    EXPECT_TRUE(npz->Has("x"));
    EXPECT_FALSE(npz->Has("x_train"));
    auto header = npz->Header("x");
    ASSERT_TRUE(header.ok()) << header.status();
    EXPECT_EQ(header->dtype, DType::kFloat32);
    EXPECT_EQ(header->shape, (std::vector<uint64_t>{20000, 7, 11}));
    const bool stored = std::string(file) == "stored.npz";
    EXPECT_EQ(npz->archive().Find("x.npy")->method, stored ? kZipMethodStored : kZipMethodDeflate);
    for (const char* name : {"x", "y", "u"}) {
      auto selected = npz->ReadRows(name, rows);
      ASSERT_TRUE(selected.ok()) << file << " " << name << ": " << selected.status();
      EXPECT_EQ(*selected, ReadFile(dir_.File(std::string(name) + ".rows"))) << file << " " << name;
      auto all = npz->ReadAll(name);
      ASSERT_TRUE(all.ok()) << all.status();
      EXPECT_EQ(*all, ReadFile(dir_.File(std::string(name) + ".all"))) << file << " " << name;
    }
    // No rows: nothing read, an empty result.
    auto none = npz->ReadRows("x", {});
    ASSERT_TRUE(none.ok());
    EXPECT_TRUE(none->empty());
    // A row past the end names the array and its length.
    const std::vector<uint32_t> past = {3, 20000};
    auto out_of_range = npz->ReadRows("x", past);
    ASSERT_FALSE(out_of_range.ok());
    EXPECT_THAT(std::string(out_of_range.status().message()),
                HasSubstr(dir_.File(file) + ":x: row 20000 is outside [0, 20000)"));
    // A missing array lists the ones present.
    auto missing = npz->Header("x_train");
    ASSERT_FALSE(missing.ok());
    EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
    EXPECT_THAT(std::string(missing.status().message()), HasSubstr("has no array 'x_train' (it has: x, y, u)"));
  }
}

TEST_F(NpyTest, NpzMemberErrorsNameTheArray) {
  Python(R"PY(
np.savez(os.path.join(d, 'a.npz'), good=np.zeros(3, np.float32), big=np.zeros((2, 2), '>f8'),
         scalar=np.float32(1))
)PY");
  auto npz = NpzFile::Open(dir_.File("a.npz"));
  ASSERT_TRUE(npz.ok()) << npz.status();
  auto big = npz->ReadRows("big", std::vector<uint32_t>{0});
  ASSERT_FALSE(big.ok());
  EXPECT_THAT(std::string(big.status().message()), HasSubstr(dir_.File("a.npz") + ":big: dtype '>f8' is big-endian"));
  auto scalar = npz->ReadRows("scalar", std::vector<uint32_t>{0});
  ASSERT_FALSE(scalar.ok());
  EXPECT_THAT(std::string(scalar.status().message()), HasSubstr(":scalar is a scalar"));
  EXPECT_TRUE(npz->ReadAll("good").ok());
}

}  // namespace
}  // namespace fl::formats

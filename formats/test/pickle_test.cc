// The pickle interpreter: hand-written streams for each opcode family and each refusal, the data.pkl of real
// TorchScript files exported by python3-torch, and every truncation and many mutations of those (errors, never
// crashes).
#include "fl/formats/pickle.h"

#include <random>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fl/testing/scratch_dir.h"
#include "torchscript_test_models.h"

namespace fl::formats {
namespace {

using ::testing::HasSubstr;

std::span<const uint8_t> Bytes(const std::string& s) { return {reinterpret_cast<const uint8_t*>(s.data()), s.size()}; }

absl::StatusOr<PickleDocument> Parse(const std::string& s, const PickleLimits& limits = {}) {
  return ParsePickle(Bytes(s), "test.pkl", limits);
}

std::string Message(const absl::StatusOr<PickleDocument>& r) {
  return r.ok() ? std::string("(ok)") : std::string(r.status().message());
}

// A string literal with embedded NULs, whole.
template <size_t N>
std::string B(const char (&s)[N]) {
  return std::string(s, N - 1);
}

// BINUNICODE of `s`.
std::string U(const std::string& s) {
  std::string out = "X";
  const uint32_t n = static_cast<uint32_t>(s.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return out + s;
}

TEST(PickleTest, Scalars) {
  std::string p = "\x80\x02(";
  p += B("K\x05");
  p += "M\x34\x12";
  p += "J\xfe\xff\xff\xff";                            // -2
  p += B("\x8a\x08\xfe\xff\xff\xff\xff\xff\xff\xff");  // LONG1 -2
  p += B("\x8a\x02\x00\x80");                          // LONG1 -32768
  p += B("\x8a\x00");                                  // LONG1 0
  p += B("G\x3f\xf8\x00\x00\x00\x00\x00\x00");         // 1.5, big-endian
  p += "N\x88\x89";
  p += U("abc");
  p += "U\x02hi";
  p += "t.";
  auto doc = Parse(p);
  ASSERT_TRUE(doc.ok()) << Message(doc);
  const PickleNode& root = doc->at(doc->root());
  ASSERT_EQ(root.kind, PickleKind::kTuple);
  ASSERT_EQ(doc->items(doc->root()).size(), 12u);
  const std::vector<int64_t> ints = {5, 0x1234, -2, -2, -32768, 0};
  for (size_t i = 0; i < ints.size(); ++i) {
    EXPECT_EQ(doc->at(doc->items(doc->root())[i]).kind, PickleKind::kInt);
    EXPECT_EQ(doc->at(doc->items(doc->root())[i]).integer, ints[i]) << i;
  }
  EXPECT_EQ(doc->at(doc->items(doc->root())[6]).real, 1.5);
  EXPECT_EQ(doc->at(doc->items(doc->root())[7]).kind, PickleKind::kNone);
  EXPECT_TRUE(doc->at(doc->items(doc->root())[8]).boolean);
  EXPECT_FALSE(doc->at(doc->items(doc->root())[9]).boolean);
  EXPECT_EQ(doc->text(doc->items(doc->root())[10]), "abc");
  EXPECT_EQ(doc->text(doc->items(doc->root())[11]), "hi");
  EXPECT_EQ(doc->Describe(doc->items(doc->root())[0]), "int 5");
}

TEST(PickleTest, ContainersAndMemoShareValues) {
  // {'a': [1], 'b': <the same list>} with the list memoized (BINPUT) and recalled (BINGET).
  const std::string p = B("\x80\x02}(") + U("a") + B("]q\x00K\x01") + "a" + U("b") + B("h\x00") + "u.";
  auto doc = Parse(p);
  ASSERT_TRUE(doc.ok()) << Message(doc);
  const PickleRef a = doc->DictGet(doc->root(), "a");
  const PickleRef b = doc->DictGet(doc->root(), "b");
  ASSERT_NE(a, kNoPickleRef);
  EXPECT_EQ(a, b);
  EXPECT_EQ(doc->at(a).kind, PickleKind::kList);
  ASSERT_EQ(doc->items(a).size(), 1u);
  EXPECT_EQ(doc->at(doc->items(a)[0]).integer, 1);
  EXPECT_EQ(doc->DictGet(doc->root(), "c"), kNoPickleRef);
  // TUPLE1..3, EMPTY_TUPLE, APPENDS, SETITEM, MEMOIZE + LONG_BINGET, all inside one MARK ... TUPLE.
  const std::string q = B("\x80\x02(K\x01\x85K\x01K\x02\x86K\x01K\x02K\x03\x87)") + B("](K\x07K\x08") + "e" + "}" +
                        U("k") + "Ns" + B("\x94j\x00\x00\x00\x00") + "t.";
  doc = Parse(q);
  ASSERT_TRUE(doc.ok()) << Message(doc);
  ASSERT_EQ(doc->items(doc->root()).size(), 7u);
  EXPECT_EQ(doc->items(doc->items(doc->root())[0]).size(), 1u);
  EXPECT_EQ(doc->items(doc->items(doc->root())[1]).size(), 2u);
  EXPECT_EQ(doc->items(doc->items(doc->root())[2]).size(), 3u);
  EXPECT_EQ(doc->items(doc->items(doc->root())[3]).size(), 0u);
  EXPECT_EQ(doc->Describe(doc->items(doc->root())[4]), "list of 2");
  EXPECT_EQ(doc->Describe(doc->items(doc->root())[5]), "dict of 1");
  EXPECT_EQ(doc->items(doc->root())[5],
            doc->items(doc->root())[6]);  // MEMOIZE stored it at index 0, LONG_BINGET 0 recalled it
}

TEST(PickleTest, ObjectsCallsAndPersistentIdsAreInert) {
  // __torch__.Net() with state {'w': torch._utils._rebuild_tensor_v2((persistent ('storage', 1),),)}.
  std::string p =
      "\x80\x02"
      "c__torch__\nNet\n)\x81}(" +
      U("w") + "ctorch._utils\n_rebuild_tensor_v2\n((" + U("storage") + B("K\x01tQt") + "Rub.";
  auto doc = Parse(p);
  ASSERT_TRUE(doc.ok()) << Message(doc);
  const PickleNode& root = doc->at(doc->root());
  ASSERT_EQ(root.kind, PickleKind::kObject);
  EXPECT_EQ(doc->Describe(doc->root()), "object of __torch__.Net");
  const PickleRef w = doc->DictGet(root.state, "w");
  ASSERT_NE(w, kNoPickleRef);
  EXPECT_EQ(doc->Describe(w), "call of torch._utils._rebuild_tensor_v2");
  const std::span<const PickleRef> args = doc->items(doc->items(w)[1]);
  ASSERT_EQ(args.size(), 1u);
  EXPECT_EQ(doc->at(args[0]).kind, PickleKind::kPersistent);
}

TEST(PickleTest, AContainerThatContainsItselfParses) {
  auto doc =
      Parse(B("\x80\x02]q\x00h\x00"
              "a."));
  ASSERT_TRUE(doc.ok()) << Message(doc);
  ASSERT_EQ(doc->items(doc->root()).size(), 1u);
  EXPECT_EQ(doc->items(doc->root())[0], doc->root());
}

TEST(PickleTest, RefusalsNameTheOpcodeAndOffset) {
  struct Case {
    std::string bytes;
    std::vector<std::string> expected;
  };
  const std::vector<Case> cases = {
      {B("\x80\x02"
         "i__main__\nX\n."),
       {"test.pkl", "opcode 'i' (INST) at byte 2", "not supported"}},
      {B("\x80\x02\xff."), {"unknown opcode 0xff at byte 2"}},
      {B("\x80\x02"
         "X\x10\x00\x00\x00"
         "ab"),
       {"'X' (BINUNICODE) at byte 2", "length 16 exceeds the 2 bytes left"}},
      {B("\x80\x02N"), {"ends at byte 3 without a STOP"}},
      {B("\x80\x02"
         "a."),
       {"'a' (APPEND) at byte 2", "stack underflow"}},
      {B("\x80\x02](a."), {"'a' (APPEND) at byte 4", "nothing above the last MARK"}},
      {B("\x80\x02"
         "K\x01t."),
       {"'t' (TUPLE) at byte 4", "no MARK"}},
      {B("\x80\x02h\x05."), {"'h' (BINGET) at byte 2", "memo entry 5 was never stored"}},
      {B("\x80\x02NN."), {"'.' (STOP) at byte 4", "2 values on the stack"}},
      {B("\x80\x02(N."), {"MARK(s) left open"}},
      {B("\x80\x02]N"
         "b."),
       {"'b' (BUILD) at byte 4", "builds a list"}},
      {B("\x80\x02NN"
         "R."),
       {"(REDUCE)", "arguments are a None"}},
      {B("\x80\x02}K\x01"
         "a."),
       {"(APPEND)", "appends to a dict"}},
      {B("\x80\x02"
         "c__torch__"),
       {"'c' (GLOBAL) at byte 2", "without its newline"}},
      {B("\x80\x02\x8a\x09"), {"(LONG1)", "9 bytes does not fit"}},
      {B("\x80\x06N."), {"(PROTO)", "protocol 6"}},
      {B("\x80\x02J\x01\x02"), {"'J' (BININT) at byte 2", "needs 4 more bytes"}},
  };
  for (const Case& c : cases) {
    auto doc = Parse(c.bytes);
    ASSERT_FALSE(doc.ok()) << "parsed: " << ::testing::PrintToString(c.bytes);
    EXPECT_EQ(doc.status().code(), absl::StatusCode::kInvalidArgument);
    for (const std::string& e : c.expected) EXPECT_THAT(Message(doc), HasSubstr(e));
  }
}

TEST(PickleTest, LimitsBoundDepthAndSize) {
  auto deep = Parse("\x80\x02" + std::string(5000, '('));
  EXPECT_THAT(Message(deep), HasSubstr("more than 4096 nested MARKs"));
  PickleLimits small;
  small.max_values = 3;
  const std::string four_ints = B("\x80\x02(J\x00\x00\x01\x00J\x00\x00\x02\x00J\x00\x00\x03\x00J\x00\x00\x04\x00t.");
  EXPECT_THAT(Message(Parse(four_ints, small)), HasSubstr("more than 3 values"));
  small = PickleLimits{};
  small.max_stack = 2;
  EXPECT_THAT(Message(Parse("\x80\x02NNN", small)), HasSubstr("more than 2 values on the stack"));
}

class RealPickleTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fl::testing::ScratchDir("pickle_test");
    exported_ = testing::ExportTestModels(dir_->path().string());
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(exported_) << exported_.message(); }
  static std::string DataPkl(const std::string& model) {
    return testing::ReadFileBytes(dir_->File(model + ".data.pkl"));
  }

  static fl::testing::ScratchDir* dir_;
  static ::testing::AssertionResult exported_;
};
fl::testing::ScratchDir* RealPickleTest::dir_ = nullptr;
::testing::AssertionResult RealPickleTest::exported_ = ::testing::AssertionFailure();

TEST_F(RealPickleTest, ReadsTheModuleTreeOfRealTorchScriptFiles) {
  for (const char* model : testing::kModelNames) {
    const std::string bytes = DataPkl(model);
    ASSERT_FALSE(bytes.empty()) << model;
    auto doc = ParsePickle(Bytes(bytes), model);
    ASSERT_TRUE(doc.ok()) << Message(doc);
    EXPECT_THAT(doc->Describe(doc->root()), HasSubstr("object of __torch__.")) << model;
  }
  const std::string bytes = DataPkl("cnn_scripted");
  auto doc = ParsePickle(Bytes(bytes), "cnn_scripted");
  ASSERT_TRUE(doc.ok()) << Message(doc);
  const PickleNode& root = doc->at(doc->root());
  EXPECT_EQ(doc->Describe(doc->root()), "object of __torch__.Cnn");
  const PickleRef features = doc->DictGet(root.state, "features");
  EXPECT_EQ(doc->Describe(features), "object of __torch__.torch.nn.modules.container.Sequential");
  const PickleRef fc = doc->DictGet(root.state, "fc");
  const PickleRef weight = doc->DictGet(doc->at(fc).state, "weight");
  EXPECT_EQ(doc->Describe(weight), "call of torch._utils._rebuild_tensor_v2");
  EXPECT_EQ(doc->at(doc->DictGet(root.state, "training")).kind, PickleKind::kBool);
}

// Hostile input: every truncation is an error that names the source; byte mutations at every position, and
// random multi-byte ones, give a value or an error, never a crash (run under the asan preset too).
TEST_F(RealPickleTest, TruncationsAndMutationsNeverCrash) {
  for (const char* model : {"cnn_scripted", "lm"}) {
    const std::string original = DataPkl(model);
    ASSERT_FALSE(original.empty());
    for (size_t n = 0; n < original.size(); ++n) {
      auto doc = ParsePickle(Bytes(original.substr(0, n)), model);
      ASSERT_FALSE(doc.ok()) << model << " truncated to " << n << " bytes parsed";
      EXPECT_THAT(Message(doc), HasSubstr(model));
    }
    size_t errors = 0;
    size_t parsed = 0;
    const uint8_t replacements[] = {0x00, 0xff, 0x80, 'h', 'j', '(', 'X', 'e', 'u', 'b', 't', 'R', 0x81, '.'};
    for (size_t i = 0; i < original.size(); ++i) {
      for (uint8_t r : replacements) {
        std::string mutated = original;
        mutated[i] = static_cast<char>(r);
        auto doc = ParsePickle(Bytes(mutated), model);
        (doc.ok() ? parsed : errors) += 1;
        if (doc.ok()) (void)doc->Describe(doc->root());
      }
    }
    std::mt19937 rng(12345);
    for (int round = 0; round < 3000; ++round) {
      std::string mutated = original;
      const int flips = 1 + static_cast<int>(rng() % 8);
      for (int f = 0; f < flips; ++f) mutated[rng() % mutated.size()] = static_cast<char>(rng() & 0xff);
      auto doc = ParsePickle(Bytes(mutated), model);
      (doc.ok() ? parsed : errors) += 1;
    }
    EXPECT_GT(errors, 0u);
    RecordProperty(std::string(model) + "_mutations_parsed", static_cast<int>(parsed));
  }
}

}  // namespace
}  // namespace fl::formats

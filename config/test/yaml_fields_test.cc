// YamlMap: every error names the file, the 1-based line, the field path and what is allowed.
#include "fl/config/yaml_fields.h"

#include <sys/stat.h>

#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fl/core/str_cat.h"
#include "fl/testing/scratch_dir.h"

namespace fl::config {
namespace {

using ::testing::HasSubstr;

std::string Message(const absl::Status& s) { return std::string(ToStd(s.message())); }

YamlMap Parse(const std::string& text) { return YamlMap(*ParseYaml(text, "f.yaml"), "f.yaml", ""); }

TEST(YamlMapTest, UnknownKeyIsNamedWithItsLineAndTheAllowedKeys) {
  const YamlMap m = Parse("a: 1\nb: 2\nbogus: 3\n");
  const absl::Status s = m.Check({"a", "b", "c"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(s), "f.yaml:3: bogus: unknown key; allowed: a, b, c");
  EXPECT_TRUE(m.Check({"a", "b", "bogus"}).ok());
}

TEST(YamlMapTest, NestedPathsAndLinesFollowTheDocument) {
  const YamlMap root = Parse("server:\n  rounds: 2\n  selection:\n    fraction: x\n");
  absl::StatusOr<std::optional<YamlMap>> server = root.Map("server");
  ASSERT_TRUE(server.ok() && server->has_value());
  absl::StatusOr<std::optional<YamlMap>> selection = (*server)->Map("selection");
  ASSERT_TRUE(selection.ok() && selection->has_value());
  EXPECT_EQ((*selection)->path(), "server.selection");
  EXPECT_EQ((*selection)->Line(), 4);  // a block map starts at its first key
  EXPECT_EQ(Message((*selection)->Number("fraction", 0, 1).status()),
            "f.yaml:4: server.selection.fraction: expected a number, got \"x\"; allowed: a number in [0, 1]");
}

TEST(YamlMapTest, WrongTypesSayWhatWasExpectedAndWhatCame) {
  const YamlMap m = Parse("n: three\ni: 1.5\nb: maybe\ns: [1, 2]\nm: 4\nl: []\n");
  EXPECT_EQ(Message(m.Number("n", 0, 10).status()),
            "f.yaml:1: n: expected a number, got \"three\"; allowed: a number in [0, 10]");
  EXPECT_EQ(Message(m.Integer("i", 1, 5).status()),
            "f.yaml:2: i: expected an integer, got \"1.5\"; allowed: an integer in [1, 5]");
  EXPECT_EQ(Message(m.Bool("b").status()), "f.yaml:3: b: expected true or false, got \"maybe\"; allowed: true, false");
  EXPECT_EQ(Message(m.String("s").status()), "f.yaml:4: s: expected a string, got a list; allowed: a string");
  EXPECT_EQ(Message(m.Map("m").status()), "f.yaml:5: m: expected a map, got \"4\"; allowed: a map");
  EXPECT_EQ(Message(m.MapList("l", 1).status()), "f.yaml:6: l: expected a list of at least 1 map, got an empty list");
  EXPECT_TRUE(Parse("x: 1\n").Check({"x"}).ok());
  EXPECT_EQ(Message(Parse("- 1\n").Check({"x"})),
            "f.yaml:1: (top level): expected a map, got a list; allowed: a map with keys x");
}

TEST(YamlMapTest, OutOfRangeValuesNameTheBounds) {
  const YamlMap m = Parse("share: 1.5\nloss: 1\ncount: 0\nok: 0.999\n");
  EXPECT_EQ(Message(m.Number("share", 1e-6, 1).status()),
            "f.yaml:1: share: value 1.5 is out of range; allowed: a number in [1e-06, 1]");
  EXPECT_EQ(Message(m.Number("loss", NumberRange{0, 1, true}).status()),
            "f.yaml:2: loss: value 1 is out of range; allowed: a number in [0, 1)");
  EXPECT_EQ(Message(m.Number("loss", NumberRange{0, 1, true}, "a fraction of packets").status()),
            "f.yaml:2: loss: value 1 is out of range; allowed: a fraction of packets");
  EXPECT_EQ(Message(m.Integer("count", 1, 100).status()),
            "f.yaml:3: count: value 0 is out of range; allowed: an integer in [1, 100]");
  absl::StatusOr<std::optional<double>> ok = m.Number("ok", NumberRange{0, 1, true});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_DOUBLE_EQ(**ok, 0.999);
}

TEST(YamlMapTest, MissingRequiredKeyPointsAtItsMap) {
  const YamlMap root = Parse("name: x\nserver:\n  strategy: fedavg\n");
  EXPECT_TRUE(root.Required("name").ok());
  absl::StatusOr<std::optional<YamlMap>> server = root.Map("server");
  ASSERT_TRUE(server.ok() && server->has_value());
  EXPECT_EQ(Message((*server)->Required("rounds", "an integer")),
            "f.yaml:3: server.rounds: missing (it is required); allowed: an integer");
}

TEST(YamlMapTest, AbsentKeysAreNulloptAndPresentOnesAreTyped) {
  const YamlMap m = Parse("s: hello\ni: -3\nn: 2.5e-3\nb: yes\nc: int8\n");
  EXPECT_FALSE(m.String("absent")->has_value());
  EXPECT_FALSE(m.Integer("absent", 0, 1)->has_value());
  EXPECT_EQ(**m.String("s"), "hello");
  EXPECT_EQ(**m.Integer("i", -5, 5), -3);
  EXPECT_DOUBLE_EQ(**m.Number("n", 0, 1), 2.5e-3);
  EXPECT_TRUE(**m.Bool("b"));
  EXPECT_EQ(**m.Choice("c", {"fp32", "int8"}), "int8");
  EXPECT_EQ(Message(m.Choice("c", {"fp32", "fp16"}).status()),
            "f.yaml:5: c: unknown value \"int8\"; allowed: fp32, fp16");
}

TEST(YamlMapTest, ParsedScalarsCarryTheParsersMessage) {
  const YamlMap m = Parse("rate: 10furlongs\nlist: [1]\ngood: 12\n");
  const std::function<absl::StatusOr<int>(std::string_view)> parse = [](std::string_view text) -> absl::StatusOr<int> {
    if (text == "12") return 12;
    return absl::InvalidArgumentError(fl::StrCat("'", text, "': unknown unit"));
  };
  EXPECT_EQ(Message(m.Parsed<int>("rate", "a rate", parse, "100mbit").status()),
            "f.yaml:1: rate: '10furlongs': unknown unit; allowed: 100mbit");
  EXPECT_EQ(Message(m.Parsed<int>("list", "a rate", parse, "100mbit").status()),
            "f.yaml:2: list: expected a rate, got a list; allowed: 100mbit");
  EXPECT_EQ(**m.Parsed<int>("good", "a rate", parse, "100mbit"), 12);
}

TEST(YamlMapTest, ListsOfMapsContinueThePath) {
  const YamlMap root = Parse("clients:\n  - name: a\n  - name: b\n    count: x\n");
  absl::StatusOr<std::optional<std::vector<YamlMap>>> list = root.MapList("clients", 1);
  ASSERT_TRUE(list.ok() && list->has_value()) << list.status();
  ASSERT_EQ((*list)->size(), 2u);
  EXPECT_EQ((**list)[1].path(), "clients[1]");
  EXPECT_EQ(Message((**list)[1].Integer("count", 1, 9).status()),
            "f.yaml:4: clients[1].count: expected an integer, got \"x\"; allowed: an integer in [1, 9]");
}

TEST(YamlMapTest, InlineNodesWithoutAFileOrLineStillSayWhere) {
  YAML::Node built;
  built["rate"] = YAML::Load("[1]");
  const YamlMap m(built, "", "link");
  EXPECT_THAT(Message(m.String("rate").status()), HasSubstr("<inline>"));
  EXPECT_THAT(Message(m.String("rate").status()), HasSubstr("link.rate: expected a string"));
}

TEST(YamlFilesTest, SyntaxErrorsAndMissingFilesSayWhich) {
  absl::StatusOr<YAML::Node> bad = ParseYaml("a: [1\n", "x.yaml");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(bad.status()), HasSubstr("x.yaml:"));
  EXPECT_THAT(Message(bad.status()), HasSubstr("not valid YAML"));

  fl::testing::ScratchDir dir("yaml_fields");
  absl::StatusOr<YAML::Node> missing = LoadYamlFile(dir.path() / "absent.yaml", "manifest");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(missing.status()), HasSubstr("manifest "));
  EXPECT_THAT(Message(missing.status()), HasSubstr("absent.yaml: no such file"));

  std::ofstream(dir.path() / "ok.yaml") << "a: 1\n";
  absl::StatusOr<YAML::Node> ok = LoadYamlFile(dir.path() / "ok.yaml", "manifest");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)["a"].as<int>(), 1);
}

// yaml-cpp keeps both entries of a key given twice (a lookup sees the first): every map of every document is
// checked before the loaders see it, with both lines and the field path.
TEST(StrictYamlTest, AKeyGivenTwiceIsRefusedInEveryMapNamingBothLines) {
  EXPECT_EQ(Message(ParseYaml("server:\n  rounds: 2\n  x: 1\n  rounds: 5\n", "m.yaml").status()),
            "m.yaml:4: server.rounds: key given twice (first at line 2, again at line 4); a key may appear once in a "
            "map: keep one of the two");
  EXPECT_THAT(Message(ParseYaml("clients:\n  - {name: a, count: 1, count: 2}\n", "m.yaml").status()),
              HasSubstr("m.yaml:2: clients[0].count: key given twice (first at line 2, again at line 2)"));
  EXPECT_THAT(Message(ParseYaml("a: 1\nb: [{c: 1}, {d: {e: 1, e: 2}}]\n", "m.yaml").status()),
              HasSubstr("m.yaml:2: b[1].d.e: key given twice"));
  EXPECT_THAT(Message(ParseYaml("\"a\": 1\na: 2\n", "m.yaml").status()), HasSubstr("m.yaml:2: a: key given twice"));
  // The same key in different maps, and lists of equal values, are fine.
  EXPECT_TRUE(ParseYaml("a: {x: 1}\nb: {x: 1}\nc: [1, 1, 1]\n", "m.yaml").ok());
}

TEST(StrictYamlTest, NestingDeeperThanTheLimitIsRefusedNotACrash) {
  for (int depth : {kMaxYamlDepth + 1, 100'000}) {
    std::string lists(static_cast<size_t>(depth), '[');
    lists.append(static_cast<size_t>(depth), ']');
    absl::StatusOr<YAML::Node> r = ParseYaml(lists, "deep.yaml");
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Message(r.status()), HasSubstr("deep.yaml:1: "));
    EXPECT_THAT(Message(r.status()), HasSubstr("nested deeper than 64 levels"));
    std::string maps;
    for (int i = 0; i < depth; ++i) maps += "{a: ";
    maps += "1";
    maps.append(static_cast<size_t>(depth), '}');
    EXPECT_THAT(Message(ParseYaml(maps, "deep.yaml").status()), HasSubstr("nested deeper than 64 levels"));
  }
  // Exactly at the limit is fine.
  std::string ok(kMaxYamlDepth, '[');
  ok.append(kMaxYamlDepth, ']');
  EXPECT_TRUE(ParseYaml(ok, "ok.yaml").ok());
}

TEST(StrictYamlTest, MoreNodesThanTheLimitAreRefusedBeforeTheTreeIsBuilt) {
  std::string many = "[";
  for (size_t i = 0; i < kMaxYamlNodes; ++i) many += "0,";
  many += "0]";
  EXPECT_THAT(Message(ParseYaml(many, "big.yaml").status()), HasSubstr("more than 250000 YAML nodes"));
}

TEST(StrictYamlTest, SpecialAndOversizedFilesAreRefusedNamingThem) {
  fl::testing::ScratchDir dir("yaml_special");
  const std::string fifo = dir.File("fifo.yaml");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THAT(Message(LoadYamlFile(fifo, "manifest").status()), HasSubstr("manifest " + fifo + ": is a FIFO"));
  EXPECT_THAT(Message(LoadYamlFile("/dev/zero", "manifest").status()),
              HasSubstr("manifest /dev/zero: is a character device"));
  const std::string big = dir.File("big.yaml");
  std::ofstream(big) << "a: \"" << std::string(kMaxYamlFileBytes, 'x') << "\"\n";
  EXPECT_THAT(Message(LoadYamlFile(big, "manifest").status()), HasSubstr("over the limit of 4194304 bytes"));
}

}  // namespace
}  // namespace fl::config

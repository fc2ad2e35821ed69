// FieldTable: the allowed keys, the reader and the records all come from one declaration per field.
#include "fl/config/field_table.h"

#include <map>
#include <string>
#include <variant>

#include <gtest/gtest.h>

#include "fl/core/str_cat.h"

namespace fl::config {
namespace {

struct Inner {
  double fraction = 1.0;
  uint32_t every = 1;
  bool operator==(const Inner&) const = default;
};

struct Config {
  std::string name;
  uint32_t rounds = 3;
  uint64_t seed = 1;
  double deadline_s = 120;
  bool verbose = false;
  std::string codec = "fp32";
  double fraction = 1.0;
  uint32_t evaluate_every = 1;
  std::string origin;  // derived, in records only
  std::string added_later = "old-default";
  Inner inner;
  bool operator==(const Config&) const = default;
};

const FieldTable<Config>& Table() {
  static const FieldTable<Config> table = {
      StringField("name", &Config::name).Required(),
      StringField<Config>("description"),  // accepted, kept nowhere
      IntField("rounds", &Config::rounds, 1, 1000).Required(),
      IntField("seed", &Config::seed),
      NumberField("deadline_s", &Config::deadline_s, {0.001, 1e7}),
      BoolField("verbose", &Config::verbose),
      ChoiceField("codec", &Config::codec, {"fp32", "int8"}),
      NumberField("selection.fraction", &Config::fraction, {0, 1}),
      IntField("selection.evaluation.every", &Config::evaluate_every, 0, 100).Recorded("evaluate_every"),
      RecordField("origin", &Config::origin),
      StringField("added_later", &Config::added_later).NewInRecords(),
      SectionField("inner", &Config::inner,
                   FieldTable<Inner>{NumberField("fraction", &Inner::fraction, {0, 1, true}),
                                     IntField("every", &Inner::every, 1, 10)}),
  };
  return table;
}

absl::StatusOr<Config> Read(const std::string& text) {
  absl::StatusOr<YAML::Node> node = ParseYaml(text, "c.yaml");
  if (!node.ok()) return node.status();
  Config c;
  if (absl::Status s = Table().Read(YamlMap(*node, "c.yaml", ""), c); !s.ok()) return s;
  return c;
}

std::string Message(const absl::StatusOr<Config>& c) { return std::string(ToStd(c.status().message())); }

TEST(FieldTableTest, ReadsEveryKindIntoItsMember) {
  absl::StatusOr<Config> c = Read(R"(name: x
description: ignored
rounds: 7
seed: 12345678901
deadline_s: 2.5
verbose: true
codec: int8
selection:
  fraction: 0.25
  evaluation: {every: 4}
added_later: new
inner: {fraction: 0.5, every: 2}
)");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->name, "x");
  EXPECT_EQ(c->rounds, 7u);
  EXPECT_EQ(c->seed, 12345678901u);
  EXPECT_DOUBLE_EQ(c->deadline_s, 2.5);
  EXPECT_TRUE(c->verbose);
  EXPECT_EQ(c->codec, "int8");
  EXPECT_DOUBLE_EQ(c->fraction, 0.25);
  EXPECT_EQ(c->evaluate_every, 4u);
  EXPECT_EQ(c->added_later, "new");
  EXPECT_EQ(c->inner, (Inner{0.5, 2}));
}

TEST(FieldTableTest, AbsentFieldsAndSectionsKeepTheirDefaults) {
  absl::StatusOr<Config> c = Read("name: x\nrounds: 2\n");
  ASSERT_TRUE(c.ok()) << c.status();
  Config expected;
  expected.name = "x";
  expected.rounds = 2;
  EXPECT_EQ(*c, expected);
}

TEST(FieldTableTest, AllowedKeysComeFromTheTableAtEveryLevel) {
  EXPECT_EQ(Table().KeysAt(""), (std::vector<std::string>{"name", "description", "rounds", "seed", "deadline_s",
                                                          "verbose", "codec", "selection", "added_later", "inner"}));
  EXPECT_EQ(Table().KeysAt("selection"), (std::vector<std::string>{"fraction", "evaluation"}));
  EXPECT_EQ(Table().KeysAt("selection.evaluation"), (std::vector<std::string>{"every"}));
  EXPECT_EQ(Message(Read("name: x\nrounds: 2\nround: 3\n")),
            "c.yaml:3: round: unknown key; allowed: name, description, rounds, seed, deadline_s, verbose, codec, "
            "selection, added_later, inner");
  EXPECT_EQ(Message(Read("name: x\nrounds: 2\nselection:\n  fraction: 1\n  evaluation: {every: 1, often: 2}\n")),
            "c.yaml:5: selection.evaluation.often: unknown key; allowed: every");
  EXPECT_EQ(Message(Read("name: x\nrounds: 2\ninner:\n  every: 1\n  fractoin: 0.5\n")),
            "c.yaml:5: inner.fractoin: unknown key; allowed: fraction, every");
}

TEST(FieldTableTest, WrongTypeOutOfRangeAndMissingFieldsAreErrorsWithLines) {
  EXPECT_EQ(Message(Read("name: x\nrounds: three\n")),
            "c.yaml:2: rounds: expected an integer, got \"three\"; allowed: an integer in [1, 1000]");
  EXPECT_EQ(Message(Read("name: x\nrounds: 0\n")),
            "c.yaml:2: rounds: value 0 is out of range; allowed: an integer in [1, 1000]");
  EXPECT_EQ(Message(Read("name: x\n\nrounds: 1\ninner: {fraction: 1}\n")),
            "c.yaml:4: inner.fraction: value 1 is out of range; allowed: a number in [0, 1)");
  EXPECT_EQ(Message(Read("name: x\nrounds: 1\ncodec: int4\n")),
            "c.yaml:3: codec: unknown value \"int4\"; allowed: fp32, int8");
  EXPECT_EQ(Message(Read("name: x\nrounds: 1\nselection: 0.5\n")),
            "c.yaml:3: selection: expected a map, got \"0.5\"; allowed: a map with keys fraction, evaluation");
  EXPECT_EQ(Message(Read("name: x\nrounds: 1\ninner: []\n")),
            "c.yaml:3: inner: expected a map, got an empty list; allowed: a map with keys fraction, every");
  EXPECT_EQ(Message(Read("name: x\nseed: 1\n")),
            "c.yaml:1: rounds: missing (it is required); allowed: an integer in [1, 1000]");
  EXPECT_EQ(Message(Read("name: x\nrounds: 1\nseed: -1\n")),
            "c.yaml:3: seed: value -1 is out of range; allowed: an integer in [0, 9223372036854775807]");
}

TEST(FieldTableTest, ChecksRunAfterTheirFieldAndMayUseTheMapForErrors) {
  FieldTable<Config> table = {
      IntField("rounds", &Config::rounds, 1, 1000),
      IntField("selection.evaluation.every", &Config::evaluate_every, 0, 100)
          .Then([](const YamlMap& m, Config& c) -> absl::Status {
            if (c.evaluate_every > c.rounds) {
              return m.Error(m.Node("every"), "every", fl::StrCat("is more than rounds (", c.rounds, ")"));
            }
            c.origin = "checked";
            return absl::OkStatus();
          }),
  };
  Config c;
  absl::Status s =
      table.Read(YamlMap(*ParseYaml("rounds: 2\nselection:\n  evaluation: {every: 5}\n", "c.yaml"), "c.yaml", ""), c);
  EXPECT_EQ(std::string(ToStd(s.message())), "c.yaml:3: selection.evaluation.every: is more than rounds (2)");
  Config d;
  s = table.Read(YamlMap(*ParseYaml("rounds: 9\nselection: {evaluation: {every: 5}}\n", "c.yaml"), "c.yaml", ""), d);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(d.origin, "checked");
}

TEST(FieldTableTest, CustomFieldsReadTheirKeyAndDeclareIt) {
  FieldTable<Config> table = {
      CustomField<Config>(
          "strategy",
          [](const YamlMap& m, const std::string& key, Config& c) -> absl::Status {
            const YAML::Node n = m.Node(key);
            if (!n.IsScalar()) return m.Error(n, key, "expected a name", "fedavg, fedadam");
            c.codec = n.Scalar();
            return absl::OkStatus();
          },
          &Config::codec),
  };
  EXPECT_EQ(table.KeysAt(""), (std::vector<std::string>{"strategy"}));
  Config c;
  ASSERT_TRUE(table.Read(YamlMap(*ParseYaml("strategy: fedadam\n", "c.yaml"), "c.yaml", ""), c).ok());
  EXPECT_EQ(c.codec, "fedadam");
  EXPECT_EQ(std::string(ToStd(table.Read(YamlMap(*ParseYaml("strategy: [1]\n", "c.yaml"), "c.yaml", ""), c).message())),
            "c.yaml:1: strategy: expected a name; allowed: fedavg, fedadam");
}

// A flat record written and read back through VisitRecorded holds every recorded field; a record written
// before a NewInRecords() field existed reads back with its default.
TEST(FieldTableTest, RecordsRoundTripThroughTheSameTable) {
  using Value = std::variant<std::string, bool, uint32_t, uint64_t, int64_t, double>;
  absl::StatusOr<Config> c = Read("name: x\nrounds: 7\nseed: 9\nselection: {evaluation: {every: 3}}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  c->origin = "file.yaml";
  std::map<std::string, Value> record;
  Table().VisitRecorded(*c, [&](const Field<Config>& f, const auto& value) { record[f.name] = value; });
  EXPECT_EQ(record.count("description"), 0u);  // kept nowhere: not recorded
  EXPECT_EQ(record.count("inner"), 0u);        // sections are recorded by their own table
  EXPECT_EQ(std::get<uint32_t>(record.at("evaluate_every")), 3u);
  EXPECT_EQ(std::get<std::string>(record.at("origin")), "file.yaml");

  Config back;
  back.inner = c->inner;
  Table().VisitRecorded(back, [&](const Field<Config>& f, auto& value) {
    value = std::get<std::decay_t<decltype(value)>>(record.at(f.name));
  });
  EXPECT_EQ(back, *c);

  record.erase("added_later");
  Config old;
  Table().VisitRecorded(old, [&](const Field<Config>& f, auto& value) {
    if (!f.in_old_records && record.count(f.name) == 0) return;
    value = std::get<std::decay_t<decltype(value)>>(record.at(f.name));
  });
  EXPECT_EQ(old.added_later, "old-default");
  EXPECT_EQ(old.rounds, 7u);
}

}  // namespace
}  // namespace fl::config

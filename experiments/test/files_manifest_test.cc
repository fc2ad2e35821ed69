// Bad manifests, traces and records through the real binaries (issue 27), each the way the finding was made:
// fl-experiment validate / run / replay and fl-report on real files. Every one must end with exit code 2 (never
// a signal, never a hang: RunTool kills after a timeout and reports -1) and a message naming the file and the
// field or value.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fl/core/str_cat.h"
#include "fl/testing/run_tool.h"
#include "fl/testing/scratch_dir.h"

namespace {

namespace fs = std::filesystem;
using ::fl::testing::RunTool;
using ::fl::testing::ScratchDir;
using ::fl::testing::ToolResult;
using ::testing::HasSubstr;
using ::testing::Not;

// A valid manifest with inline links only (no profiles folder needed); tests change one thing.
constexpr char kManifest[] = R"(name: files
server:
  rounds: 2
  selection: {min_fit_clients: 1, min_available_clients: 1}
training: {model: "synthetic:100"}
clients:
  - name: a
    count: 2
)";

std::string Write(const ScratchDir& dir, const std::string& name, const std::string& text) {
  const std::string path = dir.File(name);
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

ToolResult Experiment(const ScratchDir& dir, std::vector<std::string> args) {
  args.insert(args.begin(), FL_EXPERIMENT_BIN);
  return RunTool(args, dir, std::chrono::seconds(60));
}

// Exit code 2, not a signal (RunTool's code is 128 + N for one) and not a hang (-1).
void ExpectRefused(const ToolResult& r) {
  EXPECT_EQ(r.code, 2) << (r.code == -1 ? "hung: killed after the timeout\n" : "") << r.output;
}

TEST(FilesManifestTest, GoodManifestValidates) {
  ScratchDir dir("files_manifest_good");
  const ToolResult r = Experiment(dir, {"validate", Write(dir, "m.yaml", kManifest)});
  EXPECT_EQ(r.code, 0) << r.output;
}

// Bytes that are not UTF-8 in a string (found by experiments_manifest_fuzz_test): the resolved manifest's JSON
// threw out of fl-experiment validate (SIGABRT); they are written as U+FFFD.
TEST(FilesManifestTest, StringsThatAreNotUtf8DoNotAbort) {
  ScratchDir dir("files_manifest_utf8");
  const ToolResult r =
      Experiment(dir, {"validate", Write(dir, "m.yaml", std::string(kManifest) + "description: \"caf\xe9 \xb5\"\n")});
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("caf\xef\xbf\xbd")) << r.output;
}

// `name: ../../..` made fl-experiment run write its records, logs and throwaway CA (after removing <out>/pki)
// outside out/.
TEST(FilesManifestTest, ExperimentNameThatLeavesTheOutputFolderIsRefused) {
  ScratchDir dir("files_manifest_name");
  const std::string escape = fl::StrCat("../../fl-h3-escape-", ::getpid());
  std::string text = kManifest;
  text.replace(text.find("name: files"), 11, "name: " + escape);
  const std::string path = Write(dir, "m.yaml", text);
  for (const char* command : {"validate", "run"}) {
    const ToolResult r = Experiment(dir, {command, path});
    ExpectRefused(r);
    EXPECT_THAT(r.output, HasSubstr(path + ":1: name: experiment name \"" + escape + "\"")) << r.output;
  }
  EXPECT_FALSE(fs::exists(fs::path("out") / escape)) << "fl-experiment run wrote outside out/";
  for (const char* bad : {"a/b", "..", ".hidden", "-x", "a b"}) {
    text = kManifest;
    text.replace(text.find("name: files"), 11, fl::StrCat("name: \"", bad, "\""));
    const ToolResult r = Experiment(dir, {"validate", Write(dir, "m.yaml", text)});
    ExpectRefused(r);
    EXPECT_THAT(r.output, HasSubstr(fl::StrCat("experiment name \"", bad, "\""))) << r.output;
  }
}

// A client group's name forms its clients' log and certificate file names; a profile name the file read.
TEST(FilesManifestTest, GroupAndProfileNamesThatArePathsAreRefused) {
  ScratchDir dir("files_manifest_group");
  std::string text = kManifest;
  text.replace(text.find("- name: a"), 9, "- name: ../a");
  ToolResult r = Experiment(dir, {"validate", Write(dir, "m.yaml", text)});
  ExpectRefused(r);
  EXPECT_THAT(r.output, HasSubstr("clients[0].name: group name \"../a\"")) << r.output;
  text = std::string(kManifest) + "    link: ../../../../etc/x\n";
  r = Experiment(dir, {"validate", Write(dir, "m.yaml", text)});
  ExpectRefused(r);
  EXPECT_THAT(r.output, HasSubstr("clients[0].link: link profile name \"../../../../etc/x\"")) << r.output;
}

// yaml-cpp keeps both entries of a key given twice and every lookup sees the first: the second was dropped
// without a word.
TEST(FilesManifestTest, KeyGivenTwiceIsRefusedNamingBothLines) {
  ScratchDir dir("files_manifest_dup");
  std::string text = kManifest;
  text.replace(text.find("  rounds: 2\n"), 12, "  rounds: 2\n  rounds: 5\n");
  const std::string path = Write(dir, "m.yaml", text);
  ToolResult r = Experiment(dir, {"validate", path});
  ExpectRefused(r);
  EXPECT_THAT(r.output, HasSubstr(path + ":4: server.rounds: key given twice (first at line 3, again at line 4)"))
      << r.output;
  // In a flow map and in a list's map too.
  text = std::string(kManifest) + "    link: {uplink: {rate: 1mbit, rate: 2mbit}, downlink: {}}\n";
  r = Experiment(dir, {"validate", Write(dir, "m.yaml", text)});
  ExpectRefused(r);
  EXPECT_THAT(r.output, HasSubstr("clients[0].link.uplink.rate: key given twice")) << r.output;
}

// 10^9 clients passed validate; the total is now bounded (kMaxManifestClients) with the reason.
TEST(FilesManifestTest, BillionClientsAreRefusedWithTheLimit) {
  ScratchDir dir("files_manifest_billion");
  std::string text = "name: big\nserver: {rounds: 1}\ntraining: {model: \"synthetic:10\"}\nclients:\n";
  for (int i = 0; i < 10'000; ++i) text += fl::StrCat("  - {name: g", i, ", count: 100000}\n");
  const std::string path = Write(dir, "m.yaml", text);
  const ToolResult r = Experiment(dir, {"validate", path});
  ExpectRefused(r);
  EXPECT_THAT(r.output, HasSubstr(path + ":6: clients[1].count: the client groups up to this one add up to 200000 "
                                         "clients, over the limit of 100000"))
      << r.output;
}

// 42,950 groups of 100,000 are 2^32 + 32,704 clients: the 32-bit sum wrapped and the refusal said "the manifest
// has only 32704 clients".
TEST(FilesManifestTest, CountsThatWouldWrapAt32BitsAreRefusedForWhatTheyAre) {
  ScratchDir dir("files_manifest_wrap");
  std::string text =
      "name: wrap\nserver: {rounds: 1, selection: {min_available_clients: 40000, min_fit_clients: 40000}}\n"
      "training: {model: \"synthetic:10\"}\nclients:\n";
  for (int i = 0; i < 42'950; ++i) text += fl::StrCat("  - {name: g", i, ", count: 100000}\n");
  const ToolResult r = Experiment(dir, {"validate", Write(dir, "m.yaml", text)});
  ExpectRefused(r);
  EXPECT_THAT(r.output, Not(HasSubstr("32704"))) << r.output;
  EXPECT_THAT(r.output, HasSubstr("over the limit of 100000 clients")) << r.output;
  // A count beyond 64 bits is not a number to wrap either.
  text = std::string(kManifest);
  text.replace(text.find("count: 2"), 8, "count: 99999999999999999999999");
  const ToolResult huge = Experiment(dir, {"validate", Write(dir, "m.yaml", text)});
  ExpectRefused(huge);
  EXPECT_THAT(huge.output, HasSubstr("clients[0].count: expected an integer")) << huge.output;
}

TEST(FilesManifestTest, ManifestThatIsAFifoOrDevZeroOrHugeIsRefused) {
  ScratchDir dir("files_manifest_special");
  const std::string fifo = dir.File("fifo.yaml");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string zero = dir.File("zero.yaml");
  fs::create_symlink("/dev/zero", zero);
  for (const char* command : {"validate", "run"}) {
    ToolResult r = Experiment(dir, {command, fifo});
    ExpectRefused(r);
    EXPECT_THAT(r.output, HasSubstr("manifest " + fifo + ": is a FIFO")) << r.output;
    r = Experiment(dir, {command, zero});
    ExpectRefused(r);
    EXPECT_THAT(r.output, HasSubstr("manifest " + zero + ": is a character device")) << r.output;
  }
  const std::string big = Write(dir, "big.yaml", std::string(kManifest) + "# " + std::string(5 << 20, 'x') + "\n");
  const ToolResult r = Experiment(dir, {"validate", big});
  ExpectRefused(r);
  EXPECT_THAT(r.output, HasSubstr("manifest " + big + ": ")) << r.output;
  EXPECT_THAT(r.output, HasSubstr("over the limit of 4194304 bytes")) << r.output;
}

// yaml-cpp's parser recurses once a level: 100,000 nested lists or maps must be refused, not overflow the stack.
TEST(FilesManifestTest, DeeplyNestedYamlIsRefusedNotACrash) {
  ScratchDir dir("files_manifest_deep");
  const int n = 100'000;
  std::string lists = "name: ";
  lists.append(n, '[');
  lists.append(n, ']');
  lists += "\n";
  std::string maps = "name: ";
  for (int i = 0; i < n; ++i) maps += "{a: ";
  maps += "1";
  maps.append(n, '}');
  maps += "\n";
  std::string block = "name: x\nserver:\n";
  for (int i = 0; i < 200; ++i) block += std::string(2 * (i + 1), ' ') + "a:\n";
  for (const std::string& text : {lists, maps, block}) {
    const std::string path = Write(dir, "deep.yaml", text);
    const ToolResult r = Experiment(dir, {"validate", path});
    ExpectRefused(r);
    EXPECT_THAT(r.output, HasSubstr(path)) << r.output.substr(0, 2000);
    EXPECT_THAT(r.output, HasSubstr("nested deeper than 64 levels")) << r.output.substr(0, 2000);
  }
}

// A link trace that is a FIFO blocked fl-experiment forever; /dev/zero read until memory ran out. The refusal
// names the manifest (file and line), the field and the trace file.
TEST(FilesManifestTest, LinkTraceThatIsAFifoOrDevZeroIsRefusedNamingManifestAndTrace) {
  ScratchDir dir("files_manifest_trace");
  const std::string fifo = dir.File("fifo.trace");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string zero = dir.File("zero.trace");
  fs::create_symlink("/dev/zero", zero);
  for (const auto& [trace, kind] : {std::pair{fifo, "is a FIFO"}, std::pair{zero, "is a character device"}}) {
    const std::string text =
        std::string(kManifest) + "    link: {uplink: {trace: " + trace + "}, downlink: {rate: 1mbit}}\n";
    const std::string path = Write(dir, "m.yaml", text);
    const ToolResult r = Experiment(dir, {"validate", path});
    ExpectRefused(r);
    EXPECT_THAT(r.output, HasSubstr(path + ":9: clients[0].link.uplink.trace: trace file " + trace + ": " + kind))
        << r.output;
  }
}

// The same through a named profile: the manifest, the profile and the trace are all named.
TEST(FilesManifestTest, NamedProfileWithABadTraceNamesManifestProfileAndTrace) {
  ScratchDir dir("files_manifest_profile_trace");
  fs::create_directories(dir.path() / "profiles" / "links");
  const std::string fifo = (dir.path() / "profiles" / "links" / "x.trace").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string profile =
      Write(dir, "profiles/links/slow.yaml", "uplink: {trace: x.trace}\ndownlink: {rate: 1mbit}\n");
  const std::string path = Write(dir, "m.yaml", std::string(kManifest) + "    link: slow\n");
  const ToolResult r = Experiment(dir, {"validate", path});
  ExpectRefused(r);
  EXPECT_THAT(r.output, HasSubstr(path + ":9: clients[0].link: " + profile + ":1: uplink.trace: trace file "))
      << r.output;
  EXPECT_THAT(r.output, HasSubstr("x.trace: is a FIFO")) << r.output;
}

TEST(FilesManifestTest, AvailabilityTraceThatIsAFifoOrDevZeroIsRefusedNamingManifestAndTrace) {
  ScratchDir dir("files_manifest_availability");
  const std::string fifo = dir.File("fifo.avail");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string zero = dir.File("zero.avail");
  fs::create_symlink("/dev/zero", zero);
  for (const auto& [trace, kind] : {std::pair{fifo, "is a FIFO"}, std::pair{zero, "is a character device"}}) {
    const std::string path =
        Write(dir, "m.yaml", std::string(kManifest) + "    availability: {trace: " + trace + "}\n");
    const ToolResult r = Experiment(dir, {"validate", path});
    ExpectRefused(r);
    EXPECT_THAT(r.output,
                HasSubstr(path + ":9: clients[0].availability.trace: availability trace " + trace + ": " + kind))
        << r.output;
  }
}

// fl-report and fl-experiment replay given a records path that is a FIFO (SQLite's first read blocked forever),
// /dev/zero, or a file that is not SQLite: exit 2 naming it.
TEST(FilesManifestTest, RecordsThatAreAFifoDevZeroOrNotSqliteAreRefusedNamingThem) {
  ScratchDir dir("files_records");
  const std::string fifo = dir.File("fifo.db");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string zero = dir.File("zero.db");
  fs::create_symlink("/dev/zero", zero);
  const std::string text = Write(dir, "text.db", "this is not a database\n");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {fifo, "records database " + fifo + ": is a FIFO"},
      {zero, "records database " + zero + ": is a character device"},
      {text, "records database " + text}};
  for (const auto& [path, expected] : cases) {
    for (const std::vector<std::string>& argv :
         {std::vector<std::string>{FL_REPORT_BIN, path}, std::vector<std::string>{FL_REPORT_BIN, "--compare", path},
          std::vector<std::string>{FL_EXPERIMENT_BIN, "replay", path}}) {
      const ToolResult r = RunTool(argv, dir, std::chrono::seconds(60));
      ExpectRefused(r);
      EXPECT_THAT(r.output, HasSubstr(expected)) << argv[1] << "\n" << r.output;
    }
  }
}

}  // namespace

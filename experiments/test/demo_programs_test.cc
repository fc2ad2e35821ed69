// `./fl.sh demo` builds the CMake target fl_demo only (cmake/FlDemo.cmake, issue 32 item 1): this test fails if the
// quickstart needs a program that target does not build. It copies exactly the programs of fl_demo's dependency
// list (fl_demo_programs.txt, written at configure time from the target's own dependencies) into an empty folder,
// fl-experiment among them, and runs the quickstart manifest with the copied fl-experiment: fl-experiment finds the
// programs it starts beside itself (as in an installed tree), so one missing from the list is missing there too.
// The manifest is experiments/quickstart.yaml with one round of a few steps (the programs it starts do not depend on
// the number of rounds or steps). Then each listed program is taken away in turn and the run must fail: the list
// holds nothing the quickstart does not need.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fl/testing/run_tool.h"
#include "fl/testing/scratch_dir.h"

namespace {

namespace fs = std::filesystem;
using fl::testing::RunTool;
using fl::testing::ScratchDir;
using fl::testing::ToolResult;

// The programs of fl_demo's dependency list, as absolute paths in the build tree.
std::vector<fs::path> DemoPrograms() {
  std::ifstream in(FL_DEMO_PROGRAMS_FILE);
  EXPECT_TRUE(in.good()) << "cannot read " << FL_DEMO_PROGRAMS_FILE << ": reconfigure the build (cmake/FlDemo.cmake)";
  std::vector<fs::path> programs;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) programs.emplace_back(line);
  }
  return programs;
}

// The quickstart manifest, shortened to one round of 10 local steps per client; everything that decides which
// programs run (clients, their links, the emulation backend, devices, security) is the quickstart's own.
std::string ShortQuickstart(const ScratchDir& dir) {
  YAML::Node m = YAML::LoadFile(std::string(FL_EXPERIMENTS_DIR) + "/quickstart.yaml");
  EXPECT_TRUE(m["server"]["rounds"]) << "quickstart.yaml has no server.rounds: update this test";
  m["server"]["rounds"] = 1;
  m["training"]["local_steps"] = 10;
  // Link profiles resolve against the manifest's folder (profiles/ beside it), as for the quickstart in place.
  std::error_code ec;
  fs::create_directory_symlink(fs::path(FL_EXPERIMENTS_DIR) / "profiles", dir.path() / "profiles", ec);
  EXPECT_FALSE(ec) << ec.message();
  const std::string path = dir.File("quickstart-short.yaml");
  std::ofstream(path) << YAML::Dump(m) << "\n";
  return path;
}

// Copies `programs` (copies, not links: fl-experiment finds its siblings from /proc/self/exe, which names a link's
// target) into a new folder `name` of `dir`; returns that folder.
fs::path CopyInto(const ScratchDir& dir, const std::string& name, const std::vector<fs::path>& programs) {
  const fs::path bin = dir.path() / name;
  fs::create_directories(bin);
  for (const fs::path& p : programs) {
    std::error_code ec;
    fs::copy_file(p, bin / p.filename(), fs::copy_options::overwrite_existing, ec);
    EXPECT_FALSE(ec) << "copy " << p << ": " << ec.message();
  }
  return bin;
}

ToolResult RunQuickstart(const ScratchDir& dir, const fs::path& bin, const std::string& manifest,
                         const std::string& out) {
  return RunTool({(bin / "fl-experiment").string(), "run", manifest, "--out", dir.File(out)}, dir,
                 std::chrono::seconds(600));
}

TEST(DemoPrograms, ListNamesBuiltProgramsWithFlExperiment) {
  const std::vector<fs::path> programs = DemoPrograms();
  ASSERT_FALSE(programs.empty()) << FL_DEMO_PROGRAMS_FILE << " lists no program";
  bool has_experiment = false;
  for (const fs::path& p : programs) {
    EXPECT_TRUE(fs::is_regular_file(p)) << p << " is in fl_demo's list but not built";
    has_experiment = has_experiment || p.filename() == "fl-experiment";
  }
  EXPECT_TRUE(has_experiment) << "fl_demo must build fl-experiment, which runs the quickstart";
}

TEST(DemoPrograms, QuickstartRunsWithTheDemoProgramsAlone) {
  const std::vector<fs::path> programs = DemoPrograms();
  ASSERT_FALSE(programs.empty());
  ScratchDir dir("demo_programs");
  const fs::path bin = CopyInto(dir, "bin", programs);
  const std::string manifest = ShortQuickstart(dir);
  const ToolResult r = RunQuickstart(dir, bin, manifest, "out");
  ASSERT_EQ(r.code, 0) << "the quickstart failed with only fl_demo's programs (" << bin
                       << "): does it start a program that cmake/FlDemo.cmake does not list?\n"
                       << r.output;
  EXPECT_NE(r.output.find("round 1/1"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(dir.path() / "out" / "records.db")) << r.output;
}

TEST(DemoPrograms, EveryListedProgramIsNeeded) {
  const std::vector<fs::path> programs = DemoPrograms();
  ASSERT_FALSE(programs.empty());
  ScratchDir dir("demo_programs_less");
  const std::string manifest = ShortQuickstart(dir);
  for (size_t left_out = 0; left_out < programs.size(); ++left_out) {
    const std::string name = programs[left_out].filename().string();
    if (name == "fl-experiment") continue;  // it is the command itself
    std::vector<fs::path> fewer = programs;
    fewer.erase(fewer.begin() + static_cast<std::ptrdiff_t>(left_out));
    const fs::path bin = CopyInto(dir, "without-" + name, fewer);
    const ToolResult r = RunQuickstart(dir, bin, manifest, "out-without-" + name);
    EXPECT_NE(r.code, 0) << "the quickstart ran without " << name << ": fl_demo builds a program it does not need\n"
                         << r.output;
    // It failed for that reason, not another: a program was not found (fl-experiment names the path it tried, which
    // is the build tree's layout when a sibling is missing).
    EXPECT_NE(r.output.find("No such file or directory"), std::string::npos) << r.output;
  }
}

}  // namespace

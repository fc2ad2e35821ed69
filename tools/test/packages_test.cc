// The Debian packages (cmake/FlPackaging.cmake, docs/packages.md), made by CPack from this build tree and installed
// with dpkg into a clean root of their own (`dpkg --root`, an empty package database): their fields (architecture,
// the runtime libraries dpkg-shlibdeps found), dpkg's refusals (missing runtime libraries, the wrong
// architecture), the installed files (programs in /usr/bin, units pointing at them, conffiles), and a short
// federation run with the installed fl-server and fl-client.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "fl/testing/run_tool.h"
#include "fl/testing/scratch_dir.h"
#include "fl/testing/subprocess.h"
#include "fl/testing/suite_set_up.h"

namespace {

namespace fs = std::filesystem;
using fl::testing::ReadAll;
using fl::testing::RunTool;
using fl::testing::ToolResult;

std::string Trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

class PackagesTest : public ::testing::Test {
 protected:
  void SetUp() override { fl::testing::SetUpSuiteOnce<PackagesTest>(&PackagesTest::SetUpSuite); }
  static void SetUpSuite() {
    dir_ = new fl::testing::ScratchDir("fl_packages");
    const ToolResult made = RunTool({FL_CPACK, "-G", "DEB", "--config",
                                     std::string(FL_BUILD_DIR) + "/CPackConfig.cmake", "-B", dir_->File("packages")},
                                    *dir_, std::chrono::seconds(600));
    ASSERT_EQ(made.code, 0) << made.output;
    arch_ = new std::string(Trimmed(RunTool({"dpkg", "--print-architecture"}, *dir_).output));
    for (const char* name : {"fl-server", "fl-client", "fl-tools"}) {
      const std::string deb = Deb(name);
      ASSERT_TRUE(fs::exists(deb)) << deb << " was not made:\n" << made.output;
    }
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete arch_;
    dir_ = nullptr;
    arch_ = nullptr;
  }

  static std::string Deb(const std::string& name) {
    return dir_->File("packages/" + name + "_" + FL_VERSION + "_" + *arch_ + ".deb");
  }
  static std::string Field(const std::string& deb, const std::string& field) {
    return Trimmed(RunTool({"dpkg-deb", "-f", deb, field}, *dir_).output);
  }
  // A root with an empty package database: nothing is installed there, so every dependency is missing.
  static std::string CleanRoot(const std::string& name) {
    const fs::path root = dir_->File(name);
    for (const char* d : {"var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers"}) {
      fs::create_directories(root / d);
    }
    std::ofstream(root / "var/lib/dpkg/status").flush();
    std::ofstream(root / "var/lib/dpkg/available").flush();
    return root.string();
  }
  // dpkg into `root`; the maintainer scripts run outside it (they are /bin/sh scripts and the root has no shell),
  // and see DPKG_ROOT set, so they leave this machine's systemd alone.
  static ToolResult Dpkg(const std::string& root, std::vector<std::string> args) {
    std::vector<std::string> argv = {"dpkg", "--root=" + root, "--force-script-chrootless", "--log=/dev/null"};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunTool(argv, *dir_, std::chrono::seconds(120));
  }

  static fl::testing::ScratchDir* dir_;
  static std::string* arch_;
};

fl::testing::ScratchDir* PackagesTest::dir_ = nullptr;
std::string* PackagesTest::arch_ = nullptr;

TEST_F(PackagesTest, FieldsNameThisArchitectureAndDebiansRuntimeLibraries) {
  EXPECT_EQ(Field(Deb("fl-server"), "Package"), "fl-server");
  EXPECT_EQ(Field(Deb("fl-server"), "Architecture"), *arch_);
  EXPECT_EQ(Field(Deb("fl-client"), "Architecture"), *arch_);
  EXPECT_EQ(Field(Deb("fl-server"), "Version"), FL_VERSION);
  // dpkg-shlibdeps: what the programs link, as Debian's package names.
  const std::string server = Field(Deb("fl-server"), "Depends");
  for (const char* lib : {"libgrpc++", "libprotobuf", "libsqlite3", "libssl3"}) {
    EXPECT_NE(server.find(lib), std::string::npos) << lib << " in " << server;
  }
  EXPECT_EQ(server.find("libtorch"), std::string::npos) << "fl-server must not pull in LibTorch: " << server;
  const std::string client = Field(Deb("fl-client"), "Depends");
  EXPECT_NE(client.find("libtorch"), std::string::npos) << client;
  EXPECT_NE(client.find("libgrpc++"), std::string::npos) << client;
  // LibTorch's matrix products use the system BLAS: the packages that train recommend an optimised one.
  EXPECT_NE(Field(Deb("fl-client"), "Recommends").find("libopenblas0-openmp"), std::string::npos);
  EXPECT_NE(Field(Deb("fl-tools"), "Recommends").find("libopenblas0-openmp"), std::string::npos);
}

TEST_F(PackagesTest, MissingRuntimeLibrariesAndAWrongArchitectureAreRefusedByName) {
  const std::string root = CleanRoot("refusals");
  const ToolResult missing = Dpkg(root, {"-i", Deb("fl-client")});
  EXPECT_NE(missing.code, 0);
  EXPECT_NE(missing.output.find("fl-client depends on libtorch"), std::string::npos) << missing.output;
  EXPECT_NE(missing.output.find("is not installed"), std::string::npos) << missing.output;

  // The same package claiming another architecture.
  const std::string other = *arch_ == "arm64" ? "amd64" : "arm64";
  const std::string tree = dir_->File("rearch");
  ASSERT_EQ(RunTool({"dpkg-deb", "-R", Deb("fl-server"), tree}, *dir_).code, 0);
  std::string control = ReadAll(tree + "/DEBIAN/control");
  control.replace(control.find("Architecture: " + *arch_), 14 + arch_->size(), "Architecture: " + other);
  std::ofstream(tree + "/DEBIAN/control") << control;
  const std::string foreign = dir_->File("fl-server_" + other + ".deb");
  ASSERT_EQ(RunTool({"dpkg-deb", "-b", tree, foreign}, *dir_).code, 0);
  const ToolResult wrong = Dpkg(CleanRoot("foreign"), {"--force-depends", "-i", foreign});
  EXPECT_NE(wrong.code, 0);
  EXPECT_NE(wrong.output.find("package architecture (" + other + ") does not match system (" + *arch_ + ")"),
            std::string::npos)
      << wrong.output;
}

// Installed (dependencies forced: this root has no libraries, this machine's are used when its programs run), the
// packages put the programs in /usr/bin, units that start them from there, and the configuration as conffiles;
// the installed fl-server and fl-client run a round.
TEST_F(PackagesTest, InstalledIntoACleanRootTheyRunAFederation) {
  const std::string root = CleanRoot("installed");
  const ToolResult installed =
      Dpkg(root, {"--force-depends", "-i", Deb("fl-server"), Deb("fl-client"), Deb("fl-tools")});
  ASSERT_EQ(installed.code, 0) << installed.output;
  for (const char* program : {"fl-server", "fl-provision", "fl-client", "fl-experiment", "fl-report", "fl-link"}) {
    EXPECT_TRUE(fs::exists(root + "/usr/bin/" + program)) << program;
  }
  const std::string unit = ReadAll(root + "/usr/lib/systemd/system/fl-server.service");
  EXPECT_NE(unit.find("ExecStart=/usr/bin/fl-server "), std::string::npos) << unit;
  EXPECT_NE(ReadAll(root + "/usr/lib/systemd/system/fl-client@.service").find("ExecStart=/usr/bin/fl-client "),
            std::string::npos);
  EXPECT_TRUE(fs::exists(root + "/etc/fl-testbed/fl-server.conf"));
  EXPECT_TRUE(fs::exists(root + "/usr/share/fl-testbed/profiles/links/5g-sa.yaml"));
  const ToolResult conffiles =
      RunTool({"dpkg-query", "--admindir=" + root + "/var/lib/dpkg", "-W", "-f=${Conffiles}", "fl-server"}, *dir_);
  EXPECT_NE(conffiles.output.find("/etc/fl-testbed/fl-server.conf"), std::string::npos) << conffiles.output;
  EXPECT_EQ(Trimmed(RunTool({root + "/usr/bin/fl-server", "--version"}, *dir_).output),
            std::string("fl-server ") + FL_VERSION);

  const std::string port_file = dir_->File("port");
  fl::testing::Subprocess server({root + "/usr/bin/fl-server", "--listen", "127.0.0.1:0", "--port-file", port_file,
                                  "--db", dir_->File("records.db"), "--rounds", "1", "--min-fit-clients", "1",
                                  "--min-available-clients", "1", "--insecure", "--log-level", "warn"},
                                 dir_->File("server.log"));
  std::string port;
  for (int i = 0; i < 500 && port.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    port = Trimmed(ReadAll(port_file));
  }
  ASSERT_FALSE(port.empty()) << ReadAll(dir_->File("server.log"));
  fl::testing::Subprocess client(
      {root + "/usr/bin/fl-client", "--server", "127.0.0.1:" + port, "--name", "packaged", "--model",
       "synthetic:10000:10", "--insecure", "--give-up-after-s", "60", "--log-level", "warn"},
      dir_->File("client.log"));
  const auto code = server.Wait(std::chrono::seconds(120));
  ASSERT_TRUE(code.has_value()) << ReadAll(dir_->File("server.log"));
  EXPECT_EQ(*code, 0) << ReadAll(dir_->File("server.log")) << ReadAll(dir_->File("client.log"));
  EXPECT_EQ(client.Wait(std::chrono::seconds(30)).value_or(-1), 0) << ReadAll(dir_->File("client.log"));
}

}  // namespace

// The arm64 Debian package made from the cross-built tree (docs/packages.md "arm64"): `cmake --build <arm64 tree>
// --target package-deb` makes fl-client_<version>_arm64.deb whose Depends dpkg-shlibdeps computed from the arm64
// libraries in the sysroot and the dpkg database tools/arm64-sysroot.sh writes there: Debian's arm64 runtime
// packages, under the same names as on amd64. On this (amd64) machine dpkg refuses to install it, naming both
// architectures.
//
// Registered beside client_arm64_qemu_test, only when the build was configured with -DFL_ARM64_CLIENT=<the arm64
// fl-client>; a missing arm64 tree or database is a failure that says what to do, never a skip.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "fl/testing/run_tool.h"
#include "fl/testing/scratch_dir.h"

namespace fl::client {
namespace {

namespace fs = std::filesystem;
using fl::testing::RunTool;
using fl::testing::ToolResult;

std::string Trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// "libc6 (>= 2.34), libtorch1.13 (>= 1.13.1+dfsg), a | b" -> {libc6, libtorch1.13, a, b}
std::set<std::string> PackageNames(const std::string& depends) {
  std::set<std::string> names;
  std::string item;
  std::stringstream in(depends);
  while (std::getline(in, item, ',')) {
    std::stringstream alternatives(item);
    for (std::string alt; std::getline(alternatives, alt, '|');) {
      std::stringstream words(alt);
      std::string name;
      if (words >> name) names.insert(name);
    }
  }
  return names;
}

// Package name (and every name in its Provides) -> its Architecture, from a dpkg status file.
std::map<std::string, std::string> Architectures(const std::string& status) {
  std::map<std::string, std::string> out;
  std::ifstream in(status);
  std::vector<std::string> names;
  std::string arch;
  auto flush = [&] {
    for (const std::string& n : names) out.emplace(n, arch);
    names.clear();
    arch.clear();
  };
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) {
      flush();
    } else if (line.starts_with("Package: ")) {
      names.push_back(line.substr(9));
    } else if (line.starts_with("Architecture: ")) {
      arch = line.substr(14);
    } else if (line.starts_with("Provides: ")) {
      for (const std::string& n : PackageNames(line.substr(10))) names.push_back(n);
    }
  }
  flush();
  return out;
}

TEST(Arm64PackageTest, TheCrossBuiltTreeMakesAnArm64ClientPackageThatDependsOnDebiansArm64Libraries) {
  const std::string tree = FL_ARM64_BUILD_DIR;
  const std::string sysroot = FL_ARM64_SYSROOT;
  ASSERT_TRUE(fs::is_regular_file(fs::path(tree) / "CMakeCache.txt"))
      << "FL_ARM64_BUILD_DIR=" << tree
      << " is not a configured build tree: configure the cross build (docs/deploy-raspberry-pi.md \"Cross-building "
         "fl-client\") or give -DFL_ARM64_BUILD_DIR=<its directory>";
  ASSERT_TRUE(fs::is_regular_file(fs::path(sysroot) / ".dpkg/status"))
      << sysroot << "/.dpkg/status is missing: run tools/arm64-sysroot.sh (it writes the sysroot's dpkg database)";

  fl::testing::ScratchDir dir("fl_arm64_deb");
  // The documented command; incremental (the arm64 fl-client is usually built already).
  const ToolResult made =
      RunTool({FL_CMAKE_COMMAND, "--build", tree, "--target", "package-deb"}, dir, std::chrono::seconds(1700));
  ASSERT_EQ(made.code, 0) << made.output;
  const std::string deb = tree + "/packages/fl-client_" + FL_VERSION + "_arm64.deb";
  ASSERT_TRUE(fs::is_regular_file(deb)) << made.output;

  auto field = [&](const std::string& name) { return Trimmed(RunTool({"dpkg-deb", "-f", deb, name}, dir).output); };
  EXPECT_EQ(field("Package"), "fl-client");
  EXPECT_EQ(field("Architecture"), "arm64");
  const std::string depends = field("Depends");
  const std::set<std::string> names = PackageNames(depends);
  const std::map<std::string, std::string> architectures = Architectures(sysroot + "/.dpkg/status");
  // The runtime packages the Pi guide names, as on amd64 (no :arm64 qualifier, no -dev package).
  for (const char* expected : {"libtorch1.13", "libgrpc++1.51", "libprotobuf32", "libabsl20220623", "libc6",
                               "libstdc++6", "libprometheus-cpp-pull1.0", "zlib1g"}) {
    EXPECT_EQ(names.count(expected), 1u) << expected << " in " << depends;
  }
  for (const std::string& name : names) {
    EXPECT_EQ(name.find(':'), std::string::npos) << name << " in " << depends;
    EXPECT_FALSE(name.ends_with("-dev")) << name << " in " << depends;
    // Each one is an arm64 (or architecture-independent) package of the sysroot's Debian, or provided by one
    // (libspdlog1.10-fmt9 is libspdlog1.10's Provides).
    EXPECT_TRUE(architectures.count(name) == 1 &&
                (architectures.at(name) == "arm64" || architectures.at(name) == "all"))
        << name << " is no arm64 package of " << sysroot << "/.dpkg/status";
  }
  // The program inside is the arm64 one, stripped.
  const std::string unpacked = dir.File("unpacked");
  ASSERT_EQ(RunTool({"dpkg-deb", "-x", deb, unpacked}, dir).code, 0);
  const ToolResult file = RunTool({"file", unpacked + "/usr/bin/fl-client"}, dir);
  EXPECT_NE(file.output.find("ARM aarch64"), std::string::npos) << file.output;
  EXPECT_NE(file.output.find(", stripped"), std::string::npos) << file.output;

  // This machine is not arm64: dpkg refuses the package and says why, into a clean root of its own.
  const std::string host = Trimmed(RunTool({"dpkg", "--print-architecture"}, dir).output);
  ASSERT_NE(host, "arm64") << "this test expects to run on the build machine, not on an arm64 board";
  const fs::path root = dir.File("root");
  for (const char* d : {"var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers"}) {
    fs::create_directories(root / d);
  }
  std::ofstream(root / "var/lib/dpkg/status").flush();
  std::ofstream(root / "var/lib/dpkg/available").flush();
  const ToolResult install =
      RunTool({"dpkg", "--root=" + root.string(), "--force-script-chrootless", "--log=/dev/null", "-i", deb}, dir);
  EXPECT_NE(install.code, 0) << install.output;
  EXPECT_NE(install.output.find("package architecture (arm64) does not match system (" + host + ")"), std::string::npos)
      << install.output;
  EXPECT_FALSE(fs::exists(root / "usr/bin/fl-client")) << "nothing of the package may land in the root";
}

}  // namespace
}  // namespace fl::client

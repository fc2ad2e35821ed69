// A test fixture's local two-node Slurm (tools/local-slurm.sh, docs/cluster.md "A local Slurm"): started in a
// test suite's SetUpTestSuite, stopped in its TearDownTestSuite (nothing left running, namespaces removed), with
// SLURM_CONF set for this process and the commands it starts. Needs root; where it cannot start, started() says
// why (the script's own message: not root, packages missing and not installable, a daemon's log).
//
//   class MyTest : public ::testing::Test {
//    protected:
//     static void SetUpTestSuite() { cluster_ = fl::testing::LocalSlurm::Start(/*sites=*/false).release(); }
//     static void TearDownTestSuite() { delete cluster_; }
//     static fl::testing::LocalSlurm* cluster_;
//   };
//   TEST_F(MyTest, X) { ASSERT_TRUE(cluster_->started().ok()) << cluster_->started(); ... }
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "fl/core/str_cat.h"
#include "fl/sys/process.h"

namespace fl::testing {

class LocalSlurm {
 public:
  // `script`: tools/local-slurm.sh of this checkout. The cluster's directory is made under the temporary folder,
  // named after this process, so that test binaries running at once each have their own.
  static std::unique_ptr<LocalSlurm> Start(const std::string& script, bool sites = false) {
    auto c = std::unique_ptr<LocalSlurm>(new LocalSlurm);
    c->script_ = script;
    c->dir_ = (std::filesystem::temp_directory_path() / fl::StrCat("fl-local-slurm-test-", getpid())).string();
    if (geteuid() != 0) {
      c->started_ = absl::FailedPreconditionError(
          "the local Slurm needs root (slurmd runs jobs as their users; --sites makes namespaces): run as root, as "
          "CI does");
      return c;
    }
    std::vector<std::string> argv = {"bash", script, "start", "--dir", c->dir_};
    if (sites) argv.push_back("--sites");
    absl::StatusOr<std::string> out = fl::sys::RunCommand(argv);
    c->started_ = out.status();
    if (out.ok()) setenv("SLURM_CONF", c->slurm_conf().c_str(), 1);
    return c;
  }
  ~LocalSlurm() {
    if (geteuid() == 0) (void)fl::sys::RunCommand({"bash", script_, "stop", "--dir", dir_});
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  const absl::Status& started() const { return started_; }
  const std::string& dir() const { return dir_; }
  std::string slurm_conf() const { return dir_ + "/slurm.conf"; }

 private:
  LocalSlurm() = default;
  std::string script_;
  std::string dir_;
  absl::Status started_;
};

}  // namespace fl::testing

// Test support: a fresh scratch directory under googletest's TempDir, removed with its contents.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

namespace fl::testing {

class ScratchDir {
 public:
  explicit ScratchDir(const std::string& prefix = "fl_test") {
    std::string tmpl = (std::filesystem::path(::testing::TempDir()) / (prefix + "_XXXXXX")).string();
    char* made = mkdtemp(tmpl.data());
    EXPECT_NE(made, nullptr) << "mkdtemp " << tmpl;
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string File(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace fl::testing

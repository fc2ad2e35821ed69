// Test support (any module's tests): runs a binary to completion (killed if it outlives its timeout) and returns its
// exit code and what it wrote to stdout and stderr.
#pragma once

#include <chrono>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fl/testing/scratch_dir.h"
#include "fl/testing/subprocess.h"

namespace fl::testing {

struct ToolResult {
  int code = -1;  // -1: killed after the timeout
  std::string output;
};

inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline ToolResult RunTool(const std::vector<std::string>& argv, const ScratchDir& dir,
                          std::chrono::seconds timeout = std::chrono::seconds(60)) {
  static int serial = 0;
  const std::string log = dir.File("tool-" + std::to_string(serial++) + ".log");
  ToolResult result;
  {
    Subprocess process(argv, log);
    auto code = process.Wait(timeout);
    if (code.has_value()) {
      result.code = *code;
    } else {
      process.Kill(SIGKILL);  // and the destructor reaps it
    }
  }
  result.output = ReadAll(log);
  return result;
}

}  // namespace fl::testing

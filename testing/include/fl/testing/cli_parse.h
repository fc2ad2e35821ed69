// Parses a command line through a test's CLI11 app exactly as a binary's main() would (program name first), so
// that settings tests exercise the real options without starting the process.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/status/status.h"

namespace fl::testing {

// `args` are the arguments after the program name; a CLI11 parse error comes back as InvalidArgument with
// CLI11's own text.
inline absl::Status ParseCommandLine(CLI::App& app, const std::string& program, std::vector<std::string> args) {
  args.insert(args.begin(), program);
  std::vector<char*> raw;
  raw.reserve(args.size());
  for (std::string& a : args) raw.push_back(a.data());
  try {
    app.parse(static_cast<int>(raw.size()), raw.data());
  } catch (const CLI::ParseError& e) {
    return absl::InvalidArgumentError(e.what());
  }
  return absl::OkStatus();
}

}  // namespace fl::testing

// Test support: running Debian's Python (/usr/bin/python3, with python3-numpy and python3-torch from
// deploy/install-deps.sh) to write real .npy / .npz / .pt files inside a test.
//
// `python3` on PATH may be another interpreter (pyenv) without numpy or torch, so the absolute path is used.
// A missing module is a test failure naming the package and deploy/install-deps.sh, never a skip.
#pragma once

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/sys/process.h"

namespace fl::testing {

inline constexpr const char* kSystemPython = "/usr/bin/python3";

// Runs `script` (Python source) with `args` as sys.argv[1:], its stdout and stderr captured in `log_path`.
// Returns the captured output, or an error with it when the interpreter exits non-zero.
inline absl::StatusOr<std::string> RunPython(const std::string& script, const std::vector<std::string>& args,
                                             const std::string& log_path) {
  fl::sys::SpawnOptions o;
  o.argv = {kSystemPython, "-c", script};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  o.stdout_to = fl::sys::Stdio::File(log_path, /*append_to_it=*/false);
  o.stderr_to = fl::sys::Stdio::ToStdout();
  absl::StatusOr<fl::sys::Child> child = fl::sys::Child::Spawn(o);
  if (!child.ok()) return child.status();
  const fl::sys::ExitStatus status = child->Wait();
  std::ifstream in(log_path);
  std::stringstream output;
  output << in.rdbuf();
  if (!status.success()) {
    return absl::InternalError(std::string(kSystemPython) + " " + status.Describe() + ":\n" + output.str());
  }
  return output.str();
}

// Runs the Python file `path` as __main__ with `args` as sys.argv[1:]. Through runpy rather than `python3 path` so
// that the interpreter stays kSystemPython; as __main__ so that classes exported with torch.jit.script get
// loadable names (`__torch__.<module>.Net`, not a run_path's generated module name), and from a file so that
// torch.jit.script can read the classes' source.
inline absl::StatusOr<std::string> RunPythonFile(const std::string& path, const std::vector<std::string>& args,
                                                 const std::string& log_path) {
  std::vector<std::string> all = {path};
  all.insert(all.end(), args.begin(), args.end());
  return RunPython(
      "import runpy, sys; path = sys.argv[1]; sys.argv = sys.argv[1:]; "
      "runpy.run_path(path, run_name='__main__')",
      all, log_path);
}

// OK when /usr/bin/python3 can import `module` ("numpy", "torch"); otherwise an error saying how to install
// it. Use as ASSERT_TRUE(RequirePythonModule("numpy", dir).ok()) << ... or through the status message.
inline absl::Status RequirePythonModule(const std::string& module, const std::string& log_path) {
  auto result = RunPython("import " + module, {}, log_path);
  if (result.ok()) return absl::OkStatus();
  return absl::FailedPreconditionError(kSystemPython + std::string(" cannot import ") + module + ": install python3-" +
                                       module + " (run deploy/install-deps.sh, which installs it)\n" +
                                       std::string(result.status().message()));
}

}  // namespace fl::testing

// A short federation of real fl-server and fl-client processes on loopback (plaintext, --insecure; TLS has its own
// tests), run to its end: the process tests of stragglers and privacy read what it did from the records database.
// The test target defines FL_SERVER_BIN and FL_CLIENT_BIN.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "fl/core/str_cat.h"
#include "fl/testing/scratch_dir.h"
#include "fl/testing/subprocess.h"
#include "records_polling.h"

namespace fl::server::process_testing {

inline std::vector<std::string> ServerArgs(const fl::testing::ScratchDir& dir, int port,
                                           std::vector<std::string> extra) {
  std::vector<std::string> args = {FL_SERVER_BIN,
                                   "--listen",
                                   fl::StrCat("127.0.0.1:", port),
                                   "--db",
                                   dir.File("records.db"),
                                   "--evaluate-every",
                                   "0",
                                   "--heartbeat-interval-ms",
                                   "300",
                                   "--log-level",
                                   "info",
                                   "--insecure"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

inline std::vector<std::string> ClientArgs(int port, const std::string& name, const std::string& model) {
  return {FL_CLIENT_BIN,
          "--server",
          fl::StrCat("127.0.0.1:", port),
          "--name",
          name,
          "--model",
          model,
          "--give-up-after-s",
          "60",
          "--log-level",
          "warn",
          "--insecure"};
}

// Runs the server and clients (name -> synthetic model with its training time) to the end; returns the server's exit
// code, every process stopped.
inline int RunExperiment(const fl::testing::ScratchDir& dir, const std::vector<std::string>& server_extra,
                         const std::vector<std::pair<std::string, std::string>>& clients) {
  const int port = fl::testing::FreeLoopbackPort();
  const std::string log = dir.File("server.txt");
  fl::testing::Subprocess server(ServerArgs(dir, port, server_extra), log);
  std::vector<std::unique_ptr<fl::testing::Subprocess>> running;
  for (const auto& [name, model] : clients) {
    running.push_back(
        std::make_unique<fl::testing::Subprocess>(ClientArgs(port, name, model), dir.File(name + ".txt")));
  }
  auto code = server.Wait(std::chrono::seconds(90));
  EXPECT_TRUE(code.has_value()) << "fl-server did not finish; see " << ReadFile(log);
  for (auto& c : running) {
    auto client_code = c->Wait(std::chrono::seconds(30));
    EXPECT_TRUE(client_code.has_value()) << "a client did not end with the experiment";
  }
  return code.value_or(-1);
}

}  // namespace fl::server::process_testing

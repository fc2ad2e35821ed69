// fl-server: admits clients, runs rounds, aggregates updates, evaluates and records every phase.
//
// This build provides the command line and the wire schema; the round engine is not implemented yet, so
// any invocation other than --help/--version says so and exits non-zero rather than pretending to serve.
#include <iostream>

#include <CLI/CLI.hpp>

#include "fl/v1/federation.grpc.pb.h"

int main(int argc, char** argv) {
  CLI::App app{"fl-server: the federated-learning aggregator (fl.v1 control plane over gRPC)"};
  app.set_version_flag("--version", std::string("fl-server ") + FL_VERSION);
  CLI11_PARSE(app, argc, argv);
  std::cerr << "fl-server: the round engine is not built yet; this build offers --help and --version. "
            << "Service " << fl::v1::Federation::service_full_name() << " is defined in proto/fl/v1/.\n";
  return 2;
}

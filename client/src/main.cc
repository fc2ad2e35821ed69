// fl-client: trains on its local shard and reports what each phase of a round cost it.
//
// This build provides the command line and the wire schema; training and the session are not implemented
// yet, so any invocation other than --help/--version says so and exits non-zero.
#include <iostream>

#include <CLI/CLI.hpp>

#include "fl/v1/federation.grpc.pb.h"

int main(int argc, char** argv) {
  CLI::App app{"fl-client: the federated-learning edge trainer (fl.v1 control plane over gRPC)"};
  app.set_version_flag("--version", std::string("fl-client ") + FL_VERSION);
  CLI11_PARSE(app, argc, argv);
  std::cerr << "fl-client: training and the session are not built yet; this build offers --help and "
            << "--version. It will speak " << fl::v1::Federation::service_full_name() << ".\n";
  return 2;
}

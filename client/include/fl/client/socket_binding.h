// Choosing the network path of fl-client's connections: bind them to a network interface (a 5G modem, the
// WiFi, the Ethernet port of a Raspberry Pi) and/or a local source address.
//
// gRPC has no channel argument for a client's local address or device, but it calls a socket mutator
// (GRPC_ARG_SOCKET_MUTATOR) on every client socket after creating it and before connect(); ours sets
// SO_BINDTODEVICE and bind()s the source address there. Validate() checks the settings up front so that a
// typo fails at start with a clear message rather than as endless reconnects.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace grpc {
class ChannelArguments;
}

namespace fl::client {

struct SocketBinding {
  std::string interface;       // e.g. "wlan0"; "" = any (the routing table decides)
  std::string source_address;  // IPv4 or IPv6 literal, e.g. "192.168.8.23"; "" = any

  bool empty() const { return interface.empty() && source_address.empty(); }
};

// OK when the interface exists and this process may bind to it, and the address is one of this machine's;
// InvalidArgument naming the flag, the value and what to do otherwise.
absl::Status ValidateSocketBinding(const SocketBinding& binding);

// Adds the socket mutator that applies `binding` to every connection of channels made with `args`.
// Call ValidateSocketBinding first; a binding that fails later (the interface went away) fails that
// connection attempt, which gRPC retries with backoff.
void ApplySocketBinding(const SocketBinding& binding, grpc::ChannelArguments* args);

}  // namespace fl::client

#include "fl/client/socket_binding.h"

#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <optional>

#include <grpc/support/sync.h>
#include <grpcpp/support/channel_arguments.h>

#include "fl/core/str_cat.h"

// gRPC's socket mutator interface (src/core/lib/iomgr/socket_mutator.h) is not among the headers Debian's
// libgrpc-dev installs, although libgrpc exports its functions and grpcpp's ChannelArguments::SetSocketMutator
// takes one. These declarations match gRPC 1.51 (Debian 12). Only the legacy `mutate_fd` entry is used: gRPC
// calls it for client connections (and server listeners, which a client channel has none of) whether or not
// the `mutate_fd_2` entry exists in the installed version, so the layout below is safe with either.
struct grpc_socket_mutator_vtable {
  bool (*mutate_fd)(int fd, grpc_socket_mutator* mutator);
  int (*compare)(grpc_socket_mutator* a, grpc_socket_mutator* b);
  void (*destroy)(grpc_socket_mutator* mutator);
  void* mutate_fd_2;  // bool (*)(const grpc_mutate_socket_info*, grpc_socket_mutator*); unused (nullptr)
};
struct grpc_socket_mutator {
  const grpc_socket_mutator_vtable* vtable;
  gpr_refcount refcount;
};
void grpc_socket_mutator_init(grpc_socket_mutator* mutator, const grpc_socket_mutator_vtable* vtable);

namespace fl::client {
namespace {

std::optional<sockaddr_storage> ParseAddress(const std::string& text, socklen_t* len) {
  sockaddr_storage ss{};
  auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
  if (inet_pton(AF_INET, text.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    *len = sizeof(sockaddr_in);
    return ss;
  }
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (inet_pton(AF_INET6, text.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    *len = sizeof(sockaddr_in6);
    return ss;
  }
  return std::nullopt;
}

std::string InterfaceNames() {
  std::string names;
  if (struct if_nameindex* list = if_nameindex()) {
    for (struct if_nameindex* i = list; i->if_index != 0; ++i)
      names += fl::StrCat(names.empty() ? "" : ", ", i->if_name);
    if_freenameindex(list);
  }
  return names.empty() ? "none found" : names;
}

// The mutator: grpc_socket_mutator must be the first member (gRPC hands back its address).
struct BindingMutator {
  grpc_socket_mutator base;
  std::string interface;
  std::optional<sockaddr_storage> source;
  socklen_t source_len = 0;
};

BindingMutator* Self(grpc_socket_mutator* m) { return reinterpret_cast<BindingMutator*>(m); }

bool Mutate(int fd, grpc_socket_mutator* m) {
  const BindingMutator& b = *Self(m);
  if (!b.interface.empty() && setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, b.interface.c_str(),
                                         static_cast<socklen_t>(b.interface.size())) != 0) {
    return false;
  }
  if (!b.source.has_value()) return true;
  int domain = 0;
  socklen_t dlen = sizeof(domain);
  if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &dlen) != 0) return false;
  sockaddr_storage addr = *b.source;
  socklen_t len = b.source_len;
  if (domain == AF_INET6 && addr.ss_family == AF_INET) {
    // gRPC connects to IPv4 servers from a dual-stack IPv6 socket: the source must be v4-mapped (::ffff:a.b.c.d).
    const in_addr v4 = reinterpret_cast<const sockaddr_in*>(&*b.source)->sin_addr;
    sockaddr_in6 v6{};
    v6.sin6_family = AF_INET6;
    v6.sin6_addr.s6_addr[10] = 0xff;
    v6.sin6_addr.s6_addr[11] = 0xff;
    std::memcpy(&v6.sin6_addr.s6_addr[12], &v4, sizeof(v4));
    std::memset(&addr, 0, sizeof(addr));
    std::memcpy(&addr, &v6, sizeof(v6));
    len = sizeof(v6);
  } else if (domain != addr.ss_family) {
    return false;  // an IPv6 source for an IPv4-only socket: this connection cannot use it
  }
  return bind(fd, reinterpret_cast<const sockaddr*>(&addr), len) == 0;
}

int Compare(grpc_socket_mutator* a, grpc_socket_mutator* b) {
  const BindingMutator& x = *Self(a);
  const BindingMutator& y = *Self(b);
  if (int c = x.interface.compare(y.interface); c != 0) return c < 0 ? -1 : 1;
  if (x.source_len != y.source_len) return x.source_len < y.source_len ? -1 : 1;
  if (!x.source.has_value()) return 0;
  const int c = std::memcmp(&*x.source, &*y.source, x.source_len);
  return c < 0 ? -1 : (c > 0 ? 1 : 0);
}

void Destroy(grpc_socket_mutator* m) { delete Self(m); }

const grpc_socket_mutator_vtable kVtable = {Mutate, Compare, Destroy, nullptr};

}  // namespace

absl::Status ValidateSocketBinding(const SocketBinding& binding) {
  if (!binding.interface.empty()) {
    if (binding.interface.size() >= IFNAMSIZ || if_nametoindex(binding.interface.c_str()) == 0) {
      return absl::InvalidArgumentError(fl::StrCat(
          "--bind-interface=", binding.interface,
          ": no such network interface on this machine (it has: ", InterfaceNames(), "); `ip -br link` lists them"));
    }
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    const int rc = setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, binding.interface.c_str(),
                              static_cast<socklen_t>(binding.interface.size()));
    const int err = errno;
    close(fd);
    if (rc != 0) {
      return absl::InvalidArgumentError(fl::StrCat("--bind-interface=", binding.interface, ": cannot bind to it (",
                                                   std::strerror(err),
                                                   "); on Linux before 5.7 this needs CAP_NET_RAW"));
    }
  }
  if (!binding.source_address.empty()) {
    socklen_t len = 0;
    auto addr = ParseAddress(binding.source_address, &len);
    if (!addr.has_value()) {
      return absl::InvalidArgumentError(
          fl::StrCat("--source-address=", binding.source_address,
                     ": not an IPv4 or IPv6 address (give a literal such as 192.168.8.23)"));
    }
    const int fd = socket(addr->ss_family, SOCK_STREAM, 0);
    const int rc = bind(fd, reinterpret_cast<const sockaddr*>(&*addr), len);
    const int err = errno;
    close(fd);
    if (rc != 0) {
      return absl::InvalidArgumentError(
          fl::StrCat("--source-address=", binding.source_address, ": cannot bind to it (", std::strerror(err),
                     "); give one of this machine's addresses (`ip -br addr` lists them)"));
    }
  }
  return absl::OkStatus();
}

void ApplySocketBinding(const SocketBinding& binding, grpc::ChannelArguments* args) {
  if (binding.empty()) return;
  auto* m = new BindingMutator;
  m->interface = binding.interface;
  if (!binding.source_address.empty()) m->source = ParseAddress(binding.source_address, &m->source_len);
  grpc_socket_mutator_init(&m->base, &kVtable);
  args->SetSocketMutator(&m->base);  // the arguments own it from here (unref -> Destroy)
}

}  // namespace fl::client

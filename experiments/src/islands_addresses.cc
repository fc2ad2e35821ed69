#include "fl/experiment/islands_addresses.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cstring>

#include "fl/core/str_cat.h"

namespace fl::experiment {

bool IsIpv4Literal(std::string_view host) {
  in_addr a{};
  return inet_pton(AF_INET, std::string(host).c_str(), &a) == 1;
}

bool IsLoopbackHost(std::string_view host) {
  if (host == "localhost" || host.ends_with(".localhost") || host == "::1" || host == "0.0.0.0") return true;
  in_addr a{};
  if (inet_pton(AF_INET, std::string(host).c_str(), &a) != 1) return false;
  return (ntohl(a.s_addr) >> 24) == 127;
}

absl::Status CheckAdvertisableHost(std::string_view who, std::string_view host) {
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(fl::StrCat(who, " would advertise '", host, "': ", why,
                                                 "; give an IPv4 address or a host name its peers resolve"));
  };
  if (host.empty()) return bad("no address");
  if (host == "0.0.0.0" || host == "*") return bad("a wildcard names no host a peer can dial");
  if (IsIpv4Literal(host)) return absl::OkStatus();
  if (host.size() > 253) return bad("longer than a DNS name may be");
  for (char ch : host) {
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '.') {
      return bad(ch == ':' ? "a port or an IPv6 address (give the host alone, IPv4 or a name)"
                           : "a character a host name cannot have");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> FreePortOn(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) {
    return absl::InvalidArgumentError(
        fl::StrCat("cannot resolve '", host, "' to an IPv4 address; give one of this machine's addresses"));
  }
  sockaddr_in addr{};
  std::memcpy(&addr, found->ai_addr, sizeof(addr));
  freeaddrinfo(found);
  addr.sin_port = 0;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError(fl::StrCat("socket: ", std::strerror(errno)));
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    close(fd);
    return absl::InvalidArgumentError(fl::StrCat("cannot bind '", host, "' (", std::strerror(err),
                                                 "): it is not an address of this machine; give one that is "
                                                 "(ip -brief address), or 127.0.0.1 when everything runs here"));
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

absl::Status CheckPeersCanReach(const std::vector<ProcessPlacement>& placements) {
  for (const ProcessPlacement& p : placements) {
    if (!IsLoopbackHost(p.host)) continue;
    std::string elsewhere;
    for (const ProcessPlacement& q : placements) {
      if (q.node == p.node) continue;
      elsewhere += fl::StrCat(elsewhere.empty() ? "" : ", ", q.name, " on ", q.node);
    }
    if (elsewhere.empty()) continue;
    return absl::InvalidArgumentError(fl::StrCat(
        p.name, " on node ", p.node, " advertises ", p.host, ", a loopback address, but its peers run elsewhere (",
        elsewhere, ") and would dial themselves; give ", p.node,
        " an address they reach (Slurm: the node's NodeAddr in slurm.conf), or run everything on one node"));
  }
  return absl::OkStatus();
}

}  // namespace fl::experiment

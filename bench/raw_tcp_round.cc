#include "raw_tcp_round.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "fl/core/str_cat.h"

namespace fl::bench {
namespace {

absl::Status SetNonBlocking(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return absl::InternalError(fl::StrCat("fcntl: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

struct FdCloser {
  int fd = -1;
  ~FdCloser() {
    if (fd >= 0) close(fd);
  }
};

}  // namespace

absl::StatusOr<double> RawTcpRound(int k, uint64_t down_bytes, uint64_t up_bytes, RoundWork* work) {
  FdCloser listener{socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  if (listener.fd < 0) return absl::InternalError(fl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(listener.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(listener.fd, k + 16) != 0 ||
      getsockname(listener.fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return absl::InternalError(fl::StrCat("bind/listen: ", std::strerror(errno)));
  }
  // The model bytes (any content: only their movement is timed); shared read-only by all senders.
  std::vector<char> source(std::max(down_bytes, up_bytes));
  for (size_t i = 0; i < source.size(); i += 4096) source[i] = static_cast<char>(i >> 12);

  std::atomic<int> client_errors{0};
  std::vector<std::thread> clients;
  clients.reserve(static_cast<size_t>(k));
  for (int i = 0; i < k; ++i) {
    clients.emplace_back([&, i, port = addr.sin_port] {
      FdCloser fd{socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
      sockaddr_in to{};
      to.sin_family = AF_INET;
      to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      to.sin_port = port;
      if (fd.fd < 0 || connect(fd.fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0 ||
          (work != nullptr && send(fd.fd, &i, sizeof(i), MSG_NOSIGNAL) != sizeof(i))) {
        client_errors.fetch_add(1);
        return;
      }
      std::vector<char> scratch(work == nullptr ? 1 << 20 : 0);
      const std::span<uint8_t> into = work != nullptr ? work->ClientDownloadBuffer(i) : std::span<uint8_t>();
      uint64_t got = 0;
      while (got < down_bytes) {
        const ssize_t n = work != nullptr
                              ? recv(fd.fd, into.data() + got, down_bytes - got, 0)
                              : recv(fd.fd, scratch.data(), std::min<uint64_t>(scratch.size(), down_bytes - got), 0);
        if (n <= 0) {
          if (n < 0 && errno == EINTR) continue;
          client_errors.fetch_add(1);
          return;
        }
        if (work != nullptr) work->ClientReceived(i, into.subspan(got, static_cast<size_t>(n)));
        got += static_cast<uint64_t>(n);
      }
      const char* upload = source.data();
      if (work != nullptr) {
        auto made = work->ClientUpload(i);
        if (!made.ok() || made->size() != up_bytes) {
          std::cerr << "e2e_round: round work, client " << i << ": "
                    << (made.ok() ? "upload of another size" : std::string(made.status().message())) << "\n";
          client_errors.fetch_add(1);
          return;
        }
        upload = reinterpret_cast<const char*>(made->data());
      }
      uint64_t sent = 0;
      while (sent < up_bytes) {
        const ssize_t n = send(fd.fd, upload + sent, up_bytes - sent, MSG_NOSIGNAL);
        if (n <= 0) {
          if (n < 0 && errno == EINTR) continue;
          client_errors.fetch_add(1);
          return;
        }
        sent += static_cast<uint64_t>(n);
      }
      // Wait for the server to close: the upload is delivered.
      char byte;
      while (recv(fd.fd, &byte, 1, 0) > 0) {
      }
    });
  }
  struct Conn {
    int fd = -1;
    uint64_t sent = 0;
    uint64_t received = 0;
    int client = 0;  // which client thread (with `work`: it says so first, before the clock)
  };
  std::vector<Conn> conns;
  absl::Status status = absl::OkStatus();
  double seconds = 0;
  {
    for (int i = 0; i < k && status.ok(); ++i) {
      pollfd p{listener.fd, POLLIN, 0};
      if (poll(&p, 1, 30000) != 1) {
        status = absl::DeadlineExceededError("raw TCP: clients did not connect");
        break;
      }
      const int fd = accept4(listener.fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        status = absl::InternalError(fl::StrCat("accept: ", std::strerror(errno)));
        break;
      }
      int client = 0;
      if (work != nullptr &&
          (recv(fd, &client, sizeof(client), MSG_WAITALL) != sizeof(client) || client < 0 || client >= k)) {
        status = absl::InternalError("raw TCP: a client did not say which one it is");
      }
      conns.push_back({fd, 0, 0, client});
      if (absl::Status s = SetNonBlocking(fd); !s.ok()) status = s;
    }
    std::vector<char> scratch(4 << 20);
    std::vector<std::span<uint8_t>> uploads;  // with `work`: where each connection's upload goes
    for (const Conn& c : conns)
      uploads.push_back(work != nullptr ? work->ServerUploadBuffer(c.client) : std::span<uint8_t>());
    const auto start = std::chrono::steady_clock::now();
    size_t done = 0;
    std::vector<pollfd> fds(conns.size());
    while (status.ok() && done < conns.size()) {
      for (size_t i = 0; i < conns.size(); ++i) {
        const Conn& c = conns[i];
        fds[i].fd = c.received == up_bytes ? -1 : c.fd;
        fds[i].events = c.sent < down_bytes ? POLLOUT : POLLIN;
        fds[i].revents = 0;
      }
      const int ready = poll(fds.data(), fds.size(), 30000);
      if (ready == 0) status = absl::DeadlineExceededError("raw TCP: no progress for 30 s");
      if (ready < 0 && errno != EINTR) status = absl::InternalError(fl::StrCat("poll: ", std::strerror(errno)));
      for (size_t i = 0; status.ok() && ready > 0 && i < conns.size(); ++i) {
        Conn& c = conns[i];
        if (fds[i].revents == 0) continue;
        if (c.sent < down_bytes) {
          const char* download =
              work != nullptr ? reinterpret_cast<const char*>(work->ServerDownload().data()) : source.data();
          const ssize_t n = send(c.fd, download + c.sent, down_bytes - c.sent, MSG_NOSIGNAL);
          if (n > 0) c.sent += static_cast<uint64_t>(n);
          if (n < 0 && errno != EAGAIN && errno != EINTR) {
            status = absl::InternalError(fl::StrCat("send: ", std::strerror(errno)));
          }
        } else {
          const ssize_t n = work != nullptr ? recv(c.fd, uploads[i].data() + c.received, up_bytes - c.received, 0)
                                            : recv(c.fd, scratch.data(),
                                                   std::min<uint64_t>(scratch.size(), up_bytes - c.received), 0);
          if (n > 0) {
            if (work != nullptr) work->ServerReceived(c.client, uploads[i].subspan(c.received, static_cast<size_t>(n)));
            c.received += static_cast<uint64_t>(n);
            if (c.received == up_bytes) {
              ++done;
              if (work != nullptr) {
                if (absl::Status s = work->ServerUploadDone(c.client); !s.ok()) status = s;
              }
            }
          } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
            status = absl::InternalError("raw TCP: a client closed early");
          }
        }
      }
    }
    if (work != nullptr && status.ok()) status = work->ServerFinish();
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  for (Conn& c : conns) close(c.fd);  // unblocks the clients' final recv
  if (!status.ok()) {
    // Unblock clients still connecting or in recv: closing the listener fails pending connects.
    close(listener.fd);
    listener.fd = -1;
  }
  for (auto& t : clients) t.join();
  if (!status.ok()) return status;
  if (client_errors.load() != 0)
    return absl::InternalError(fl::StrCat("raw TCP: ", client_errors.load(), " client errors"));
  return seconds;
}

}  // namespace fl::bench

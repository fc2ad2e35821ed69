#include "fl/emulation/shaping_relay.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <list>
#include <vector>

#include <spdlog/spdlog.h>

#include "absl/status/status.h"
#include "fl/core/clock.h"
#include "fl/core/str_cat.h"
#include "fl/emulation/shaper.h"

namespace fl::emulation {
namespace {

constexpr size_t kChunkBytes = 256 * 1024;
constexpr uint64_t kUnlimitedBufferBytes = 64ull << 20;

// A FIFO of bytes in fixed-size chunks: reads append to the tail chunk, writes gather from the head.
class ByteQueue {
 public:
  // Free space at the tail (allocates a chunk when the tail is full).
  std::pair<char*, size_t> WriteSpace() {
    if (chunks_.empty() || chunks_.back().end == kChunkBytes) {
      Chunk c;
      if (!spare_.empty()) {
        c.data = std::move(spare_.back());
        spare_.pop_back();
      } else {
        c.data = std::make_unique<char[]>(kChunkBytes);
      }
      chunks_.push_back(std::move(c));
    }
    Chunk& tail = chunks_.back();
    return {tail.data.get() + tail.end, kChunkBytes - tail.end};
  }
  void Commit(size_t n) { chunks_.back().end += n; }
  // Gathers up to `limit` bytes from the head into `iov`.
  int Gather(iovec* iov, int max_iov, uint64_t limit) const {
    int n = 0;
    for (const Chunk& c : chunks_) {
      if (n == max_iov || limit == 0) break;
      const size_t len = std::min<uint64_t>(c.end - c.begin, limit);
      if (len == 0) break;
      iov[n].iov_base = c.data.get() + c.begin;
      iov[n].iov_len = len;
      limit -= len;
      ++n;
    }
    return n;
  }
  void Consume(size_t n) {
    while (n > 0) {
      Chunk& head = chunks_.front();
      const size_t take = std::min(n, head.end - head.begin);
      head.begin += take;
      n -= take;
      if (head.begin == head.end && (head.end == kChunkBytes || chunks_.size() > 1)) {
        if (spare_.size() < 2) spare_.push_back(std::move(head.data));
        chunks_.pop_front();
      } else if (head.begin == head.end) {
        head.begin = head.end = 0;  // the only chunk, drained: reuse it from the start
      }
    }
  }

 private:
  struct Chunk {
    std::unique_ptr<char[]> data;
    size_t begin = 0;
    size_t end = 0;
  };
  std::deque<Chunk> chunks_;
  std::vector<std::unique_ptr<char[]>> spare_;
};

struct Conn;

struct Endpoint {
  Conn* conn = nullptr;
  int fd = -1;
  bool readable = false;
  bool writable = false;
};

struct Pipe {
  Pipe(const LinkDirection& config, uint64_t buffer_bytes, uint64_t seed, int64_t start_ns)
      : shaper(config, seed, start_ns),
        queue_limit(config.EffectiveQueueLimit()),
        buffer_limit(buffer_bytes > 0 ? buffer_bytes : DefaultBufferLimit(config)) {}
  DirectionShaper shaper;
  ByteQueue buffer;
  uint64_t queue_limit;   // bytes waiting for the bottleneck
  uint64_t buffer_limit;  // all bytes held (queue + delay line + waiting for the receiver)
  uint64_t written = 0;
  bool src_eof = false;
  bool dst_shut = false;
  bool Done() const { return src_eof && dst_shut; }
};

struct Conn {
  uint64_t id = 0;
  Endpoint client;
  Endpoint target;
  bool connected = false;
  bool dead = false;
  int64_t retry_at_ns = 0;     // target refused: connect again at this time (target.fd is -1 until then)
  int64_t give_up_at_ns = 0;   // ... until this time (RelayOptions::connect_retry_ms after the accept)
  std::unique_ptr<Pipe> up;    // client -> target
  std::unique_ptr<Pipe> down;  // target -> client
  ~Conn() {
    if (client.fd >= 0) close(client.fd);
    if (target.fd >= 0) close(target.fd);
  }
};

std::string ErrnoText(int err) { return std::strerror(err); }

constexpr int64_t kConnectRetryNs = 100'000'000;  // between connect attempts to a refusing target

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace

uint64_t DefaultBufferLimit(const LinkDirection& d) {
  const double rate = d.NominalRateBps();
  if (rate <= 0) return kUnlimitedBufferBytes;
  const double in_flight = rate / 8.0 * (d.delay_ms + d.jitter_ms) / 1000.0;
  return d.EffectiveQueueLimit() + static_cast<uint64_t>(2 * in_flight) + (256u << 10);
}

absl::StatusOr<SocketAddress> ResolveAddress(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos || colon + 1 == host_port.size()) {
    return absl::InvalidArgumentError(
        StrCat("address '", host_port, "' has no port; expected host:port, e.g. 127.0.0.1:50051 or [::1]:50051"));
  }
  std::string host = host_port.substr(0, colon);
  const std::string port = host_port.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty()) host = "0.0.0.0";
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* result = nullptr;
  const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &result);
  if (rc != 0 || result == nullptr) {
    return absl::InvalidArgumentError(
        StrCat("cannot resolve address '", host_port, "': ", gai_strerror(rc), "; expected host:port"));
  }
  SocketAddress a;
  a.family = result->ai_family;
  a.length = result->ai_addrlen;
  std::memcpy(&a.storage, result->ai_addr, result->ai_addrlen);
  freeaddrinfo(result);
  return a;
}

class ShapingRelay::Loop {
 public:
  Loop(const RelayOptions& options, int listen_fd, int wake_fd, const std::atomic<bool>* stopping, SocketAddress target)
      : options_(options), listen_fd_(listen_fd), wake_fd_(wake_fd), stopping_(stopping), target_(target) {}
  ~Loop() {
    conns_.clear();
    if (epoll_fd_ >= 0) close(epoll_fd_);
  }

  absl::Status Init() {
    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    if (epoll_fd_ < 0) return absl::InternalError(StrCat("epoll_create1: ", ErrnoText(errno)));
    for (auto [fd, tag] : {std::pair{listen_fd_, &listen_tag_}, std::pair{wake_fd_, &wake_tag_}}) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.ptr = tag;
      if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
        return absl::InternalError(StrCat("epoll_ctl: ", ErrnoText(errno)));
      }
    }
    return absl::OkStatus();
  }

  void Run() {
    epoll_event events[64];
    while (!stopping_->load(std::memory_order_acquire)) {
      int64_t next = DirectionShaper::kNever;
      for (const auto& c : conns_) {
        if (!c->connected) {
          if (c->target.fd < 0) next = std::min(next, c->retry_at_ns);
          continue;
        }
        next = std::min({next, c->up->shaper.NextEventNs(), c->down->shaper.NextEventNs()});
      }
      timespec ts{};
      timespec* timeout = nullptr;
      if (pending_) {
        next = 0;  // a pipe has more to read now
        pending_ = false;
      }
      if (next != DirectionShaper::kNever) {
        const int64_t wait = std::max<int64_t>(0, next - NowNs());
        ts.tv_sec = wait / 1'000'000'000;
        ts.tv_nsec = wait % 1'000'000'000;
        timeout = &ts;
      }
      const int n = epoll_pwait2(epoll_fd_, events, 64, timeout, nullptr);
      if (n < 0 && errno != EINTR) {
        spdlog::error("{}: epoll_pwait2 failed: {}", options_.name, ErrnoText(errno));
        break;
      }
      for (int i = 0; i < n; ++i) {
        void* tag = events[i].data.ptr;
        if (tag == &listen_tag_) {
          Accept();
        } else if (tag == &wake_tag_) {
          uint64_t v = 0;
          (void)!read(wake_fd_, &v, sizeof(v));
        } else {
          auto* e = static_cast<Endpoint*>(tag);
          const uint32_t f = events[i].events;
          if (f & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) e->readable = true;
          if (f & (EPOLLOUT | EPOLLHUP | EPOLLERR)) e->writable = true;
        }
      }
      const int64_t now = NowNs();
      for (auto it = conns_.begin(); it != conns_.end();) {
        Conn& c = **it;
        Pump(c, now);
        if (c.dead) {
          it = conns_.erase(it);
          active_.fetch_sub(1, std::memory_order_relaxed);
        } else {
          ++it;
        }
      }
    }
    active_.store(0);
    conns_.clear();
  }

  RelayStats Stats() const {
    RelayStats s;
    s.uplink_bytes = up_bytes_.load(std::memory_order_relaxed);
    s.downlink_bytes = down_bytes_.load(std::memory_order_relaxed);
    s.connections_accepted = accepted_.load(std::memory_order_relaxed);
    s.connections_active = active_.load(std::memory_order_relaxed);
    s.connect_failures = connect_failures_.load(std::memory_order_relaxed);
    return s;
  }

 private:
  void Accept() {
    for (;;) {
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          spdlog::warn("{}: accept failed: {}", options_.name, ErrnoText(errno));
        }
        return;
      }
      accepted_.fetch_add(1, std::memory_order_relaxed);
      auto c = std::make_unique<Conn>();
      c->id = next_id_++;
      c->client.conn = c.get();
      c->client.fd = fd;
      c->target.conn = c.get();
      SetNoDelay(fd);
      const int64_t now = NowNs();
      c->give_up_at_ns = now + options_.connect_retry_ms * 1'000'000;
      if (!StartConnect(*c, now)) continue;  // closes the client's connection: it sees the refusal as an EOF
      Watch(c->client);
      active_.fetch_add(1, std::memory_order_relaxed);
      conns_.push_back(std::move(c));
    }
  }

  void Watch(Endpoint& e) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    ev.data.ptr = &e;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, e.fd, &ev);
  }

  // Starts a non-blocking connect to the target. The pipes are made when it completes (Pump), which is when
  // the link's streams start; the first EPOLLOUT on the target reports that. A refusal within the retry
  // budget schedules another attempt (ConnectFailed); false = give up.
  bool StartConnect(Conn& c, int64_t now) {
    c.target.fd = socket(target_.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c.target.fd < 0) {
      spdlog::warn("{}: socket failed: {}", options_.name, ErrnoText(errno));
      connect_failures_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    c.target.readable = c.target.writable = false;
    SetNoDelay(c.target.fd);
    const int rc = connect(c.target.fd, reinterpret_cast<const sockaddr*>(&target_.storage), target_.length);
    if (rc != 0 && errno != EINPROGRESS) return ConnectFailed(c, errno, now);
    Watch(c.target);
    return true;
  }

  // The target refused (or is unreachable). Within RelayOptions::connect_retry_ms of the accept the relay
  // tries again every 100 ms, holding the client's connection open, as a link in front of a host that is
  // still starting would look to a client that retries (ZeroMQ, gRPC): a slow connection, not an
  // established one that drops. False = give up (the caller closes the client's connection).
  bool ConnectFailed(Conn& c, int err, int64_t now) {
    close(c.target.fd);  // also leaves the epoll set
    c.target.fd = -1;
    if (now + kConnectRetryNs <= c.give_up_at_ns) {
      c.retry_at_ns = now + kConnectRetryNs;
      return true;
    }
    spdlog::warn("{}: cannot connect to {}: {}", options_.name, options_.target_addr, ErrnoText(err));
    connect_failures_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }

  void Pump(Conn& c, int64_t now) {
    if (!c.connected) {
      if (c.target.fd < 0) {  // waiting to retry a refused connect
        if (now >= c.retry_at_ns && !StartConnect(c, now)) c.dead = true;
        return;
      }
      if (!c.target.writable) return;
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(c.target.fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        if (!ConnectFailed(c, err, now)) c.dead = true;
        return;
      }
      c.connected = true;
      // The client's and the target's streams start now (trace time zero).
      const uint64_t seed = options_.seed * 0x9E3779B97F4A7C15ull + c.id * 2;
      c.up = std::make_unique<Pipe>(options_.uplink, options_.uplink_buffer_bytes, seed, now);
      c.down = std::make_unique<Pipe>(options_.downlink, options_.downlink_buffer_bytes, seed + 1, now);
    }
    if (!PumpPipe(*c.up, c.client, c.target, now, up_bytes_) ||
        !PumpPipe(*c.down, c.target, c.client, now, down_bytes_)) {
      c.dead = true;
      return;
    }
    if (c.up->Done() && c.down->Done()) c.dead = true;
  }

  static uint64_t Room(const Pipe& p) {
    const uint64_t queued = p.shaper.queued();
    const uint64_t buffered = p.shaper.enqueued() - p.written;
    return std::min(p.queue_limit > queued ? p.queue_limit - queued : 0,
                    p.buffer_limit > buffered ? p.buffer_limit - buffered : 0);
  }

  // Moves bytes src -> shaper -> dst as far as sockets and the link allow. False on a socket error.
  // Reading stops when the relay's buffer is full although the source is still readable; no new edge
  // will come from the source then (its sender is blocked on our full receive window), so whenever
  // writing frees room the pipe reads again, here or, after a bounded number of rounds, on the next
  // loop iteration (pending_).
  bool PumpPipe(Pipe& p, Endpoint& src, Endpoint& dst, int64_t now, std::atomic<uint64_t>& counter) {
    for (int round = 0;; ++round) {
      const uint64_t written_before = p.written;
      if (!PumpPipeOnce(p, src, dst, now, counter)) return false;
      const bool can_read = src.readable && !p.src_eof && Room(p) > 0;
      if (!can_read || p.written == written_before) return true;
      if (round == 8) {
        pending_ = true;
        return true;
      }
    }
  }

  static bool PumpPipeOnce(Pipe& p, Endpoint& src, Endpoint& dst, int64_t now, std::atomic<uint64_t>& counter) {
    while (src.readable && !p.src_eof) {
      const uint64_t room = Room(p);
      if (room == 0) break;
      auto [ptr, space] = p.buffer.WriteSpace();
      const size_t want = static_cast<size_t>(std::min<uint64_t>(space, room));
      const ssize_t r = read(src.fd, ptr, want);
      if (r > 0) {
        p.buffer.Commit(static_cast<size_t>(r));
        p.shaper.Enqueue(now, static_cast<uint64_t>(r));
      } else if (r == 0) {
        p.src_eof = true;
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        src.readable = false;
      } else if (errno != EINTR) {
        return false;
      }
    }
    p.shaper.Advance(now);
    while (dst.writable && p.written < p.shaper.released()) {
      iovec iov[16];
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<size_t>(p.buffer.Gather(iov, 16, p.shaper.released() - p.written));
      const ssize_t w = sendmsg(dst.fd, &msg, MSG_NOSIGNAL);
      if (w > 0) {
        p.buffer.Consume(static_cast<size_t>(w));
        p.written += static_cast<uint64_t>(w);
        counter.fetch_add(static_cast<uint64_t>(w), std::memory_order_relaxed);
      } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        dst.writable = false;
      } else if (w < 0 && errno == EINTR) {
        continue;
      } else {
        return false;
      }
    }
    if (p.src_eof && !p.dst_shut && p.written == p.shaper.enqueued()) {
      // Everything the sender sent has crossed the link: pass its end of stream on.
      shutdown(dst.fd, SHUT_WR);
      p.dst_shut = true;
    }
    return true;
  }

  const RelayOptions& options_;
  int listen_fd_;
  int wake_fd_;
  const std::atomic<bool>* stopping_;
  SocketAddress target_;
  int epoll_fd_ = -1;
  char listen_tag_ = 0;
  char wake_tag_ = 0;
  uint64_t next_id_ = 0;
  bool pending_ = false;
  std::list<std::unique_ptr<Conn>> conns_;
  std::atomic<uint64_t> up_bytes_{0};
  std::atomic<uint64_t> down_bytes_{0};
  std::atomic<uint64_t> accepted_{0};
  std::atomic<uint64_t> active_{0};
  std::atomic<uint64_t> connect_failures_{0};
};

absl::StatusOr<std::unique_ptr<ShapingRelay>> ShapingRelay::Start(RelayOptions options) {
  if (options.target_addr.empty()) {
    return absl::InvalidArgumentError("relay: target_addr is empty; give the server's host:port");
  }
  auto target = ResolveAddress(options.target_addr);
  if (!target.ok()) return target.status();
  auto listen = ResolveAddress(options.listen_addr);
  if (!listen.ok()) return listen.status();

  std::unique_ptr<ShapingRelay> relay(new ShapingRelay());
  relay->options_ = std::move(options);
  const RelayOptions& o = relay->options_;
  relay->listen_fd_ = socket(listen->family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (relay->listen_fd_ < 0) return absl::InternalError(StrCat("relay: socket: ", ErrnoText(errno)));
  int one = 1;
  setsockopt(relay->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(relay->listen_fd_, reinterpret_cast<const sockaddr*>(&listen->storage), listen->length) != 0) {
    return absl::UnavailableError(StrCat("relay: cannot listen on ", o.listen_addr, ": ", ErrnoText(errno),
                                         " (pick another port, or port 0 for any free one)"));
  }
  if (::listen(relay->listen_fd_, 128) != 0) {
    return absl::InternalError(StrCat("relay: listen: ", ErrnoText(errno)));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(relay->listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  relay->port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                   : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  relay->listen_host_ = o.listen_addr.substr(0, o.listen_addr.rfind(':'));
  relay->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (relay->wake_fd_ < 0) return absl::InternalError(StrCat("relay: eventfd: ", ErrnoText(errno)));
  relay->loop_ =
      std::make_unique<Loop>(relay->options_, relay->listen_fd_, relay->wake_fd_, &relay->stopping_, *target);
  if (auto s = relay->loop_->Init(); !s.ok()) return s;
  ShapingRelay* raw = relay.get();
  relay->thread_ = std::thread([raw] { raw->loop_->Run(); });
  spdlog::debug("{}: listening on {} -> {} (uplink {}, downlink {})", o.name, relay->address(), o.target_addr,
                FormatRate(o.uplink.NominalRateBps()), FormatRate(o.downlink.NominalRateBps()));
  return relay;
}

ShapingRelay::~ShapingRelay() {
  Stop();
  if (listen_fd_ >= 0) close(listen_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

void ShapingRelay::Stop() {
  if (stopped_) return;
  stopped_ = true;
  stopping_.store(true, std::memory_order_release);
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }
  if (thread_.joinable()) thread_.join();
  // Closing the listener resets connections still waiting in its backlog, so no client waits forever.
  if (listen_fd_ >= 0) {
    close(listen_fd_);
    listen_fd_ = -1;
  }
}

std::string ShapingRelay::address() const {
  std::string host = listen_host_.empty() ? std::string("0.0.0.0") : listen_host_;
  return StrCat(host, ":", port_);
}

RelayStats ShapingRelay::stats() const { return loop_ ? loop_->Stats() : RelayStats{}; }

}  // namespace fl::emulation
